"""One training phase run in-process by the parity scripts: no checkpoints, metrics read back."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def train_phase(phase: Any, policy: Any, tokenizer: Any, run_dir: Path, logger_cfg: Any, trainer: Any) -> list[dict[str, Any]]:
    """``run_phase`` of ``phase`` on ``policy`` with checkpointing off, into ``run_dir``.

    Args:
        phase: The phase (``main_phase(cfg)`` or a planned one).
        policy: The policy to train (the caller owns its lifetime).
        tokenizer: The run's tokenizer.
        run_dir: Where the phase writes ``metrics.jsonl``.
        logger_cfg: The validated ``logger`` node.
        trainer: The trainer the factory selected.

    Returns:
        The phase's ``metrics.jsonl`` records.
    """
    from nemo_dp.training import Checkpointer, phase_logger, run_phase
    from nemo_dp.utils.metrics import read_metrics

    run_phase(
        phase,
        policy,
        tokenizer=tokenizer,
        logger=phase_logger(phase, run_dir, logger_cfg),
        checkpointer=Checkpointer(run_dir / "ckpt", enabled=False, save_period=0, keep_last=1),
        trainer=trainer,
    )
    return read_metrics(run_dir / "metrics.jsonl")
