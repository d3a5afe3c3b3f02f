"""Tables, ratios, targets (reported, never asserted) and JSON reports of the benchmarks."""

from __future__ import annotations

import math
import operator
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nemo_dp.bench.common import LOCAL, MB, MEMCPY, TQ_ADAPTER, TQ_RAW, Payload

__all__ = [
    "rl_comparisons",
    "print_rl_comparisons",
    "sft_table",
    "print_sft_table",
    "LOCAL_TPUT_TARGET",
    "TQ_OVERHEAD_TARGET",
    "TQ_JAGGED_TARGET",
    "Row",
    "summarize",
    "add_ratios",
    "evaluate_targets",
    "fmt",
    "format_table",
]

#: Local adapter throughput relative to one memory copy, at dense 64 MiB.
LOCAL_TPUT_TARGET = 0.7
#: TransferQueue adapter time relative to the raw library, at dense 64 MiB.
TQ_OVERHEAD_TARGET = 1.10
#: TransferQueue adapter time relative to the raw library's jagged wire, at jagged 64 MiB (3x faster).
TQ_JAGGED_TARGET = 1 / 3


@dataclass
class Row:
    """Summary of one (payload, size, backend, op)."""

    payload: str
    size_mib: float
    nbytes: int
    rows: int
    backend: str
    op: str
    reps: int
    min_ms: float
    median_ms: float
    mb_per_s: float
    tput_vs_memcpy: float | None = None
    time_vs_tq_raw: float | None = None
    tput_vs_memcpy_min: float | None = None
    time_vs_tq_raw_min: float | None = None
    times_ms: list[float] = field(default_factory=list)


def summarize(payload: Payload, backend: str, times: dict[str, list[float]]) -> list[Row]:
    """One :class:`Row` per op of a backend's timings on ``payload``."""
    base = dict(payload=payload.kind, size_mib=payload.size_mib, nbytes=payload.nbytes, rows=payload.rows)
    rows = []
    for op, samples in times.items():
        median = statistics.median(samples)
        mb_per_s = payload.nbytes / MB / (median / 1000.0) if median > 0 else math.inf
        stats = dict(op=op, reps=len(samples), min_ms=min(samples), median_ms=median, mb_per_s=mb_per_s)
        rows.append(Row(**base, backend=backend, **stats, times_ms=list(samples)))
    return rows


def add_ratios(rows: list[Row]) -> None:
    """``tput_vs_memcpy`` = memcpy median / op median; ``time_vs_tq_raw`` = op / raw TQ op; the ``*_min`` twins
    use the minima (the better estimate when other processes share the cores)."""
    by_key = {(r.payload, r.size_mib, r.backend, r.op): r for r in rows}
    for r in rows:
        copy = by_key.get((r.payload, r.size_mib, MEMCPY, "copy"))
        if copy is not None and r.median_ms > 0 and r.min_ms > 0:
            r.tput_vs_memcpy = copy.median_ms / r.median_ms
            r.tput_vs_memcpy_min = copy.min_ms / r.min_ms
        raw = by_key.get((r.payload, r.size_mib, TQ_RAW, r.op))
        if raw is not None and raw.median_ms > 0 and raw.min_ms > 0:
            r.time_vs_tq_raw = r.median_ms / raw.median_ms
            r.time_vs_tq_raw_min = r.min_ms / raw.min_ms


def _target(text: str, threshold: float, row: Row | None, ratio: str, met: Callable[[Any, Any], Any]) -> dict[str, Any]:
    """One target's entry: ``row``'s ``ratio`` (median and ``_min``) against ``threshold``."""
    value = getattr(row, ratio) if row is not None else None
    value_min = getattr(row, f"{ratio}_min") if row is not None else None
    return {
        "target": text,
        "threshold": threshold,
        "value": value,
        "met": None if value is None else met(value, threshold),
        "value_min": value_min,
        "met_min": None if value_min is None else met(value_min, threshold),
    }


