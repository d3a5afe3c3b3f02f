"""Data-plane PPO trainer: ``ppo_train_sync``.

The legacy ``ppo_train``'s algorithm and metrics with the per-token tensors in the store; the
driver reads only the columns the advantages need and writes ``advantages`` / ``returns`` /
``sample_mask`` back.  The store is reached only through ``TQPolicy`` / ``TQValue`` methods.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.store_eval import make_store_evaluator
from nemo_dp.algorithms.ppo_common import (
    build_ppo_loss_fns,
    compute_ppo_targets,
    epoch_permutation,
    make_value,
    finish_ppo_step_metrics,
    ppo_step_metrics,
    start_ppo_phase,
)
from nemo_dp.algorithms.trainer_common import (
    sample_seeds,
    save_if_due,
    trainer_state,
    validate_at_start,
)
from nemo_dp.config.trainer_lookup import validate_trainer_selection
from nemo_dp.data_plane.registry import cross_process_options
from nemo_dp.data_plane.schema import (
    ADVANTAGES,
    DP_TRAIN_FIELDS,
    DP_VALUE_TRAIN_FIELDS,
    PPO_VALUE_FIELDS,
    PREV_LOGPROBS,
    REFERENCE_POLICY_LOGPROBS,
    RETURNS,
    SAMPLE_MASK,
    TASK_TRAIN,
    TOKEN_MASK,
    VALUES,
)
from nemo_dp.environments.weighted import reward_part_means
from nemo_dp.models.value.tq_value import TQValue

__all__ = ["ppo_train_sync", "TRAINER_TARGET"]

#: This trainer's registry entry in ``nemo_dp.config.trainer_lookup.TRAINER_REGISTRY``.
TRAINER_TARGET = "nemo_dp.algorithms.ppo_sync:ppo_train_sync"

#: Per-token columns the driver reads back for the advantage.
_TARGET_READ_FIELDS: tuple[str, ...] = (TOKEN_MASK, PREV_LOGPROBS, REFERENCE_POLICY_LOGPROBS, VALUES)


def _check_entry(policy: Any, master_config: Any) -> None:
    selection = validate_trainer_selection(master_config)
    if selection.target != TRAINER_TARGET:
        raise ValueError(
            f"ppo_train_sync needs a data plane that carries rows between processes "
            f"({cross_process_options()}); this config selects {selection.target} - use the legacy trainer "
            "nemo_dp.algorithms.ppo:ppo_train (select_sync_trainer picks it)"
        )
    if not hasattr(policy, "dp_cfg"):
        raise ValueError(
            f"ppo_train_sync needs a data-plane policy exposing dp_cfg (TQPolicy), got "
            f"{type(policy).__name__}; build the policy with "
            "nemo_dp.data_plane.factory.make_policy_factory(cfg.data_plane)"
        )


def ppo_train_sync(ctx: TrainContext) -> dict[str, Any]:
    """Run PPO for ``algorithm.max_steps`` steps over the data plane.

    Same context, checkpoints and metrics as ``ppo_train``.  The critic is a ``TQValue``
    sharing the policy's data plane, created here and shut down at the end.

    Args:
        ctx: The phase's context (``ctx.policy`` a ``TQPolicy`` from ``make_policy_factory``,
            ``ctx.cfg`` PPO with ``data_plane=tq``).

    Returns:
        ``{"step", "consumed_samples", "val_accuracy", "initial_val_accuracy"}``.

    Raises:
        ValueError: The config does not select this trainer or the policy is not a
            data-plane policy.
    """
    _check_entry(ctx.policy, ctx.cfg)
    value = make_value(ctx.cfg, ctx.tokenizer, value_factory=functools.partial(TQValue.from_policy, ctx.policy))
    try:
        ctx.hooks.model_built("value", value)
        return _ppo_sync_loop(ctx, value)
    finally:
        value.shutdown()


def _ppo_sync_loop(ctx: TrainContext, value: Any) -> dict[str, Any]:
    policy, master_config, train_loader = ctx.policy, ctx.cfg, ctx.train_loader
    tokenizer, env, logger, val_problems = ctx.tokenizer, ctx.env, ctx.logger, ctx.val_problems
    algo = master_config.algorithm
    max_steps = int(algo.max_steps)
    group = int(algo.num_generations_per_prompt)
    per_step = int(algo.num_prompts_per_step) * group
    counters = start_ppo_phase(
        policy, value, master_config, start_state=ctx.start_state, train_loader=train_loader, logger=logger
    )
    policy_loss_fn, value_loss_fn = build_ppo_loss_fns(algo)
    logger.start(max_steps, int(counters["step"]))
    _evaluate = make_store_evaluator(
        policy, val_problems, tokenizer=tokenizer, env=env, master_config=master_config, logger=logger
    )
    validate_at_start(counters, _evaluate, algo=algo, num_problems=len(val_problems), logger=logger)

    # Start the per-step store-metrics windows here (drops pre-run traffic; no-op when off).
    policy.data_plane_step_metrics(1.0)
    value.data_plane_worker_metrics(1.0)
    while counters["step"] < max_steps:
        step = int(counters["step"]) + 1
        t_step = time.perf_counter()
        policy.prepare_step(num_samples=per_step, extra_fields=PPO_VALUE_FIELDS)
        try:
            t0 = time.perf_counter()
            problems = list(train_loader.next_batch())
            seeds = sample_seeds(int(master_config.seed), step, 0, len(problems) * group)
            out = policy.generate_to_dataplane(
                [tokenizer.encode_prompt(p.prompt) for p in problems for _ in range(group)],
                seeds,
                sample_ids=[f"s{step}_p{j}_g{i}" for j in range(len(problems)) for i in range(group)],
                answers=[p.answer for p in problems for _ in range(group)],
                greedy=False,
                tokenizer=tokenizer,
                env=env,
                task_name=TASK_TRAIN,
            )
            meta, carry = out.meta, out.carry
            t_gen = time.perf_counter() - t0
            sample_mask = torch.ones(meta.size, dtype=torch.float32)
            if bool(algo.overlong_filtering):
                sample_mask = sample_mask * (~carry["truncated"].bool()).float()
            t1 = time.perf_counter()
            policy.get_policy_and_reference_logprobs_from_meta(meta)
            value.get_values_from_meta(meta)
            t_fwd = time.perf_counter() - t1
            cols = policy.read_from_dataplane(meta, select_fields=list(_TARGET_READ_FIELDS))
            targets = compute_ppo_targets(
                algo,
                scores=carry["rewards"],
                token_mask=cols[TOKEN_MASK],
                sample_mask=sample_mask,
                prev_logprobs=cols[PREV_LOGPROBS],
                reference_logprobs=cols[REFERENCE_POLICY_LOGPROBS],
                values=cols[VALUES],
            )
            # Everything the driver computes goes back in one put; the forward passes above
            # never read the mask (the rollout's all-ones column stands until here).
            policy.write_to_dataplane(
                meta, {ADVANTAGES: targets.advantages, RETURNS: targets.returns, SAMPLE_MASK: sample_mask}
            )
            t2 = time.perf_counter()
            policy_epochs, value_epochs = [], []
            for epoch in range(int(algo.ppo_epochs)):
                epoch_meta = meta.subset(epoch_permutation(int(master_config.seed), step, epoch, meta.size))
                policy_epochs.append(
                    policy.train_from_meta(epoch_meta, policy_loss_fn, train_fields=DP_TRAIN_FIELDS)
                )
                value_epochs.append(
                    value.train_from_meta(epoch_meta, value_loss_fn, train_fields=DP_VALUE_TRAIN_FIELDS)
                )
            t_train = time.perf_counter() - t2
            policy.finish_step(meta)
        finally:
            policy.drop_partition()
        counters["step"] = step
        counters["consumed_samples"] += meta.size
        metrics = ppo_step_metrics(
            scores=carry["rewards"],
            reward_parts=reward_part_means(carry),
            targets=targets,
            values=cols[VALUES],
            token_mask=cols[TOKEN_MASK],
            truncated=carry["truncated"],
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
        step_time_s = time.perf_counter() - t_step
        metrics.update(policy.data_plane_step_metrics(step_time_s))
        metrics.update(value.data_plane_worker_metrics(step_time_s))
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
