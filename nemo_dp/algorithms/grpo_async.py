"""Asynchronous GRPO over TransferQueue: ``grpo_train_async``.

Rollout actors generate batch ``k`` with policy version ``v >= k - 1 - max_staleness`` while the trainer
trains; with ``max_staleness=0`` metrics equal ``grpo_train_sync``'s.  A checkpoint stores the loader
position before in-flight batches, so a resume regenerates them and every prompt is trained exactly once.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from nemo_dp.algorithms.async_advantages import GroupAdvantages
from nemo_dp.algorithms.async_ledger import AsyncLedger
from nemo_dp.algorithms.async_losses import TruncatedISClippedPGLoss
from nemo_dp.algorithms.async_metrics import idle_metrics, staleness_metrics
from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.grpo_common import PG_TRAIN_METRICS, start_grpo_phase
from nemo_dp.algorithms.loss_functions import ClippedPGLossFn
from nemo_dp.algorithms.store_eval import make_store_evaluator
from nemo_dp.algorithms.trainer_common import (
    context_evaluator,
    record_validation,
    rollout_shape,
    sample_seeds,
    should_validate,
    trainer_state,
    validate_at_start,
)
from nemo_dp.config.async_rollout import coerce_async_rollout_config, validate_async_rollout_selection
from nemo_dp.config.trainer_lookup import validate_trainer_selection
from nemo_dp.data_plane.schema import DP_TRAIN_FIELDS
from nemo_dp.environments.weighted import PART_PREFIX, reward_part_means
from nemo_dp.models.policy.rollout_group import RolloutGroup
from nemo_dp.models.policy.rollout_worker import POLICY_VERSION

__all__ = ["grpo_train_async", "TRAINER_TARGET", "ASYNC_STATE_KEY", "validate_async_rollout_selection"]

#: This trainer's entry in the factory's trainer table (selected by algorithm.async_rollout.enabled).
TRAINER_TARGET = "nemo_dp.algorithms.grpo_async:grpo_train_async"
#: Key of the asynchronous bookkeeping inside a training checkpoint.
ASYNC_STATE_KEY = "async_rollout"


def _check_entry(policy: Any, master_config: Any) -> None:
    if not validate_async_rollout_selection(master_config):
        raise ValueError("grpo_train_async needs algorithm.name=grpo with algorithm.async_rollout.enabled=true")
    selection = validate_trainer_selection(master_config)
    if selection.target != TRAINER_TARGET:
        raise ValueError(
            f"grpo_train_async: this config selects {selection.target}; the asynchronous trainer is "
            "selected by algorithm.async_rollout.enabled=true with data_plane=tq"
        )
    if not hasattr(policy, "dp_cfg") or not hasattr(policy, "get_logprobs_from_meta"):
        raise ValueError(
            f"grpo_train_async needs a data-plane policy (TQPolicy), got {type(policy).__name__}; "
            "build it with nemo_dp.data_plane.factory.make_policy_factory(cfg.data_plane)"
        )


def _tag_tensor(tags: list[dict[str, Any]], key: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor([t[key] for t in tags], dtype=dtype)


def _tag_parts(tags: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Each reward's values of a list (``reward/<fn>`` tags, None = not applicable) as NaN-marked tensors."""
    keys = sorted({k for t in tags for k in t if k.startswith(PART_PREFIX)})
    return {
        k: torch.tensor([math.nan if t.get(k) is None else t[k] for t in tags], dtype=torch.float32) for k in keys
    }


