"""``RunLogger``: metrics file, progress bar, log lines and the final plot of one phase."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_dp.utils.metrics import MetricsLogger

__all__ = ["RunLogger"]

#: Shown on the progress bar when a step's record carries them (store metrics appear only when a
#: trainer logs them, i.e. with observability enabled on the data-plane path).
_BAR_KEYS: tuple[str, ...] = (
    "loss",
    "reward_mean",
    "val_accuracy",
    "grad_norm",
    "async/generated_samples",
    "async/samples_per_s",
    "data_plane/step/wall_ms",
    "data_plane/now/bytes_outstanding_mb",
)


class RunLogger:
    """Metrics file, progress bar, log lines and the final plot of one training phase.

    Args:
        plot_file: PNG file name in ``out_dir`` (written by :meth:`close` when ``plot``).
        tracker: Experiment trackers (``nemo_dp.training.trackers``) that receive every record.
        health: A detector whose ``update(step, record)`` returns a warning line to print, or ``None``.
    """

    def __init__(
        self, out_dir: str | Path, *, metrics_file: str, plot_file: str, plot: bool, progress_bar: bool, label: str,
        tracker: Any = None, health: Any = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.out_dir / metrics_file
        self.plot_path = self.out_dir / plot_file
        self.metrics = MetricsLogger(self.metrics_path)
        self.plot, self.progress_bar, self.label, self.tracker, self.health = plot, progress_bar, label, tracker, health
        self._bar: Any = None
        self._last: dict[str, float] = {}
        #: The last step logged (or resumed from); the step under way is the next one.
        self.last_step = 0

    def start(self, total_steps: int, start_step: int) -> None:
        """Open the progress bar up to step ``total_steps`` and drop metrics after ``start_step`` (redone)."""
        self.metrics.truncate_after(start_step)
        self.last_step = int(start_step)
        if self.progress_bar:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps,
                initial=start_step,
                desc=self.label,
                unit="step",
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.5,
            )

    def info(self, message: str) -> None:
        """Print one log line (above the progress bar)."""
        line = f"[{self.label}] {message}"
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Append the step's record (step 0 = before training) to metrics.jsonl, update the bar; return it."""
        record = self.metrics.log(step, metrics)
        self.last_step = max(self.last_step, int(step))
        if self.tracker is not None:
            self.tracker.log_metrics(step, record)
        if self.health is not None:
            warning = self.health.update(step, record)
            if warning is not None:
                self.info(f"WARNING: {warning}")
        self._last.update({k: float(record[k]) for k in _BAR_KEYS if isinstance(record.get(k), (int, float))})
        if self._bar is not None:
            if step > self._bar.n:
                self._bar.update(step - self._bar.n)
            self._bar.set_postfix({k: f"{v:.4g}" for k, v in self._last.items()}, refresh=False)
        return record

    def close(self) -> Path | None:
        """Close the bar and write the plot; its path, or ``None`` when plotting is off or nothing was logged."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if not self.plot or not self.metrics_path.exists() or self.metrics_path.stat().st_size == 0:
            return None
        from nemo_dp.utils.plotting import plot_training_curves

        return plot_training_curves(self.metrics_path, self.plot_path)
