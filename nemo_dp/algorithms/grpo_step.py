"""The one synchronous GRPO step over either batch path: driver memory (``grpo.LegacyGRPOPath``) or
the data plane (``grpo_sync.StoreGRPOPath``).  Never imports the data plane.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from nemo_dp.algorithms.advantages import grpo_advantages, grpo_baseline_and_std
from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.grpo_common import PG_TRAIN_METRICS, LogprobPlan, logprob_plan, start_grpo_phase
from nemo_dp.algorithms.loss_functions import ClippedPGLossFn
from nemo_dp.algorithms.trainer_common import (
    finish_step,
    open_step_loop,
    rollout_shape,
    sample_seeds,
    step_time_metrics,
    trainer_state,
)
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.environments.weighted import reward_part_means
from nemo_dp.models.token_ops import rollout_sample_mask

__all__ = ["StepRows", "GRPOBatchPath", "collect_grpo_rows", "run_grpo"]


@dataclass
class StepRows:
    """A step's rows: ``handle`` (``BatchedDataDict`` or ``KVBatchMeta``) and a per-row ``carry``."""

    handle: Any
    carry: BatchedDataDict

    @property
    def size(self) -> int:
        return int(self.handle.size)


class GRPOBatchPath(Protocol):
    """What the GRPO step asks of the place its rows live.

    ``start_run`` is called once before the first step, ``begin_step`` before a step's first rollout,
    ``end_step`` after a step, also when it failed.  ``rollout`` samples ``group`` responses per problem
    (one seed each) and scores them; ``stamp`` records the group baselines and stds with the rows;
    ``keep`` and ``head`` drop the other rows (``keep`` returns ``None`` when empty).  ``logprobs``
    computes what ``plan`` asks for and returns the input of ``train`` (``policy.train``'s result);
    ``step_metrics`` are logged with the step's.
    """

    def make_evaluator(self, ctx: TrainContext) -> Callable[[], float]: ...
    def start_run(self) -> None: ...
    def begin_step(self, num_samples: int, group_size: int) -> None: ...
    def end_step(self) -> None: ...
    def rollout(
        self, problems: Sequence[Any], seeds: list[int], *, group: int, step: int, iteration: int
    ) -> StepRows: ...
    def stamp(self, rows: StepRows, baseline: torch.Tensor, std: torch.Tensor) -> None: ...
    def keep(self, rows: StepRows, keep: list[int]) -> StepRows | None: ...
    def concat(self, first: StepRows, second: StepRows) -> StepRows: ...
    def head(self, rows: StepRows, n: int) -> StepRows: ...
    def response_lengths(self, rows: StepRows) -> torch.Tensor: ...
    def logprobs(
        self, rows: StepRows, advantages: torch.Tensor, sample_mask: torch.Tensor, plan: LogprobPlan
    ) -> Any: ...
    def train(self, rows: StepRows, train_input: Any, loss_fn: Any, plan: LogprobPlan) -> dict[str, Any]: ...
    def step_metrics(self, step: int, step_s: float) -> dict[str, Any]: ...