def grpo_train_async(ctx: TrainContext) -> dict[str, Any]:
    """Run asynchronous GRPO: ``grpo_train_sync``'s checkpoints and step metrics, plus ``async/*`` metrics.

    Raises:
        ValueError: The config does not select this trainer, the policy is not a data-plane
            policy, or the logger has no ``out_dir`` for the ledger.
        TimeoutError: A batch's rows did not arrive within ``async_rollout.claim_timeout_s``.
        RuntimeError: A trained row lags more than ``max_staleness`` versions (a scheduling bug).
    """
    policy, master_config, train_loader = ctx.policy, ctx.cfg, ctx.train_loader
    tokenizer, env, logger, val_problems = ctx.tokenizer, ctx.env, ctx.logger, ctx.val_problems
    checkpointer = ctx.checkpointer
    _check_entry(policy, master_config)
    ledger_dir = getattr(logger, "out_dir", None)
    if ledger_dir is None:
        raise ValueError(
            f"grpo_train_async: the phase logger {type(logger).__name__} has no out_dir; the trainer "
            "writes async_ledger.jsonl there, beside metrics.jsonl (RunLogger has one)"
        )
    algo = master_config.algorithm
    acfg = coerce_async_rollout_config(algo.async_rollout)
    max_staleness = int(acfg.max_staleness)
    max_steps, group, per_step = rollout_shape(algo)
    seed = int(master_config.seed)
    restored: dict[str, Any] = {}
    counters = start_grpo_phase(ctx, restore_extra=lambda s: restored.update(dict(s.get(ASYNC_STATE_KEY) or {})))
    if restored:
        logger.info(
            f"resume: regenerating in-flight rollout batches {restored.get('in_flight_batches', [])} "
            "discarded with the interrupted run"
        )
    sync_loss = ClippedPGLossFn.from_algorithm(algo)
    logger.start(max_steps, int(counters["step"]))
    ledger = AsyncLedger(ledger_dir)
    ledger.truncate_after(int(counters["step"]))
    _evaluate = context_evaluator(ctx, make_store_evaluator)
    validate_at_start(counters, _evaluate, algo=algo, num_problems=len(val_problems), logger=logger)

    threads = int(acfg.torch_threads) or int(master_config.policy.torch_threads)
    rollout = RolloutGroup(
        policy, master_config, tokenizer=tokenizer, env=env,
        advantage_fn=GroupAdvantages.from_algorithm(algo),
        num_workers=int(acfg.num_rollout_workers), torch_threads=threads,
    )
    version = int(counters["step"])
    next_batch = version + 1
    loader_before: dict[int, dict[str, Any]] = {}
    batch_info: dict[int, dict[str, Any]] = {}

    def fill() -> None:
        """Dispatch every batch the staleness bound allows at the current version."""
        nonlocal next_batch
        while next_batch <= max_steps and next_batch <= version + 1 + max_staleness:
            loader_before[next_batch] = train_loader.state_dict()
            problems = list(train_loader.next_batch())
            batch_info[next_batch] = {
                "epoch": int(train_loader.epoch),
                "indices": list(train_loader.last_batch_indices),
                "version": version,
            }
            rollout.dispatch(next_batch, problems, sample_seeds(seed, next_batch, 0, len(problems) * group))
            next_batch += 1

    try:
        rollout.sync_weights(version)
        fill()
        policy.data_plane_step_metrics(1.0)
        t_window = time.perf_counter()
        while counters["step"] < max_steps:
            step = int(counters["step"]) + 1
            t_step = time.perf_counter()
            meta = rollout.claim_batch(
                step, per_step, poll_s=float(acfg.claim_poll_interval_s), timeout_s=float(acfg.claim_timeout_s)
            )
            t_claim = time.perf_counter() - t_step
            tags = meta.tags or []
            lags = [version - int(t[POLICY_VERSION]) for t in tags]
            try:
                stale = staleness_metrics(lags, max_staleness)
            except ValueError as exc:
                raise RuntimeError(f"grpo_train_async step {step}: {exc}") from exc
            rewards = _tag_tensor(tags, "reward", torch.float32)
            adv = _tag_tensor(tags, "advantage", torch.float32)
            sample_mask = _tag_tensor(tags, "sample_mask", torch.float32)
            t1 = time.perf_counter()
            policy.get_policy_and_reference_logprobs_from_meta(meta)
            t_lp = time.perf_counter() - t1
            if max_staleness == 0:
                loss_fn: Any = sync_loss
                fields: tuple[str, ...] = DP_TRAIN_FIELDS
            else:
                loss_fn = TruncatedISClippedPGLoss.from_algorithm(
                    algo, importance_ratio_cap=float(acfg.importance_ratio_cap), trainer_version=version
                )
                fields = (*DP_TRAIN_FIELDS, POLICY_VERSION)
            t2 = time.perf_counter()
            train_metrics = policy.train_from_meta(meta, loss_fn, train_fields=fields)
            t_train = time.perf_counter() - t2
            rollout.finish_batch(step)
            version = step
            t3 = time.perf_counter()
            rollout.sync_weights(version)
            fill()
            t_sync = time.perf_counter() - t3
            counters["step"] = step
            counters["consumed_samples"] += meta.size
            metrics: dict[str, Any] = {
                **{k: train_metrics[k] for k in PG_TRAIN_METRICS},
                "reward_mean": float(rewards.mean()),
                "train_reward_mean": float(rewards.mean()),
                **reward_part_means(_tag_parts(tags)),
                "advantage_abs_mean": float(adv.abs().mean()),
                "mean_response_length": float(_tag_tensor(tags, "response_length", torch.int32).float().mean()),
                "truncated_fraction": float(_tag_tensor(tags, "truncated", torch.bool).float().mean()),
                "sample_mask_mean": float(sample_mask.mean()),
                "dynamic_sampling_num_gen_batches": 1,
                "dynamic_sampling_num_discarded_valid_samples": 0,
                "consumed_samples": counters["consumed_samples"],
                "time/claim_wait_s": t_claim,
                "time/logprobs_s": t_lp,
                "time/train_s": t_train,
                "time/weight_sync_dispatch_s": t_sync,
            }
            if "is_weight" in train_metrics:
                metrics["async/is_weight_mean"] = train_metrics["is_weight"]
                metrics["async/is_truncated_fraction"] = train_metrics["is_truncated_fraction"]
            metrics.update(stale)
            if should_validate(step, val_period=int(algo.val_period), max_steps=max_steps):
                acc = record_validation(counters, metrics, _evaluate)
                logger.info(
                    f"step {step}: reward {metrics['reward_mean']:.3f}, loss {metrics['loss']:.4f}, "
                    f"held-out accuracy {acc:.3f}, generated {rollout.stats.generated} samples"
                )
            now = time.perf_counter()
            wall = now - t_window
            t_window = now
            window = rollout.stats.window()
            metrics.update(
                idle_metrics(
                    wall_s=wall,
                    claim_wait_s=window["claim_wait_s"],
                    rollout_busy_s=window["busy_s"],
                    num_rollout_workers=int(acfg.num_rollout_workers),
                    window={"rollout_gen_s": window["gen_s"], "rollout_put_s": window["put_s"], "step_wall_s": wall},
                )
            )
            metrics["async/samples_per_s"] = meta.size / wall
            metrics["async/generated_samples"] = rollout.stats.generated
            metrics["async/store_occupancy_rows"] = rollout.occupancy()
            metrics["async/in_flight_batches"] = len(rollout.in_flight_batches())
            metrics["async/policy_version"] = version
            metrics.update(policy.data_plane_step_metrics(time.perf_counter() - t_step))
            info = batch_info.pop(step)
            ledger.append(step, epoch=info["epoch"], indices=info["indices"], sample_ids=meta.sample_ids,
                          version=info["version"])
            logger.log_step(step, metrics)
            if checkpointer.should_save(step, final=step == max_steps):
                # The loader position before the first untrained batch: in-flight batches are
                # regenerated on resume instead of being skipped.
                resume_loader = loader_before.get(step + 1, train_loader.state_dict())
                in_flight = rollout.in_flight_batches()

                def _state() -> dict[str, Any]:
                    state = trainer_state("grpo", counters, policy.state_dict(), resume_loader)
                    state[ASYNC_STATE_KEY] = {"policy_version": version, "in_flight_batches": in_flight}
                    return state

                checkpointer.save(step, _state)
            for b in [b for b in loader_before if b <= step]:
                del loader_before[b]
    finally:
        rollout.shutdown()
    logger.close()
    return dict(counters)