def evaluate_targets(rows: list[Row]) -> list[dict[str, Any]]:
    """The data-plane targets at 64 MiB (reported, never asserted)."""
    by_key = {(r.payload, r.size_mib, r.backend, r.op): r for r in rows}
    targets = []
    for op in ("put", "get"):
        text = f"local {op} throughput >= {LOCAL_TPUT_TARGET}x one memory copy (dense 64 MiB)"
        row = by_key.get(("dense", 64.0, LOCAL, op))
        targets.append(_target(text, LOCAL_TPUT_TARGET, row, "tput_vs_memcpy", operator.ge))
    for payload, threshold, what in (
        ("dense", TQ_OVERHEAD_TARGET, f"<= {TQ_OVERHEAD_TARGET:.2f}x raw library time"),
        ("jagged", TQ_JAGGED_TARGET, f">= {1 / TQ_JAGGED_TARGET:.0f}x faster than the raw library"),
    ):
        for op in ("put", "get"):
            row = by_key.get((payload, 64.0, TQ_ADAPTER, op))
            text = f"transfer_queue adapter {op} {what} ({payload} 64 MiB)"
            targets.append(_target(text, threshold, row, "time_vs_tq_raw", operator.le))
    return targets


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec``, ``"-"`` for ``None``."""
    return "-" if value is None else format(value, spec)


def format_table(rows: list[Row]) -> str:
    """The printed result table (one line per row)."""
    header = (
        f"{'payload':<8}{'MiB':>7}{'rows':>7}  {'backend':<16}{'op':<10}{'n':>3}"
        f"{'min ms':>10}{'med ms':>10}{'MB/s':>10}{'x memcpy':>10}{'(min)':>8}{'/ tq_raw':>10}"
        f"{'(min)':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.payload:<8}{r.size_mib:>7g}{r.rows:>7}  {r.backend:<16}{r.op:<10}{r.reps:>3}"
            f"{r.min_ms:>10.2f}{r.median_ms:>10.2f}{r.mb_per_s:>10.0f}"
            f"{fmt(r.tput_vs_memcpy, '.2f'):>10}{fmt(r.tput_vs_memcpy_min, '.2f'):>8}"
            f"{fmt(r.time_vs_tq_raw, '.2f'):>10}{fmt(r.time_vs_tq_raw_min, '.2f'):>8}"
        )
    return "\n".join(lines)


#: Step-bench backends that are not a plain synchronous data plane compared against legacy.
_NOT_COMPARED = ("disabled", "tq_async")


def rl_comparisons(results: list[dict[str, Any]], sizes: list[int], target_bulk_ratio: float) -> list[dict[str, Any]]:
    """Legacy vs data-plane RL step costs: per size, one comparison against ``disabled`` for every synchronous
    data-plane backend that ran, in run order; keys carry its name (``<dp>_step_time_s``, ...) beside ``data_plane``."""
    comparisons = []
    for samples in sizes:
        by_dp = {r["data_plane"]: r for r in results if r["samples_per_step"] == samples}
        if "disabled" not in by_dp:
            continue
        for dp in by_dp:
            if dp not in _NOT_COMPARED:
                comparisons.append(_comparison(by_dp, dp, samples, target_bulk_ratio))
    return comparisons


def _comparison(by_dp: dict[str, dict[str, Any]], dp: str, samples: int, target_bulk_ratio: float) -> dict[str, Any]:
    legacy, ours = by_dp["disabled"]["mean"], by_dp[dp]["mean"]

    def pair(key: str, old: dict[str, Any] = legacy, new: dict[str, Any] = ours) -> dict[str, Any]:
        return {f"legacy_{key}": old[key], f"{dp}_{key}": new[key]}

    def ratio(key: str, old: dict[str, Any] = legacy, new: dict[str, Any] = ours) -> float:
        return new[key] / max(1.0, old[key])

    bulk_ratio = ratio("driver_bulk_received_bytes")
    splits = ("generation", "logprobs", "train")
    runs = {"old": by_dp["disabled"], "new": by_dp[dp]}
    return {
        "samples_per_step": samples,
        "data_plane": dp,
        f"step_time_ratio_{dp}_over_legacy": ours["step_time_s"] / legacy["step_time_s"],
        **pair("step_time_s"),
        **pair("driver_bulk_received_bytes"),
        f"driver_bulk_ratio_{dp}_over_legacy": bulk_ratio,
        "bulk_target_met": bulk_ratio <= target_bulk_ratio,
        **pair("driver_tensor_received_bytes"),
        f"driver_tensor_ratio_{dp}_over_legacy": ratio("driver_tensor_received_bytes"),
        **pair("ray_received_pickled_bytes"),
        f"ray_pickled_ratio_{dp}_over_legacy": ratio("ray_received_pickled_bytes"),
        **pair("ray_sent_bulk_bytes"),
        **{f"{dp}_{k}": ours[k] for k in ("driver_store_written_bytes", "driver_store_wall_ms")},
        f"{dp}_workers_store_wall_ms_max_rank": ours["workers_store_wall_ms_max_rank"],
        f"{dp}_extra_time_s": ours["step_time_s"] - legacy["step_time_s"],
        "time_split_legacy_s": {k: legacy[f"time/{k}_s"] for k in splits},
        f"time_split_{dp}_s": {k: ours[f"time/{k}_s"] for k in splits},
        **pair("peak_rss_mb", **runs),
        **pair("rss_growth_mb", **runs),
        f"peak_rss_ratio_{dp}_over_legacy": by_dp[dp]["peak_rss_mb"] / by_dp["disabled"]["peak_rss_mb"],
        f"rss_growth_ratio_{dp}_over_legacy": ratio("rss_growth_mb", **runs),
        "legacy_ms_per_trained_sample": 1000.0 * legacy["step_time_s"] / samples,
        f"{dp}_ms_per_trained_sample": 1000.0 * ours["step_time_s"] / samples,
        **(_async_columns(by_dp, samples) if dp == "tq" else {}),
    }


def _async_columns(by_dp: dict[str, dict[str, Any]], samples: int) -> dict[str, Any]:
    """Wall time per trained sample of the asynchronous trainer against the synchronous one."""
    if "tq_async" not in by_dp:
        return {}
    step_s = by_dp["tq_async"]["mean"]["step_time_s"]
    sync_s = by_dp["tq"]["mean"]["step_time_s"]
    return {
        "tq_async_step_time_s": step_s,
        "tq_async_ms_per_trained_sample": 1000.0 * step_s / samples,
        "per_sample_ratio_async_over_sync": step_s / sync_s,
        "tq_async_peak_rss_mb": by_dp["tq_async"]["peak_rss_mb"],
    }


def print_rl_comparisons(name: str, comparisons: list[dict[str, Any]], target_bulk_ratio: float) -> None:
    """Print one line per :func:`rl_comparisons` entry, prefixed with the bench name."""
    for c in comparisons:
        dp = c["data_plane"]
        print(
            f"[{name}] {c['samples_per_step']} samples/step: step time legacy "
            f"{c['legacy_step_time_s']:.3f} s, {dp} {c[f'{dp}_step_time_s']:.3f} s "
            f"(ratio {c[f'step_time_ratio_{dp}_over_legacy']:.2f}); driver bulk received legacy "
            f"{c['legacy_driver_bulk_received_bytes'] / 1e3:.1f} kB, {dp} "
            f"{c[f'{dp}_driver_bulk_received_bytes'] / 1e3:.1f} kB (ratio "
            f"{c[f'driver_bulk_ratio_{dp}_over_legacy']:.3f}, target <= {target_bulk_ratio}: "
            f"{'met' if c['bulk_target_met'] else 'NOT met'}); all tensors received (per-row carry "
            f"included) ratio {c[f'driver_tensor_ratio_{dp}_over_legacy']:.3f}; pickled Ray returns "
            f"ratio {c[f'ray_pickled_ratio_{dp}_over_legacy']:.3f}; driver sent bulk legacy "
            f"{c['legacy_ray_sent_bulk_bytes'] / 1e3:.1f} kB, {dp} "
            f"{(c[f'{dp}_ray_sent_bulk_bytes'] + c[f'{dp}_driver_store_written_bytes']) / 1e3:.1f} kB; "
            f"{dp} store time per step: driver {c[f'{dp}_driver_store_wall_ms']:.0f} ms, slowest worker "
            f"{c[f'{dp}_workers_store_wall_ms_max_rank']:.0f} ms (extra step time "
            f"{1000 * c[f'{dp}_extra_time_s']:.0f} ms); peak RSS legacy "
            f"{c['legacy_peak_rss_mb']:.0f} MB, {dp} {c[f'{dp}_peak_rss_mb']:.0f} MB (ratio "
            f"{c[f'peak_rss_ratio_{dp}_over_legacy']:.2f}); RSS growth over the run legacy "
            f"{c['legacy_rss_growth_mb']:.0f} MB, {dp} {c[f'{dp}_rss_growth_mb']:.0f} MB (ratio "
            f"{c[f'rss_growth_ratio_{dp}_over_legacy']:.2f})",
            flush=True,
        )
        if "tq_async_step_time_s" in c:
            print(
                f"[{name}] {c['samples_per_step']} samples/step: wall time per trained sample legacy "
                f"{c['legacy_ms_per_trained_sample']:.2f} ms, tq (sync) {c['tq_ms_per_trained_sample']:.2f} ms, "
                f"tq_async {c['tq_async_ms_per_trained_sample']:.2f} ms (async / sync "
                f"{c['per_sample_ratio_async_over_sync']:.2f})",
                flush=True,
            )


def sft_table(results: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    """SFT step cost rows per (size, data plane), relative to ``disabled`` where it ran."""
    table = []
    for gbs in sizes:
        by_dp = {r["data_plane"]: r for r in results if r["global_batch_size"] == gbs}
        base = by_dp.get("disabled")
        for dp, r in by_dp.items():
            m = r["mean"]
            table.append(
                {
                    "global_batch_size": gbs,
                    "data_plane": dp,
                    "step_time_s": m["step_time_s"],
                    "train_time_s": m["time/train_s"],
                    "driver_held_bytes": m["driver_held_bytes"],
                    "driver_sent_tensor_bytes": m["driver_sent_tensor_bytes"],
                    "ray_received_pickled_bytes": m["ray_received_pickled_bytes"],
                    "peak_rss_mb": r["peak_rss_mb"],
                    "step_time_vs_disabled": None if base is None else m["step_time_s"] / base["mean"]["step_time_s"],
                    "driver_bytes_vs_disabled": None
                    if base is None
                    else m["driver_held_bytes"] / max(1.0, base["mean"]["driver_held_bytes"]),
                }
            )
    return table


def print_sft_table(table: list[dict[str, Any]]) -> None:
    """Print the :func:`sft_table` rows."""
    print(f"{'rows':>6} {'data_plane':>10} {'step ms':>9} {'x legacy':>9} {'driver bytes':>13} {'x legacy':>9} {'peak RSS MB':>12}")
    for row in table:
        st = row["step_time_vs_disabled"]
        db = row["driver_bytes_vs_disabled"]
        print(
            f"{row['global_batch_size']:>6} {row['data_plane']:>10} {row['step_time_s'] * 1e3:>9.1f} "
            f"{'-' if st is None else f'{st:.2f}':>9} {row['driver_held_bytes']:>13.0f} "
            f"{'-' if db is None else f'{db:.3f}':>9} {row['peak_rss_mb']:>12.0f}",
            flush=True,
        )

