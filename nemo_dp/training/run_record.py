"""The launcher's record of a run, and what a stopped run leaves: ``summary.json``, plots, the last good
checkpoint and the resume command, or no run directory if it never started."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_dp.utils.json_files import write_json

__all__ = ["RunRecord", "remove_unstarted_run_dir", "resume_command", "write_failure_summary"]

_LOG = logging.getLogger(__name__)

#: What Hydra and the launcher write into a run directory before the run starts.
_PRE_START_FILES: frozenset[str] = frozenset({"resolved_config.yaml", "run.json"})


@dataclass
class RunRecord:
    """What the launcher tells the wrapper while a run goes on: the summary so far and each phase's
    ``(metrics.jsonl, plot.png)`` (used after a failure), and the ``on_start`` hooks :meth:`mark_started`
    calls once (nothing reaches the run directory before the run is accepted)."""

    run_dir: Path
    log_path: Path | None = None
    started: bool = False
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: list[tuple[Path, Path]] = field(default_factory=list)
    t_start: float = field(default_factory=time.perf_counter)
    on_start: list[Callable[[], None]] = field(default_factory=list)
    checkpoint_root: Path | None = None
    phase_names: list[str] = field(default_factory=list)

    def mark_started(self) -> None:
        """From now on a failure is a failed run (summary, plot), not a configuration error."""
        if self.started:
            return
        self.started = True
        for hook in self.on_start:
            hook()

    def track_metrics(self, metrics_path: str | os.PathLike[str], plot_path: str | os.PathLike[str]) -> None:
        """Plot a phase's ``metrics_path`` to ``plot_path`` if the run fails."""
        pair = (Path(metrics_path), Path(plot_path))
        if pair not in self.metrics:
            self.metrics.append(pair)


def _empty_tree(path: Path) -> bool:
    """A directory holding no files at any depth (what preflight's writability probe leaves)."""
    return all(child.is_dir() and not child.is_symlink() and _empty_tree(child) for child in path.iterdir())


def remove_unstarted_run_dir(run_dir: str | os.PathLike[str], *, log_names: tuple[str, ...] = ()) -> bool:
    """Remove a run directory holding only ``.hydra/``, the logs ``log_names`` (default: any ``*.log``),
    ``resolved_config.yaml``, ``run.json`` and empty directories; return whether it was removed."""
    root = Path(run_dir)
    if not root.is_dir():
        return False
    for child in root.iterdir():
        if child.is_symlink():
            return False
        if child.is_dir() and (child.name == ".hydra" or _empty_tree(child)):
            continue
        is_log = child.name in log_names or (not log_names and child.suffix == ".log")
        if child.is_file() and (child.name in _PRE_START_FILES or is_log):
            continue
        return False
    shutil.rmtree(root, ignore_errors=True)
    return not root.exists()


def _plot_tracked(record: RunRecord) -> list[str]:
    plots: list[str] = []
    for metrics_path, plot_path in record.metrics:
        if not metrics_path.is_file() or metrics_path.stat().st_size == 0:
            continue
        try:
            from nemo_dp.utils.plotting import plot_training_curves

            plots.append(str(plot_training_curves(metrics_path, plot_path)))
        except Exception as exc:  # the plot must never hide the run's own error
            _LOG.warning("could not plot %s: %s", metrics_path, exc)
    return plots


def resume_command(run_dir: Path) -> str:
    """The shell command that resumes this run into its own directory (this job's overrides kept)."""
    import shlex

    overrides: list[str] = []
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = [str(o) for o in HydraConfig.get().overrides.task]
    except ValueError:  # not under Hydra
        pass
    replaced = ("hydra.run.dir", "checkpointing.resume_from")
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in replaced]
    script = sys.argv[0] if sys.argv and sys.argv[0] else "launchers/launch.py"
    return shlex.join(["python", script, *kept, f"checkpointing.resume_from={run_dir}", f"hydra.run.dir={run_dir}"])


def _resume_hint(record: RunRecord) -> tuple[dict[str, Any], list[str]]:
    """What a stopped run tells the user about resuming it: summary fields and lines."""
    from nemo_dp.training.checkpoint_discovery import newest_checkpoint

    last = newest_checkpoint(record.checkpoint_root, record.phase_names)
    if last is None:
        return {"last_checkpoint": None}, [
            "no checkpoint was written before the run stopped (see checkpointing.save_period); nothing to resume from"
        ]
    command = resume_command(record.run_dir)
    return {"last_checkpoint": str(last), "resume_command": command}, [
        f"last good checkpoint: {last}",
        f"resume with: {command}",
    ]


def write_failure_summary(record: RunRecord, exc: BaseException, *, status: str) -> Path:
    """Write ``summary.json`` (``status``: ``failed``, ``interrupted`` or ``terminated``) for a run that stopped
    early, and plot what ran; return its path."""
    summary = dict(record.summary)
    summary.setdefault("run_dir", str(record.run_dir))
    summary["status"] = status
    summary["error"] = {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback_tail": traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:],
    }
    summary["plots"] = _plot_tracked(record)
    summary["wall_time_s"] = time.perf_counter() - record.t_start
    try:
        hint, lines = _resume_hint(record)
    except Exception as hint_exc:  # the hint must never hide the run's own error
        hint, lines = {}, []
        _LOG.warning("could not find the last checkpoint: %s", hint_exc)
    summary.update(hint)
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    path = record.run_dir / "summary.json"
    write_json(path, summary, indent=2, default=str)
    return path
