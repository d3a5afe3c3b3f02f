"""Tables and targets (reported, never asserted) of ``bench=peer_trl``, built from summarised sides."""

from __future__ import annotations

from typing import Any

__all__ = [
    "PHASES",
    "SPEEDUP_VS_TRL_TARGET",
    "BF16_SPEEDUP_TARGET",
    "TRAIN_PEAK_TARGET",
    "DATA_PLANE_OVERHEAD_TARGET",
    "peak_key",
    "peer_table",
    "target_checks",
    "format_peer_table",
    "print_peer_report",
]

#: The phases of a step, as both sides time them.
PHASES: tuple[str, ...] = ("generation", "logprobs", "train")
#: nemo_dp samples/s relative to TRL's, in each compared precision.
SPEEDUP_VS_TRL_TARGET = 1.6
#: nemo_dp ``bf16-mixed`` samples/s relative to its own ``32-true`` (hosts with AMX-BF16).
BF16_SPEEDUP_TARGET = 3.0
#: nemo_dp's ``32-true`` train phase GFLOP/s relative to the host's float32 matmul peak.
TRAIN_PEAK_TARGET = 0.70
#: Data-plane step time relative to the legacy trainer's.
DATA_PLANE_OVERHEAD_TARGET = 1.03


def peak_key(precision: str) -> str:
    """The ``host.matmul_gflops`` entry a precision's compute runs at (on the core budget)."""
    return "float32_budget" if precision == "32-true" else "bfloat16_budget"


def _by(sides: dict[str, dict[str, Any]], side: str, precision: str) -> dict[str, Any] | None:
    return sides.get(f"{side}|{precision}")


def peer_table(sides: dict[str, dict[str, Any]], peaks: dict[str, float]) -> list[dict[str, Any]]:
    """One row per (precision, side): time, throughput, ratio against TRL, phase rates.

    Args:
        sides: ``"<side>|<precision>"`` -> a summary (``summarize_side`` output plus ``side``
            and ``precision``).
        peaks: ``host.matmul_gflops``.

    Returns:
        Rows with ``precision``, ``side``, ``step_s``, ``samples_per_s``, ``vs_trl`` (samples/s
        ratio, None without a TRL row of that precision), and per phase ``<phase>_s``,
        ``<phase>_gflops`` and ``<phase>_of_peak`` (fraction of the precision's peak), plus
        ``other_s``, ``rewards`` and ``logprob_forwards``.
    """
    rows = []
    for key, s in sides.items():
        precision = s["precision"]
        trl = _by(sides, "trl", precision)
        peak = peaks.get(peak_key(precision))
        row: dict[str, Any] = {
            "precision": precision,
            "side": s["side"],
            "step_s": s["step_s"],
            "samples_per_s": s["samples_per_s"],
            "vs_trl": s["samples_per_s"] / trl["samples_per_s"] if trl is not None else None,
            "other_s": s["other_s"],
            "logprob_forwards": s["logprob_forwards"],
            "mean_response_length": s["mean_response_length"],
            "rewards": list(s["rewards"]),
        }
        for phase in PHASES:
            rate = s.get(f"{phase}_gflops")
            row[f"{phase}_s"] = s[f"{phase}_s"]
            row[f"{phase}_gflops"] = rate
            row[f"{phase}_of_peak"] = rate / peak if rate is not None and peak else None
        rows.append(row)
    return rows


def _check(target: str, value: float | None, threshold: float, op: str, note: str = "") -> dict[str, Any]:
    met = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
    return {"target": target, "value": value, "op": op, "threshold": threshold, "met": met, "note": note}


