"""The one SFT step loop over either batch path: collated on the driver (``sft.LegacySFTPath``) or
loaded by colocated loaders into the data plane (``sft_sync.ColocatedSFTPath``).  Never imports the data plane.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.loss_functions import NLLLoss
from nemo_dp.algorithms.trainer_common import open_step_loop, record_validation, should_validate, start_counters

__all__ = ["SFTBatchPath", "run_sft"]


class SFTBatchPath(Protocol):
    """What the SFT step loop asks of the way batches reach the workers.

    ``restore`` takes a resumed checkpoint's trainer state; ``prepare`` is called once before the first
    step (``next_batch``: steps done); ``train_step`` returns ``(train metrics, rows consumed, extra
    metrics)``; ``save_if_due`` checkpoints when ``ctx.checkpointer`` asks; ``close`` runs after the last step.
    """

    def restore(self, state: dict[str, Any]) -> None: ...
    def prepare(self, ctx: TrainContext, next_batch: int) -> None: ...
    def make_evaluator(self, ctx: TrainContext) -> Callable[[], float]: ...
    def start_run(self) -> None: ...
    def train_step(self, batch_index: int, loss_fn: Any) -> tuple[dict[str, Any], int, dict[str, Any]]: ...
    def save_if_due(self, ctx: TrainContext, step: int, max_steps: int, counters: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def run_sft(ctx: TrainContext, path: SFTBatchPath) -> dict[str, Any]:
    """Run SFT for ``algorithm.max_steps`` steps with batches delivered by ``path``."""
    policy, master_config, logger = ctx.policy, ctx.cfg, ctx.logger
    algo = master_config.algorithm
    max_steps = int(algo.max_steps)
    counters = start_counters(ctx, "sft", path.restore)
    if ctx.start_state is None:
        # One optimizer step per SFT step (the loader batch is the global batch).
        opt = master_config.policy.optimizer
        policy.reset_optimizer(float(opt.lr), decay_steps=max_steps, warmup_steps=int(opt.warmup_steps))
    path.prepare(ctx, int(counters["step"]))
    loss_fn = NLLLoss()
    evaluate = open_step_loop(ctx, path, counters, max_steps)

    while counters["step"] < max_steps:
        t0 = time.perf_counter()
        train_metrics, consumed, extra = path.train_step(int(counters["step"]), loss_fn)
        counters["step"] += 1
        counters["consumed_samples"] += consumed
        step = int(counters["step"])
        metrics: dict[str, Any] = {
            "loss": train_metrics["loss"],
            "grad_norm": train_metrics["grad_norm"],
            "lr": train_metrics["lr"],
            "num_valid_tokens": train_metrics["num_valid_tokens"],
            "consumed_samples": counters["consumed_samples"],
            "time/train_s": time.perf_counter() - t0,
            **extra,
        }
        if should_validate(step, val_period=int(algo.val_period), max_steps=max_steps):
            acc = record_validation(counters, metrics, evaluate)
            logger.info(f"step {step}: loss {metrics['loss']:.4f}, held-out accuracy {acc:.3f}")
        logger.log_step(step, metrics)
        path.save_if_due(ctx, step, max_steps, counters)
    path.close()
    logger.close()
    return dict(counters)
