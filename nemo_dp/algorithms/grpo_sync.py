"""Data-plane GRPO trainer: ``grpo_train_sync``.

The legacy ``grpo_train``'s algorithm with identical per-step metrics, but no per-token tensor
passes through the driver: workers write generations into the store, the driver works on metas
and a small per-row carry, and advantages travel with the training dispatch.  The store is
reached only through ``TQPolicy`` methods and ``KVBatchMeta`` transforms; a failed step drops its
partition.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from nemo_dp.algorithms.advantages import grpo_advantages, grpo_baseline_and_std
from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.grpo_common import finish_grpo_step_metrics, logprob_plan
from nemo_dp.algorithms.store_eval import make_store_evaluator, problem_rows
from nemo_dp.algorithms.trainer_common import (
    clipped_pg_loss_fn,
    sample_seeds,
    save_if_due,
    start_counters,
    trainer_state,
    validate_at_start,
)
from nemo_dp.config.trainer_lookup import validate_trainer_selection
from nemo_dp.data_plane.registry import cross_process_options
from nemo_dp.data_plane.interfaces import KVBatchMeta
from nemo_dp.data_plane.schema import (
    ADVANTAGES,
    DP_TRAIN_FIELDS,
    SAMPLE_MASK,
    TAG_BASELINE,
    TAG_STD,
    TASK_TRAIN,
)
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.environments.weighted import reward_part_means

__all__ = ["grpo_train_sync", "collect_grpo_batch_sync", "TRAINER_TARGET"]

#: This trainer's registry entry in ``nemo_dp.config.trainer_lookup.TRAINER_REGISTRY``.
TRAINER_TARGET = "nemo_dp.algorithms.grpo_sync:grpo_train_sync"


def collect_grpo_batch_sync(
    policy: Any,
    master_config: Any,
    *,
    train_loader: Any,
    tokenizer: Any,
    env: Any,
    step: int,
) -> tuple[KVBatchMeta, BatchedDataDict, dict[str, Any]]:
    """Roll out into the live ``"train"`` partition until the step's batch is complete.

    Dynamic sampling on metas: rows whose group std is 0 are dropped (their
    ids cleared from the store), survivors are concatenated across generation batches, an
    overflow is sliced off (its ids cleared).

    Args:
        policy: A ``TQPolicy`` whose training partition is registered.
        master_config: Root config (GRPO algorithm).
        train_loader: Loader of problems (``num_prompts_per_step`` per batch).
        tokenizer: The tokenizer.
        env: The environment.
        step: The step being collected (1-based; seeds depend on it).

    Returns:
        ``(meta, carry, info)``: exactly ``num_prompts_per_step x num_generations_per_prompt``
        rows; ``carry`` holds ``rewards``, ``baseline``, ``std``, lengths and ``truncated``;
        ``info`` the unfiltered rewards (truncated to the batch size), ``num_gen_batches`` and
        ``num_discarded_valid_samples``.

    Raises:
        ValueError: ``"Dynamic sampling reached max_gen_batches=..."`` when the batch cannot be
            filled within the budget, or a meta without ``"std"`` tags reaches the filter.
    """
    algo = master_config.algorithm
    group = int(algo.num_generations_per_prompt)
    target = int(algo.num_prompts_per_step) * group
    ds = algo.dynamic_sampling
    pending_meta: KVBatchMeta | None = None
    pending_carry: BatchedDataDict | None = None
    unfiltered: list[torch.Tensor] = []
    num_gen = 0
    discarded = 0
    while True:
        problems = list(train_loader.next_batch())
        seeds = sample_seeds(int(master_config.seed), step, num_gen, len(problems) * group)
        iteration = num_gen
        num_gen += 1
        prompts, answers = problem_rows(problems, group, tokenizer)
        # One uid per prompt of this generation batch; ids are minted here, once per sample.
        ids = [f"s{step}_b{iteration}_p{j}_g{i}" for j in range(len(problems)) for i in range(group)]
        out = policy.generate_to_dataplane(
            prompts,
            seeds,
            sample_ids=ids,
            answers=answers,
            greedy=False,
            tokenizer=tokenizer,
            env=env,
            task_name=TASK_TRAIN,
        )
        meta: KVBatchMeta | None = out.meta
        carry: BatchedDataDict | None = out.carry
        assert meta is not None and carry is not None
        rewards = carry["rewards"]
        baseline, std = grpo_baseline_and_std(rewards, group, bool(algo.use_leave_one_out_baseline))
        carry["baseline"] = baseline
        carry["std"] = std
        meta.stamp_tags({TAG_STD: std, TAG_BASELINE: baseline})
        unfiltered.append(rewards)
        if bool(ds.enabled):
            tags = meta.tags
            if tags is None or any(TAG_STD not in t for t in tags):
                raise ValueError(
                    "dynamic sampling: every row of the rollout meta needs a 'std' tag; the driver "
                    "must stamp 'std' (meta.stamp_tags) before filtering"
                )
            keep = [i for i, t in enumerate(tags) if t[TAG_STD] != 0.0]
            kept = set(keep)
            policy.discard_samples([sid for i, sid in enumerate(meta.sample_ids) if i not in kept])
            if keep:
                meta, carry = meta.subset(keep), carry.select_indices(keep)
            else:
                meta, carry = None, None
        if meta is not None and carry is not None:
            if pending_meta is None or pending_carry is None:
                pending_meta, pending_carry = meta, carry
            else:
                pending_meta = pending_meta.concat(meta)
                pending_carry = BatchedDataDict.from_batches([pending_carry, carry])
        if not bool(ds.enabled):
            break
        have = 0 if pending_meta is None else pending_meta.size
        if have >= target:
            if have > target:
                assert pending_meta is not None and pending_carry is not None
                discarded = have - target
                policy.discard_samples(pending_meta.sample_ids[target:])
                pending_meta = pending_meta.slice(0, target)
                pending_carry = pending_carry.slice(0, target)
            break
        if num_gen >= int(ds.max_gen_batches):
            raise ValueError(
                f"Dynamic sampling reached max_gen_batches={int(ds.max_gen_batches)} "
                f"(algorithm.dynamic_sampling.max_gen_batches) with {have} of {target} samples "
                f"at step {step}: too many groups have identical rewards; raise the budget or "
                "disable algorithm.dynamic_sampling"
            )
    assert pending_meta is not None and pending_carry is not None
    info = {
        "unfiltered_rewards": torch.cat(unfiltered)[:target],
        "num_gen_batches": num_gen,
        "num_discarded_valid_samples": discarded,
    }
    return pending_meta, pending_carry, info


def _check_entry(policy: Any, master_config: Any) -> None:
    selection = validate_trainer_selection(master_config)
    if selection.target != TRAINER_TARGET:
        raise ValueError(
            f"grpo_train_sync needs a data plane that carries rows between processes "
            f"({cross_process_options()}); this config selects {selection.target} - use the legacy trainer "
            "nemo_dp.algorithms.grpo:grpo_train (select_sync_trainer picks it)"
        )
    if not hasattr(policy, "dp_cfg"):
        raise ValueError(
            f"grpo_train_sync needs a data-plane policy exposing dp_cfg (TQPolicy), got "
            f"{type(policy).__name__}; build the policy with "
            "nemo_dp.data_plane.factory.make_policy_factory(cfg.data_plane)"
        )


def grpo_train_sync(ctx: TrainContext) -> dict[str, Any]:
    """Run GRPO for ``algorithm.max_steps`` steps over the data plane.

    Same context, checkpoints and metrics as ``grpo_train`` (plus ``data_plane/*`` metrics
    when ``data_plane.observability.enabled``).

    Args:
        ctx: The phase's context (``ctx.policy`` a ``TQPolicy`` from ``make_policy_factory``,
            ``ctx.cfg`` GRPO with ``data_plane=tq``).

    Returns:
        ``{"step", "consumed_samples", "val_accuracy", "initial_val_accuracy"}``.

    Raises:
        ValueError: The config does not select this trainer, the policy is not a data-plane
            policy, or dynamic sampling exhausted ``max_gen_batches``.
    """
    policy, master_config, train_loader = ctx.policy, ctx.cfg, ctx.train_loader
    tokenizer, env, logger, val_problems = ctx.tokenizer, ctx.env, ctx.logger, ctx.val_problems
    _check_entry(policy, master_config)
    algo = master_config.algorithm
    max_steps = int(algo.max_steps)
    group = int(algo.num_generations_per_prompt)
    per_step = int(algo.num_prompts_per_step) * group
    counters = start_counters(
        ctx.start_state, algorithm="grpo", policy=policy, train_loader=train_loader, logger=logger
    )
    if ctx.start_state is None:
        policy.snapshot_reference_policy()
        optimizer_steps = max_steps * (per_step // int(master_config.policy.train_global_batch_size))
        policy.reset_optimizer(float(master_config.policy.optimizer.lr), decay_steps=optimizer_steps)
    plan = logprob_plan(master_config)
    loss_fn = clipped_pg_loss_fn(algo, prev_logprobs_from_forward=plan.reuse_train_forward)
    train_fields = tuple(f for f in DP_TRAIN_FIELDS if f not in plan.skipped_fields)
    logger.start(max_steps, int(counters["step"]))
    _evaluate = make_store_evaluator(
        policy, val_problems, tokenizer=tokenizer, env=env, master_config=master_config, logger=logger
    )
    validate_at_start(counters, _evaluate, algo=algo, num_problems=len(val_problems), logger=logger)

    # Start the per-step store-metrics window here (drops pre-run traffic; no-op when off).
    policy.data_plane_step_metrics(1.0)
    while counters["step"] < max_steps:
        step = int(counters["step"]) + 1
        t_step = time.perf_counter()
        policy.prepare_step(num_samples=per_step, group_size=group)
        try:
            t0 = time.perf_counter()
            meta, carry, info = collect_grpo_batch_sync(
                policy, master_config, train_loader=train_loader, tokenizer=tokenizer, env=env, step=step
            )
            t_gen = time.perf_counter() - t0
            adv = grpo_advantages(
                carry["rewards"], carry["baseline"], carry["std"], bool(algo.normalize_rewards)
            )
            sample_mask = torch.ones(meta.size, dtype=torch.float32)
            if bool(algo.overlong_filtering):
                sample_mask = sample_mask * (~carry["truncated"].bool()).float()
            t1 = time.perf_counter()
            if not plan.reuse_train_forward and plan.reference:
                policy.get_policy_and_reference_logprobs_from_meta(meta)
            elif not plan.reuse_train_forward:
                policy.get_logprobs_from_meta(meta)
            elif plan.reference:
                policy.get_reference_policy_logprobs_from_meta(meta)
            t_lp = time.perf_counter() - t1
            t2 = time.perf_counter()
            train_metrics = policy.train_from_meta(
                meta,
                loss_fn,
                train_fields=train_fields,
                row_values={ADVANTAGES: adv, SAMPLE_MASK: sample_mask},
            )
            t_train = time.perf_counter() - t2
            policy.finish_step(meta)
        finally:
            policy.drop_partition()
        counters["step"] = step
        counters["consumed_samples"] += meta.size
        metrics = finish_grpo_step_metrics(
            step,
            train_metrics,
            info=info,
            train_rewards=carry["rewards"],
            reward_parts=reward_part_means(carry),
            advantages=adv,
            response_lengths=carry["response_lengths"].float(),
            truncated=carry["truncated"],
            sample_mask=sample_mask,
            counters=counters,
            timings=(t_gen, t_lp, t_train),
            prev_logprobs_source=plan.prev_logprobs_source,
            val_period=int(algo.val_period),
            max_steps=max_steps,
            evaluate=_evaluate,
            logger=logger,
        )
        # Per-step store metrics (empty unless data_plane.observability.enabled).
        store_metrics = policy.data_plane_step_metrics(time.perf_counter() - t_step)
        metrics.update(store_metrics)
        if store_metrics:
            logger.info(
                f"step {step}: data plane {store_metrics['data_plane/step/wall_ms']:.0f} ms "
                f"({100 * store_metrics['data_plane/step/frac_of_step']:.1f}% of step), "
                f"written {store_metrics['data_plane/step/bytes_written_mb']:.4f} MB, "
                f"read {store_metrics['data_plane/step/bytes_read_mb']:.4f} MB, "
                f"outstanding {store_metrics['data_plane/now/bytes_outstanding_mb']:.4f} MB"
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
