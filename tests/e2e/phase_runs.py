"""Configs composed, and training phases run, in-process by the e2e scripts: no checkpoints, metrics read back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.compose import compose_run

__all__ = ["compose_run", "train_phase", "train_from_state"]


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


def train_from_state(cfg: Any, tokenizer: Any, env_vars: dict[str, str], state: Any, run_dir: Path) -> dict[str, Any]:
    """Train ``cfg``'s main phase from ``state`` on a policy of its own, shut down afterwards.

    Policy and trainer come from the factories the launcher uses (``make_policy``,
    ``select_sync_trainer``); Ray runs in the caller.

    Args:
        cfg: The run's composed config.
        tokenizer: The run's tokenizer.
        env_vars: The worker environment ``init_ray`` returned.
        state: The policy state to start from (a warm start's ``policy`` entry).
        run_dir: Where the phase writes ``metrics.jsonl``.

    Returns:
        ``{"records", "checksums", "policy_class", "trainer"}``: the phase's metrics records,
        each rank's weight checksums at the end, the policy's class name and the trainer's
        ``module.name``.
    """
    from nemo_dp.config import validate_config
    from nemo_dp.data_plane.factory import select_sync_trainer
    from nemo_dp.training import main_phase, make_policy

    validated = validate_config(cfg)
    trainer = select_sync_trainer(cfg)
    policy = make_policy(cfg, tokenizer, env_vars=env_vars)
    try:
        policy.load_state_dict(state)
        records = train_phase(main_phase(cfg), policy, tokenizer, run_dir, validated.logger, trainer)
        return {
            "records": records,
            "checksums": policy.weights_checksums(),
            "policy_class": type(policy).__name__,
            "trainer": f"{trainer.__module__}.{trainer.__name__}",
        }
    finally:
        policy.shutdown()
