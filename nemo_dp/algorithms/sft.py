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
from nemo_dp.algorithms.rollout import evaluate
from nemo_dp.algorithms.trainer_common import TRAINER_STATE_VERSION, Checkpointer, RunLogger, should_validate
from nemo_dp.data.datasets import collate_sft
from nemo_dp.utils.seeding import capture_rng_state, restore_rng_state

__all__ = ["sft_train", "restore_trainer_state"]


def restore_trainer_state(
    start_state: dict[str, Any], *, algorithm: str, policy: Any, train_loader: Any
) -> dict[str, Any]:
    """Load a checkpoint's policy, loader and driver RNG state; return its counters.

    Args:
        start_state: A loaded training checkpoint written by a trainer of ``algorithm``.
        algorithm: Expected ``algorithm.name``.
        policy: The policy to restore into.
        train_loader: The loader to restore into.

    Returns:
        The checkpoint's ``counters`` dict (``step`` etc.).

    Raises:
        ValueError: If the checkpoint is from another algorithm or trainer-state version.
    """
    where = start_state.get("checkpoint_path", "<in-memory state>")
    if start_state["trainer_state_version"] != TRAINER_STATE_VERSION:
        raise ValueError(
            f"checkpoint {where}: trainer_state_version {start_state['trainer_state_version']} "
            f"is not supported (expected {TRAINER_STATE_VERSION})"
        )
    if start_state["algorithm"] != algorithm:
        raise ValueError(
            f"checkpoint {where}: written by algorithm {start_state['algorithm']!r}, cannot resume "
            f"algorithm {algorithm!r} (checkpointing.resume_from)"
        )
    policy.load_state_dict(start_state["policy"])
    train_loader.load_state_dict(start_state["loader"])
    restore_rng_state(start_state["driver_rng"])
    return dict(start_state["counters"])


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
    counters = {"step": 0, "consumed_samples": 0, "val_accuracy": None, "initial_val_accuracy": None}
    if start_state is not None:
        counters.update(
            restore_trainer_state(start_state, algorithm="sft", policy=policy, train_loader=train_loader)
        )
        logger.info(f"resumed from {start_state['checkpoint_path']} at step {counters['step']}")
    else:
        # One optimizer step per SFT step (the loader batch is the global batch).
        policy.reset_optimizer(float(master_config.policy.optimizer.lr), decay_steps=max_steps)
    loss_fn = NLLLoss()
    logger.start(max_steps, int(counters["step"]))

    def _evaluate() -> float:
        ev = evaluate(
            policy,
            val_problems,
            tokenizer=tokenizer,
            env=env,
            num_examples_to_print=int(master_config.logger.num_val_examples_to_print),
        )
        for line in ev["examples"]:
            logger.info(f"  {line}")
        return float(ev["val_accuracy"])

    if counters["step"] == 0 and bool(algo.val_at_start):
        acc = _evaluate()
        counters["initial_val_accuracy"] = acc
        logger.info(f"step 0: held-out accuracy {acc:.3f} ({len(val_problems)} problems)")
        logger.log_step(0, {"val_accuracy": acc})

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
            t1 = time.perf_counter()
            acc = _evaluate()
            counters["val_accuracy"] = acc
            metrics["val_accuracy"] = acc
            metrics["time/val_s"] = time.perf_counter() - t1
            logger.info(f"step {step}: loss {metrics['loss']:.4f}, held-out accuracy {acc:.3f}")
        logger.log_step(step, metrics)
        if checkpointer.should_save(step, final=step == max_steps):
            checkpointer.save(
                step,
                lambda: {
                    "trainer_state_version": TRAINER_STATE_VERSION,
                    "algorithm": "sft",
                    "counters": dict(counters),
                    "policy": policy.state_dict(),
                    "loader": train_loader.state_dict(),
                    "driver_rng": capture_rng_state(),
                },
            )
    logger.close()
    return dict(counters)
