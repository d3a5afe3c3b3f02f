"""``TrainContext``, the one argument every trainer takes, and the logger/checkpointer protocols it holds."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["PhaseLogger", "PhaseCheckpointer", "TrainHooks", "TrainContext"]


@runtime_checkable
class PhaseLogger(Protocol):
    """What a trainer needs from the phase's logger."""

    def start(self, total_steps: int, start_step: int) -> None:
        """Begin the phase (``start_step`` steps already done)."""

    def info(self, message: str) -> None:
        """Print one log line."""

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Record one step's scalar metrics; returns the record written."""

    def close(self) -> Path | None:
        """End the phase; returns the plot path, if any."""


@runtime_checkable
class PhaseCheckpointer(Protocol):
    """What a trainer needs from the phase's checkpointer."""

    root: Path

    def should_save(self, step: int, *, final: bool) -> bool:
        """Whether to save after ``step``."""

    def save(self, step: int, state_fn: Callable[[], dict[str, Any]]) -> Path:
        """Write the checkpoint of ``step`` (``state_fn`` builds the state)."""

    def prune(self) -> None:
        """Delete checkpoints beyond the ones to keep."""


@dataclass
class TrainHooks:
    """Callbacks a caller injects into a trainer run (fault injection in tests, probes).

    Attributes:
        on_checkpoint_staged: ``fn(step, tmp_dir)`` after a staged checkpoint's state and data plane are
            written, before the manifest and the commit rename.
        on_model_built: ``fn(role, model)`` when a trainer builds a model of its own (PPO: ``"value"``).
    """

    on_checkpoint_staged: Callable[[int, Path], None] | None = None
    on_model_built: Callable[[str, Any], None] | None = None

    def checkpoint_staged(self, step: int, tmp_dir: Path) -> None:
        if self.on_checkpoint_staged is not None:
            self.on_checkpoint_staged(step, tmp_dir)

    def model_built(self, role: str, model: Any) -> None:
        if self.on_model_built is not None:
            self.on_model_built(role, model)


@dataclass
class TrainContext:
    """Everything one training phase runs on.

    ``start_state`` is a loaded checkpoint to resume from, or ``None`` for a fresh run.
    """

    policy: Any
    cfg: Any
    train_loader: Any
    val_problems: list[Any]
    tokenizer: Any
    env: Any
    logger: PhaseLogger
    checkpointer: PhaseCheckpointer
    start_state: dict[str, Any] | None = None
    hooks: TrainHooks = field(default_factory=TrainHooks)