def target_checks(sides: dict[str, dict[str, Any]], host: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's four performance targets against what this run measured.

    Returns ``{"target", "value", "op", "threshold", "met", "note"}`` per target; one whose
    inputs were not measured in this run has ``met: None``.

    Args:
        sides: As for :func:`peer_table`.
        host: ``{"cpu": {"flags": ...}, "matmul_gflops": ...}``.
    """
    out = []
    for precision in ("32-true", "bf16-mixed"):
        nemo, trl = _by(sides, "nemo_dp", precision), _by(sides, "trl", precision)
        value = nemo["samples_per_s"] / trl["samples_per_s"] if nemo and trl else None
        out.append(_check(f"nemo_dp / TRL samples per s, {precision}", value, SPEEDUP_VS_TRL_TARGET, ">="))
    fp32, bf16 = _by(sides, "nemo_dp", "32-true"), _by(sides, "nemo_dp", "bf16-mixed")
    amx = bool(host.get("cpu", {}).get("flags", {}).get("amx_bf16"))
    out.append(
        _check(
            "nemo_dp bf16-mixed / 32-true samples per s",
            bf16["samples_per_s"] / fp32["samples_per_s"] if fp32 and bf16 else None,
            BF16_SPEEDUP_TARGET,
            ">=",
            "host has amx_bf16" if amx else "host lacks amx_bf16: the target applies to AMX hosts only",
        )
    )
    peak = host.get("matmul_gflops", {}).get("float32_budget")
    rate = fp32.get("train_gflops") if fp32 else None
    out.append(
        _check("nemo_dp 32-true train phase / host float32 matmul peak",
               rate / peak if rate is not None and peak else None, TRAIN_PEAK_TARGET, ">=")
    )
    for key, s in sides.items():
        if not s["side"].startswith("nemo_dp["):
            continue
        legacy = _by(sides, "nemo_dp", s["precision"])
        out.append(
            _check(
                f"{s['side']} / legacy step time, {s['precision']}",
                s["step_s"] / legacy["step_s"] if legacy else None,
                DATA_PLANE_OVERHEAD_TARGET,
                "<=",
            )
        )
    return out


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_peer_table(rows: list[dict[str, Any]]) -> str:
    """The table as aligned text: one line per (precision, side)."""
    head = ["precision", "side", "step s", "samples/s", "x TRL"]
    for phase in PHASES:
        head.append(f"{phase} s (GFLOP/s, % peak)")
    head += ["other s", "lp fwd", "resp len", "reward per step"]
    lines = [head]
    for r in rows:
        line = [r["precision"], r["side"], _f(r["step_s"], ".2f"), _f(r["samples_per_s"], ".2f"), _f(r["vs_trl"], ".2f")]
        for phase in PHASES:
            pct = r[f"{phase}_of_peak"]
            line.append(f"{_f(r[f'{phase}_s'], '.2f')} ({_f(r[f'{phase}_gflops'], '.1f')}, "
                        f"{_f(None if pct is None else 100 * pct, '.0f')}%)")
        line += [_f(r["other_s"], ".2f"), str(r["logprob_forwards"]), _f(r["mean_response_length"], ".1f"),
                 " ".join(f"{x:.2f}" for x in r["rewards"])]
        lines.append(line)
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def print_peer_report(report: dict[str, Any]) -> None:
    """Print the host, the table and the targets of a ``peer_trl`` report."""
    host = report["host"]
    flags = " ".join(f"{f}={'yes' if on else 'no'}" for f, on in host["cpu"]["flags"].items())
    peaks = host["matmul_gflops"]
    print(f"\n== peer_trl: {report['model_dir']} ({report['samples_per_step']} samples per step, "
          f"mean prompt {report['mean_prompt_len']:.1f} tokens)")
    print(f"host: {host['cpu']['model']}, {host['cpu']['logical_cpus']} logical CPUs; {flags}")
    print("load average (1, 5, 15 min): start " + ", ".join(f"{x:.2f}" for x in host["load_average_start"])
          + "; end " + ", ".join(f"{x:.2f}" for x in host["load_average_end"]))
    print("matmul peak GFLOP/s " + ", ".join(f"{k} {v:.1f}" for k, v in peaks.items()))
    print(format_peer_table(report["table"]))
    print("targets:")
    for t in report["targets"]:
        verdict = {True: "MET", False: "MISSED", None: "not measured"}[t["met"]]
        note = f" ({t['note']})" if t["note"] else ""
        print(f"  {t['target']}: {_f(t['value'], '.2f')} {t['op']} {t['threshold']}: {verdict}{note}")