def collect_grpo_rows(
    path: GRPOBatchPath, master_config: Any, *, train_loader: Any, step: int
) -> tuple[StepRows, dict[str, Any]]:
    """Roll out until one step's batch is complete (with dynamic sampling when enabled).

    Returns:
        ``(rows, info)``: ``num_prompts_per_step x num_generations_per_prompt`` rows carrying
        ``rewards``, ``baseline`` and ``std``; ``info`` holds the unfiltered rewards (cut to the batch
        size), ``num_gen_batches`` and ``num_discarded_valid_samples``.

    Raises:
        ValueError: Dynamic sampling reached ``max_gen_batches``.
    """
    algo = master_config.algorithm
    group = int(algo.num_generations_per_prompt)
    target = int(algo.num_prompts_per_step) * group
    ds = algo.dynamic_sampling
    pending: StepRows | None = None
    unfiltered: list[torch.Tensor] = []
    num_gen = 0
    discarded = 0
    while True:
        problems = train_loader.next_batch()
        seeds = sample_seeds(int(master_config.seed), step, num_gen, len(problems) * group)
        iteration = num_gen
        num_gen += 1
        rows: StepRows | None = path.rollout(problems, seeds, group=group, step=step, iteration=iteration)
        assert rows is not None
        rewards = rows.carry["rewards"]
        baseline, std = grpo_baseline_and_std(rewards, group, bool(algo.use_leave_one_out_baseline))
        rows.carry["baseline"] = baseline
        rows.carry["std"] = std
        path.stamp(rows, baseline, std)
        unfiltered.append(rewards)
        if bool(ds.enabled):
            rows = path.keep(rows, [i for i, s in enumerate(std.tolist()) if s != 0.0])
        if rows is not None:
            pending = rows if pending is None else path.concat(pending, rows)
        if not bool(ds.enabled):
            break
        have = 0 if pending is None else pending.size
        if have >= target:
            if have > target:
                assert pending is not None
                discarded = have - target
                pending = path.head(pending, target)
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


def run_grpo(ctx: TrainContext, path: GRPOBatchPath) -> dict[str, Any]:
    """Run GRPO for ``algorithm.max_steps`` steps with the rows on ``path`` (start as :func:`start_grpo_phase`).

    Raises:
        ValueError: Dynamic sampling exhausted ``max_gen_batches``.
    """
    policy, master_config, train_loader, logger = ctx.policy, ctx.cfg, ctx.train_loader, ctx.logger
    algo = master_config.algorithm
    max_steps, group, per_step = rollout_shape(algo)
    counters = start_grpo_phase(ctx)
    plan = logprob_plan(master_config)
    loss_fn = ClippedPGLossFn.from_algorithm(algo, prev_logprobs_from_forward=plan.reuse_train_forward)
    evaluate = open_step_loop(ctx, path, counters, max_steps)
    while counters["step"] < max_steps:
        step = int(counters["step"]) + 1
        t_step = time.perf_counter()
        path.begin_step(per_step, group)
        try:
            t0 = time.perf_counter()
            rows, info = collect_grpo_rows(path, master_config, train_loader=train_loader, step=step)
            t_gen = time.perf_counter() - t0
            carry = rows.carry
            adv = grpo_advantages(carry["rewards"], carry["baseline"], carry["std"], bool(algo.normalize_rewards))
            sample_mask = rollout_sample_mask(carry["truncated"], overlong_filtering=bool(algo.overlong_filtering))
            t1 = time.perf_counter()
            train_input = path.logprobs(rows, adv, sample_mask, plan)
            t_lp = time.perf_counter() - t1
            t2 = time.perf_counter()
            train_metrics = path.train(rows, train_input, loss_fn, plan)
            t_train = time.perf_counter() - t2
        finally:
            path.end_step()
        counters["step"] = step
        counters["consumed_samples"] += rows.size
        metrics: dict[str, Any] = {
            **{k: train_metrics[k] for k in PG_TRAIN_METRICS},
            "reward_mean": float(info["unfiltered_rewards"].mean()),
            "train_reward_mean": float(carry["rewards"].mean()),
            "advantage_abs_mean": float(adv.abs().mean()),
            "mean_response_length": float(path.response_lengths(rows).mean()),
            "truncated_fraction": float(carry["truncated"].float().mean()),
            "sample_mask_mean": float(sample_mask.mean()),
            "dynamic_sampling_num_gen_batches": info["num_gen_batches"],
            "dynamic_sampling_num_discarded_valid_samples": info["num_discarded_valid_samples"],
            **step_time_metrics(counters, (t_gen, t_lp, t_train)),
            **reward_part_means(carry),
            "prev_logprobs_source": plan.prev_logprobs_source,
        }
        finish_step(
            ctx, step, max_steps, metrics, counters, evaluate,
            lambda: path.step_metrics(step, time.perf_counter() - t_step),
            lambda: trainer_state("grpo", counters, policy.state_dict(), train_loader.state_dict()),
        )
    logger.close()
    return dict(counters)
