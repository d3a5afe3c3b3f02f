"""Training-curve plots from ``metrics.jsonl`` (headless: matplotlib's Agg backend)."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from nemo_dp.utils.metrics import read_metrics  # noqa: E402

# Panel title -> substrings that put a metric key on that panel.
_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loss", ("loss",)),
    ("reward", ("reward",)),
    ("held-out accuracy", ("accuracy", "acc")),
)


def plot_training_curves(metrics_jsonl: str | os.PathLike[str], out_png: str | os.PathLike[str]) -> Path:
    """Plot every numeric ``loss`` / ``reward`` / ``acc`` key against step to ``out_png``; return its path
    (``ValueError`` when the metrics file holds no records)."""
    records = read_metrics(metrics_jsonl)
    if not records:
        raise ValueError(f"plot_training_curves: {metrics_jsonl} holds no metrics records")
    series: dict[str, tuple[list[int], list[float]]] = {}
    for rec in records:
        for key, value in rec.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            steps, values = series.setdefault(key, ([], []))
            steps.append(rec["step"])
            values.append(float(value))
    fig, axes = plt.subplots(1, len(_PANELS), figsize=(5 * len(_PANELS), 3.6))
    for ax, (title, needles) in zip(axes, _PANELS):
        keys = sorted(k for k in series if any(n in k.lower() for n in needles))
        if title != "loss":
            keys = [k for k in keys if "loss" not in k.lower()]
        for key in keys:
            steps, values = series[key]
            ax.plot(steps, values, marker="." if len(steps) < 50 else None, label=key)
        if keys:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
