"""Store calls per training step by site and op kind: the trainers' logged store counters as step-row columns
``store/<site>/<op>/<stat>``, whose measured means are grouped per run for the JSON report and printed."""

from __future__ import annotations

from typing import Any

__all__ = [
    "STORE_SITES",
    "STORE_COLUMNS",
    "store_op_columns",
    "store_breakdown",
    "print_store_breakdown",
]

#: Where a step's store calls are counted: breakdown name -> metric prefix of its per-op keys
#: (the driver's own client, the slowest policy worker, the slowest critic worker).
STORE_SITES: dict[str, str] = {
    "driver": "data_plane/step",
    "slowest_worker": "data_plane/workers/max_rank",
    "slowest_critic_worker": "data_plane/critic_workers/max_rank",
}
_STORE_STATS: dict[str, tuple[str, float]] = {  # breakdown stat -> (metric stat, scale)
    "calls": ("calls", 1.0),
    "rows": ("rows", 1.0),
    "bytes": ("mb", 1e6),
    "ms": ("wall_ms", 1.0),
}
_BREAKDOWN_STATS: tuple[str, ...] = tuple(_STORE_STATS)
_BY_METRIC = {metric: (stat, scale) for stat, (metric, scale) in _STORE_STATS.items()}

STORE_COLUMNS: dict[str, str] = {
    "store/<site>/<op>/<stat>": "per step, data-plane backends with observability on: store calls "
    "of one op kind (put, get_data, get, clear, register, claim_meta, list, ...) at one site - "
    "driver (the driver's own client), slowest_worker / slowest_critic_worker (the policy / "
    "critic rank with the most store time that step); stat = calls, rows (keys touched), "
    "bytes (payload bytes moved), ms (wall time inside the calls)",
}


def store_op_columns(record: dict[str, Any]) -> dict[str, float]:
    """``{f"store/{site}/{op}/{stat}": value}`` of one logged step's metrics, for every ``STORE_SITES``
    site and op kind the record holds (empty without store counters)."""
    out: dict[str, float] = {}
    for site, prefix in STORE_SITES.items():
        head = prefix + "/"
        for key, value in record.items():
            if not key.startswith(head):
                continue
            parts = key[len(head):].split("/")
            if len(parts) == 2 and parts[1] in _BY_METRIC:
                stat, scale = _BY_METRIC[parts[1]]
                out[f"store/{site}/{parts[0]}/{stat}"] = float(value) * scale
    return out


def store_breakdown(results: list[dict[str, Any]], size_key: str) -> list[dict[str, Any]]:
    """Store calls per step (means over the measured steps) for every run that recorded them: ``{size_key,
    "data_plane", "sites": {site: {op: {"calls", "rows", "bytes", "ms"}}}, "totals": {site: {"calls", "ms"}}}``."""
    out = []
    for run in results:
        sites: dict[str, dict[str, dict[str, float]]] = {}
        for key, value in run["mean"].items():
            parts = key.split("/")
            if len(parts) != 4 or parts[0] != "store" or parts[3] not in _BREAKDOWN_STATS:
                continue
            _, site, op, stat = parts
            sites.setdefault(site, {}).setdefault(op, {k: 0.0 for k in _BREAKDOWN_STATS})[stat] = float(value)
        if not sites:
            continue
        totals = {
            site: {"calls": sum(o["calls"] for o in ops.values()), "ms": sum(o["ms"] for o in ops.values())}
            for site, ops in sites.items()
        }
        out.append({size_key: run[size_key], "data_plane": run["data_plane"], "sites": sites, "totals": totals})
    return out


def print_store_breakdown(name: str, size_key: str, breakdown: list[dict[str, Any]]) -> None:
    """Print :func:`store_breakdown` output, one line per (run, site, op kind), titled with ``name``."""
    if not breakdown:
        print(f"[{name}] no store counters recorded (observability off or legacy only)", flush=True)
        return
    print(f"[{name}] store calls per step (mean over measured steps)", flush=True)
    header = f"{size_key:>18} {'data_plane':>10} {'site':>22} {'op':>24} {'calls':>7} {'rows':>9} {'bytes':>12} {'ms':>9}"
    print(header, flush=True)
    for entry in breakdown:
        for site, ops in entry["sites"].items():
            for op, st in sorted(ops.items()):
                print(
                    f"{entry[size_key]:>18} {entry['data_plane']:>10} {site:>22} {op:>24} "
                    f"{st['calls']:>7.1f} {st['rows']:>9.0f} {st['bytes']:>12.0f} {st['ms']:>9.1f}",
                    flush=True,
                )
            tot = entry["totals"][site]
            print(
                f"{entry[size_key]:>18} {entry['data_plane']:>10} {site:>22} {'(all ops)':>24} "
                f"{tot['calls']:>7.1f} {'':>9} {'':>12} {tot['ms']:>9.1f}",
                flush=True,
            )
