"""Legacy (in-memory) GRPO trainer: ``grpo_train(ctx)``.

Per step: sample responses with per-row seeds, score them, compute group baselines/stds, optional
dynamic sampling and overlong filtering, the log-probs ``grpo_common.logprob_plan`` asks for,
then train with the clipped policy-gradient loss plus the k3 KL penalty.  The batch lives in
driver memory; the step tail is ``grpo_common``'s, shared with the data-plane twin.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from nemo_dp.algorithms.advantages import grpo_advantages, grpo_baseline_and_std
from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.grpo_common import finish_grpo_step_metrics, logprob_plan
from nemo_dp.algorithms.rollout import rollout
from nemo_dp.algorithms.trainer_common import (
    clipped_pg_loss_fn,
    make_evaluator,
    sample_seeds,
    save_if_due,
    start_counters,
    trainer_state,
    validate_at_start,
)
from nemo_dp.utils.packed_tensor import IMAGE_FIELDS
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.environments.weighted import reward_part_means

__all__ = ["grpo_train", "collect_grpo_batch", "GRPO_TRAIN_KEYS"]

#: The fields ``policy.train`` receives.
GRPO_TRAIN_KEYS: tuple[str, ...] = (
    "input_ids",
    "input_lengths",
    "token_mask",
    "sample_mask",
    "generation_logprobs",
    "prev_logprobs",
    "reference_policy_logprobs",
    "advantages",
)


def collect_grpo_batch(
    policy: Any,
    master_config: Any,
    *,
    train_loader: Any,
    tokenizer: Any,
    env: Any,
    step: int,
) -> tuple[BatchedDataDict, dict[str, Any]]:
    """Roll out until one step's batch is complete (with dynamic sampling when enabled).

    Args:
        policy: The policy.
        master_config: Root config (GRPO algorithm).
        train_loader: Loader of problems (``num_prompts_per_step`` per batch).
        tokenizer: The tokenizer.
        env: The environment.
        step: The step being collected (1-based; seeds depend on it).

    Returns:
        ``(batch, info)``: exactly ``num_prompts_per_step x num_generations_per_prompt`` rows
        with generation fields, ``rewards``, ``baseline``, ``std``; ``info`` holds the
        unfiltered rewards (truncated to the batch size), ``num_gen_batches`` and
        ``num_discarded_valid_samples``.

    Raises:
        ValueError: ``"Dynamic sampling reached max_gen_batches=..."`` when the batch cannot be
            filled within the budget.
    """
    algo = master_config.algorithm
    group = int(algo.num_generations_per_prompt)
    target = int(algo.num_prompts_per_step) * group
    ds = algo.dynamic_sampling
    pending: BatchedDataDict | None = None
    unfiltered: list[torch.Tensor] = []
    num_gen = 0
    discarded = 0
    while True:
        problems = train_loader.next_batch()
        seeds = sample_seeds(int(master_config.seed), step, num_gen, len(problems) * group)
        num_gen += 1
        out = rollout(
            policy, problems, tokenizer=tokenizer, env=env, group_size=group, seeds=seeds, greedy=False
        )
        batch = out.batch
        rewards = batch["rewards"]
        baseline, std = grpo_baseline_and_std(rewards, group, bool(algo.use_leave_one_out_baseline))
        batch["baseline"] = baseline
        batch["std"] = std
        unfiltered.append(rewards)
        if bool(ds.enabled):
            keep = [i for i, s in enumerate(std.tolist()) if s != 0.0]
            batch = batch.select_indices(keep) if keep else None
        if batch is not None:
            pending = batch if pending is None else BatchedDataDict.from_batches(
                [pending, batch], pad_value_dict={"input_ids": tokenizer.pad_id}
            )
        if not bool(ds.enabled):
            break
        have = 0 if pending is None else pending.size
        if have >= target:
            if have > target:
                discarded = have - target
                pending = pending.slice(0, target)  # type: ignore[union-attr]
            break
        if num_gen >= int(ds.max_gen_batches):
            raise ValueError(
                f"Dynamic sampling reached max_gen_batches={int(ds.max_gen_batches)} "
                f"(algorithm.dynamic_sampling.max_gen_batches) with {have} of {target} samples "
                f"at step {step}: too many groups have identical rewards; raise the budget or "
                "disable algorithm.dynamic_sampling"
            )
    assert pending is not None
    info = {
        "unfiltered_rewards": torch.cat(unfiltered)[:target],
        "num_gen_batches": num_gen,
        "num_discarded_valid_samples": discarded,
    }
    return pending, info


def grpo_train(ctx: TrainContext) -> dict[str, Any]:
    """Run GRPO for ``algorithm.max_steps`` steps.

    A fresh run (no ``ctx.start_state``) freezes the current weights as the reference policy
    and starts a fresh optimizer at ``policy.optimizer.lr`` (after an SFT warm start this makes
    the warm-started model the reference).

    Args:
        ctx: The phase's context (``ctx.policy`` a plain ``Policy``, ``ctx.cfg.algorithm`` GRPO,
            ``ctx.train_loader`` batch size ``num_prompts_per_step``).

    Returns:
        ``{"step", "consumed_samples", "val_accuracy", "initial_val_accuracy"}``.

    Raises:
        ValueError: Dynamic sampling exhausted ``max_gen_batches``.
    """
    policy, master_config, train_loader = ctx.policy, ctx.cfg, ctx.train_loader
    tokenizer, env, logger, val_problems = ctx.tokenizer, ctx.env, ctx.logger, ctx.val_problems
    algo = master_config.algorithm
    max_steps = int(algo.max_steps)
    counters = start_counters(
        ctx.start_state, algorithm="grpo", policy=policy, train_loader=train_loader, logger=logger
    )
    if ctx.start_state is None:
        policy.snapshot_reference_policy()
        per_step = int(algo.num_prompts_per_step) * int(algo.num_generations_per_prompt)
        optimizer_steps = max_steps * (per_step // int(master_config.policy.train_global_batch_size))
        policy.reset_optimizer(float(master_config.policy.optimizer.lr), decay_steps=optimizer_steps)
    plan = logprob_plan(master_config)
    loss_fn = clipped_pg_loss_fn(algo, prev_logprobs_from_forward=plan.reuse_train_forward)
    train_keys = [k for k in GRPO_TRAIN_KEYS if k not in plan.skipped_fields]
    logger.start(max_steps, int(counters["step"]))

    _evaluate = make_evaluator(
        policy, val_problems, tokenizer=tokenizer, env=env, master_config=master_config, logger=logger
    )
    validate_at_start(counters, _evaluate, algo=algo, num_problems=len(val_problems), logger=logger)

    while counters["step"] < max_steps:
        step = int(counters["step"]) + 1
        t0 = time.perf_counter()
        batch, info = collect_grpo_batch(
            policy, master_config, train_loader=train_loader, tokenizer=tokenizer, env=env, step=step
        )
        t_gen = time.perf_counter() - t0
        adv = grpo_advantages(batch["rewards"], batch["baseline"], batch["std"], bool(algo.normalize_rewards))
        token_mask = batch["token_mask"]
        sample_mask = torch.ones(batch.size, dtype=torch.float32)
        if bool(algo.overlong_filtering):
            sample_mask = sample_mask * (~batch["truncated"].bool()).float()
        train_batch = BatchedDataDict(
            {
                "input_ids": batch["input_ids"],
                "input_lengths": batch["input_lengths"],
                "token_mask": token_mask,
                "sample_mask": sample_mask,
                "generation_logprobs": batch["generation_logprobs"],
                "advantages": adv.unsqueeze(1) * token_mask.float(),
                **{k: batch[k] for k in IMAGE_FIELDS if k in batch},
            }
        )
        t1 = time.perf_counter()
        if not plan.reuse_train_forward:
            train_batch["prev_logprobs"] = policy.get_logprobs(train_batch)["logprobs"]
        if plan.reference:
            train_batch["reference_policy_logprobs"] = policy.get_reference_policy_logprobs(train_batch)[
                "reference_logprobs"
            ]
        t_lp = time.perf_counter() - t1
        t2 = time.perf_counter()
        keys = [*train_keys, *(k for k in IMAGE_FIELDS if k in train_batch)]
        train_metrics = policy.train(BatchedDataDict({k: train_batch[k] for k in keys}), loss_fn)
        t_train = time.perf_counter() - t2
        counters["step"] = step
        counters["consumed_samples"] += batch.size
        metrics = finish_grpo_step_metrics(
            step,
            train_metrics,
            info=info,
            train_rewards=batch["rewards"],
            reward_parts=reward_part_means(batch),
            advantages=adv,
            response_lengths=token_mask.sum(1).float(),
            truncated=batch["truncated"],
            sample_mask=sample_mask,
            counters=counters,
            timings=(t_gen, t_lp, t_train),
            prev_logprobs_source=plan.prev_logprobs_source,
            val_period=int(algo.val_period),
            max_steps=max_steps,
            evaluate=_evaluate,
            logger=logger,
        )
        logger.log_step(step, metrics)
        save_if_due(
            ctx.checkpointer,
            step,
            max_steps,
            lambda: trainer_state("grpo", counters, policy.state_dict(), train_loader.state_dict()),
        )
    logger.close()
    return dict(counters)
