"""Legacy (in-memory) SFT trainer: ``sft_train(ctx)``, next-token loss on response tokens."""

from __future__ import annotations

import time
from typing import Any

from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.loss_functions import NLLLoss
from nemo_dp.algorithms.trainer_common import (
    make_evaluator,
    record_validation,
    restore_trainer_state,
    save_if_due,
    should_validate,
    start_counters,
    trainer_state,
    validate_at_start,
)
from nemo_dp.data.datasets import collate_sft

__all__ = ["sft_train", "restore_trainer_state"]


def sft_train(ctx: TrainContext) -> dict[str, Any]:
    """Run SFT for ``algorithm.max_steps`` steps.

    Args:
        ctx: The phase's context (``ctx.policy`` a plain ``Policy``, ``ctx.cfg.algorithm`` SFT,
            ``ctx.train_loader`` of (prompt, response) pairs with batch size
            ``policy.train_global_batch_size``).

    Returns:
        ``{"step", "consumed_samples", "val_accuracy", "initial_val_accuracy"}`` (accuracies
        ``None`` when never evaluated).
    """
    policy, master_config, train_loader = ctx.policy, ctx.cfg, ctx.train_loader
    tokenizer, logger, val_problems = ctx.tokenizer, ctx.logger, ctx.val_problems
    algo = master_config.algorithm
    max_steps = int(algo.max_steps)
    max_seq_len = int(master_config.policy.model.max_seq_len)
    counters = start_counters(
        ctx.start_state, algorithm="sft", policy=policy, train_loader=train_loader, logger=logger
    )
    if ctx.start_state is None:
        # One optimizer step per SFT step (the loader batch is the global batch).
        opt = master_config.policy.optimizer
        policy.reset_optimizer(float(opt.lr), decay_steps=max_steps, warmup_steps=int(opt.warmup_steps))
    loss_fn = NLLLoss()
    logger.start(max_steps, int(counters["step"]))

    _evaluate = make_evaluator(
        policy, val_problems, tokenizer=tokenizer, env=ctx.env, master_config=master_config, logger=logger
    )
    validate_at_start(counters, _evaluate, algo=algo, num_problems=len(val_problems), logger=logger)

    while counters["step"] < max_steps:
        t0 = time.perf_counter()
        examples = train_loader.next_batch()
        batch = collate_sft(examples, tokenizer, max_seq_len=max_seq_len)
        train_metrics = policy.train(batch, loss_fn)
        counters["step"] += 1
        counters["consumed_samples"] += len(examples)
        step = int(counters["step"])
        metrics: dict[str, Any] = {
            "loss": train_metrics["loss"],
            "grad_norm": train_metrics["grad_norm"],
            "lr": train_metrics["lr"],
            "num_valid_tokens": train_metrics["num_valid_tokens"],
            "consumed_samples": counters["consumed_samples"],
            "time/train_s": time.perf_counter() - t0,
        }
        if should_validate(step, val_period=int(algo.val_period), max_steps=max_steps):
            acc = record_validation(counters, metrics, _evaluate)
            logger.info(f"step {step}: loss {metrics['loss']:.4f}, held-out accuracy {acc:.3f}")
        logger.log_step(step, metrics)
        save_if_due(
            ctx.checkpointer,
            step,
            max_steps,
            lambda: trainer_state("sft", counters, policy.state_dict(), train_loader.state_dict()),
        )
    logger.close()
    return dict(counters)
