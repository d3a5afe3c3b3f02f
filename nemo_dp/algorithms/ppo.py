"""Legacy (in-memory) PPO trainer: ``ppo_train(ctx)``, actor-critic with token-level rewards and GAE.

The batch lives in driver memory; everything else is ``ppo_common``, shared with the data-plane
trainer.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from nemo_dp.algorithms.ppo_common import (
    PPO_POLICY_TRAIN_KEYS,
    PPO_VALUE_TRAIN_KEYS,
    build_ppo_loss_fns,
    compute_ppo_targets,
    epoch_permutation,
    make_value,
    finish_ppo_step_metrics,
    ppo_step_metrics,
    start_ppo_phase,
)
from nemo_dp.algorithms.rollout import rollout
from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.trainer_common import (
    make_evaluator,
    sample_seeds,
    save_if_due,
    trainer_state,
    validate_at_start,
)
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.environments.weighted import reward_part_means

__all__ = ["ppo_train"]


def ppo_train(ctx: TrainContext) -> dict[str, Any]:
    """Run PPO for ``algorithm.max_steps`` steps (in-memory batches).

    Args:
        ctx: The phase's context (``ctx.policy`` a plain ``Policy``, ``ctx.cfg.algorithm`` PPO,
            ``ctx.train_loader`` batch size ``num_prompts_per_step``).

    Returns:
        ``{"step", "consumed_samples", "val_accuracy", "initial_val_accuracy"}``.
    """
    value = make_value(ctx.cfg, ctx.tokenizer)
    try:
        ctx.hooks.model_built("value", value)
        return _ppo_loop(ctx, value)
    finally:
        value.shutdown()


def _ppo_loop(ctx: TrainContext, value: Any) -> dict[str, Any]:
    policy, master_config, train_loader = ctx.policy, ctx.cfg, ctx.train_loader
    tokenizer, env, logger, val_problems = ctx.tokenizer, ctx.env, ctx.logger, ctx.val_problems
    algo = master_config.algorithm
    max_steps = int(algo.max_steps)
    group = int(algo.num_generations_per_prompt)
    counters = start_ppo_phase(
        policy, value, master_config, start_state=ctx.start_state, train_loader=train_loader, logger=logger
    )
    policy_loss_fn, value_loss_fn = build_ppo_loss_fns(algo)
    logger.start(max_steps, int(counters["step"]))

    _evaluate = make_evaluator(
        policy, val_problems, tokenizer=tokenizer, env=env, master_config=master_config, logger=logger
    )
    validate_at_start(counters, _evaluate, algo=algo, num_problems=len(val_problems), logger=logger)

    while counters["step"] < max_steps:
        step = int(counters["step"]) + 1
        t0 = time.perf_counter()
        problems = train_loader.next_batch()
        seeds = sample_seeds(int(master_config.seed), step, 0, len(problems) * group)
        batch = rollout(
            policy, problems, tokenizer=tokenizer, env=env, group_size=group, seeds=seeds, greedy=False
        ).batch
        t_gen = time.perf_counter() - t0
        sample_mask = torch.ones(batch.size, dtype=torch.float32)
        if bool(algo.overlong_filtering):
            sample_mask = sample_mask * (~batch["truncated"].bool()).float()
        data = BatchedDataDict(
            {
                "input_ids": batch["input_ids"],
                "input_lengths": batch["input_lengths"],
                "token_mask": batch["token_mask"],
                "sample_mask": sample_mask,
                "generation_logprobs": batch["generation_logprobs"],
            }
        )
        t1 = time.perf_counter()
        data["prev_logprobs"] = policy.get_logprobs(data)["logprobs"]
        data["reference_policy_logprobs"] = policy.get_reference_policy_logprobs(data)["reference_logprobs"]
        data["values"] = value.get_values(data)["values"]
        t_fwd = time.perf_counter() - t1
        targets = compute_ppo_targets(
            algo,
            scores=batch["rewards"],
            token_mask=data["token_mask"],
            sample_mask=sample_mask,
            prev_logprobs=data["prev_logprobs"],
            reference_logprobs=data["reference_policy_logprobs"],
            values=data["values"],
        )
        data["advantages"] = targets.advantages
        data["returns"] = targets.returns
        t2 = time.perf_counter()
        policy_epochs, value_epochs = [], []
        for epoch in range(int(algo.ppo_epochs)):
            perm = epoch_permutation(int(master_config.seed), step, epoch, data.size)
            shuffled = data.select_indices(perm)
            policy_epochs.append(
                policy.train(BatchedDataDict({k: shuffled[k] for k in PPO_POLICY_TRAIN_KEYS}), policy_loss_fn)
            )
            value_epochs.append(
                value.train(BatchedDataDict({k: shuffled[k] for k in PPO_VALUE_TRAIN_KEYS}), value_loss_fn)
            )
        t_train = time.perf_counter() - t2
        counters["step"] = step
        counters["consumed_samples"] += batch.size
        metrics = ppo_step_metrics(
            scores=batch["rewards"],
            reward_parts=reward_part_means(batch),
            targets=targets,
            values=data["values"],
            token_mask=data["token_mask"],
            truncated=batch["truncated"],
            sample_mask=sample_mask,
            policy_epochs=policy_epochs,
            value_epochs=value_epochs,
        )
        finish_ppo_step_metrics(
            step,
            metrics,
            counters=counters,
            timings=(t_gen, t_fwd, t_train),
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
            lambda: trainer_state(
                "ppo",
                counters,
                policy_state=policy.state_dict(),
                value_state=value.state_dict(),
                loader_state=train_loader.state_dict(),
            ),
        )
    logger.close()
    return dict(counters)
