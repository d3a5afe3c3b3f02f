"""Per-step metrics of asynchronous GRPO: staleness, idle fractions, throughput."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["staleness_metrics", "idle_metrics"]


def staleness_metrics(lags: Sequence[int], max_staleness: int) -> dict[str, float]:
    """``async/staleness_mean``, ``_max`` and a ``async/staleness_hist/<k>`` row count per lag ``0..max_staleness``.

    Raises:
        ValueError: No rows, or a lag outside ``[0, max_staleness]``.
    """
    values = [int(x) for x in lags]
    if not values:
        raise ValueError("staleness_metrics: no rows")
    bad = sorted({v for v in values if v < 0 or v > max_staleness})
    if bad:
        raise ValueError(
            f"staleness_metrics: policy lags {bad} outside [0, algorithm.async_rollout.max_staleness={max_staleness}]"
        )
    out: dict[str, float] = {
        "async/staleness_mean": sum(values) / len(values),
        "async/staleness_max": float(max(values)),
    }
    for k in range(max_staleness + 1):
        out[f"async/staleness_hist/{k}"] = float(sum(1 for v in values if v == k))
    return out


def idle_metrics(
    *,
    wall_s: float,
    claim_wait_s: float,
    rollout_busy_s: float,
    num_rollout_workers: int,
    window: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """``async/trainer_idle_frac``, ``async/rollout_idle_frac`` of one step window, plus ``time/<key>`` of ``window``.

    Both are clamped to ``[0, 1]``: a shard counts in the window it finishes in.

    Raises:
        ValueError: ``wall_s <= 0`` or ``num_rollout_workers < 1``.
    """
    if not wall_s > 0:
        raise ValueError(f"idle_metrics: wall_s must be > 0, got {wall_s}")
    if num_rollout_workers < 1:
        raise ValueError(f"idle_metrics: num_rollout_workers must be >= 1, got {num_rollout_workers}")

    def clamp(x: float) -> float:
        return min(1.0, max(0.0, x))

    out = {
        "async/trainer_idle_frac": clamp(claim_wait_s / wall_s),
        "async/rollout_idle_frac": clamp(1.0 - rollout_busy_s / (wall_s * num_rollout_workers)),
    }
    for key, value in (window or {}).items():
        out[f"time/{key}"] = float(value)
    return out
