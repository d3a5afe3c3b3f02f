"""Legacy (in-memory) SFT trainer: next-token loss on response tokens.

The driver holds every batch: it draws ``policy.train_global_batch_size`` pairs from the loader,
collates them and calls ``policy.train`` (which shards the batch over the DP workers with the
shared planner).  Periodic held-out greedy exact-match evaluation, per-step metrics, and
checkpoints (model, optimizer, RNG streams, loader cursor, counters) with exact resume.

The call signature is shared by every trainer the factory can select (``grpo_train`` binds the
same one), so the launcher calls whichever trainer it is handed the same way.
"""

from __future__ import annotations

import time
from typing import Any

from nemo_dp.algorithms.loss_functions import NLLLoss
from nemo_dp.algorithms.trainer_common import (
    Checkpointer,
    RunLogger,
    make_evaluator,
    record_validation,
    restore_trainer_state,
    should_validate,
    start_counters,
    trainer_state,
    validate_at_start,
)
from nemo_dp.data.datasets import collate_sft

__all__ = ["sft_train", "restore_trainer_state"]


def sft_train(
    policy: Any,
    master_config: Any,
    *,
    train_loader: Any,
    val_problems: list[Any],
    tokenizer: Any,
    env: Any,
    logger: RunLogger,
    checkpointer: Checkpointer,
    start_state: dict[str, Any] | None,
) -> dict[str, Any]:
    """Run SFT for ``algorithm.max_steps`` steps.

    Args:
        policy: The policy facade (``Policy``).
        master_config: The validated root config (``algorithm`` is SFT).
        train_loader: Resumable loader of (prompt, response) pairs, batch size
            ``policy.train_global_batch_size``.
        val_problems: Held-out problems for greedy exact-match evaluation.
        tokenizer: The tokenizer.
        env: The reward environment (exact match).
        logger: The phase's ``RunLogger``.
        checkpointer: The phase's ``Checkpointer``.
        start_state: A loaded checkpoint to resume from, or ``None`` for a fresh run.

    Returns:
        ``{"step", "consumed_samples", "val_accuracy", "initial_val_accuracy"}`` (accuracies
        ``None`` when never evaluated).
    """
    algo = master_config.algorithm
    max_steps = int(algo.max_steps)
    max_seq_len = int(master_config.policy.model.max_seq_len)
    counters = start_counters(start_state, algorithm="sft", policy=policy, train_loader=train_loader, logger=logger)
    if start_state is None:
        # One optimizer step per SFT step (the loader batch is the global batch).
        policy.reset_optimizer(float(master_config.policy.optimizer.lr), decay_steps=max_steps)
    loss_fn = NLLLoss()
    logger.start(max_steps, int(counters["step"]))

    _evaluate = make_evaluator(
        policy, val_problems, tokenizer=tokenizer, env=env, master_config=master_config, logger=logger
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
        if checkpointer.should_save(step, final=step == max_steps):
            checkpointer.save(
                step,
                lambda: trainer_state("sft", counters, policy.state_dict(), train_loader.state_dict()),
            )
    logger.close()
    return dict(counters)
