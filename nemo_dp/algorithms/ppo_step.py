"""The one PPO step over either batch path: driver memory (``ppo.LegacyPPOPath``) or the data
plane (``ppo_sync.StorePPOPath``).  Never imports the data plane.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.grpo_step import StepRows
from nemo_dp.algorithms.loss_functions import ClippedPGLossFn
from nemo_dp.algorithms.ppo_common import compute_ppo_targets, epoch_permutation, ppo_step_metrics, start_ppo_phase
from nemo_dp.algorithms.ppo_losses import ClippedValueLossFn
from nemo_dp.algorithms.trainer_common import finish_step, open_step_loop, rollout_shape, sample_seeds, trainer_state
from nemo_dp.environments.weighted import reward_part_means
from nemo_dp.models.token_ops import rollout_sample_mask

__all__ = ["PPOBatchPath", "TARGET_INPUTS", "run_ppo"]

#: The per-token columns the GAE targets and the step metrics read, by name.
TARGET_INPUTS: tuple[str, ...] = ("token_mask", "prev_logprobs", "reference_policy_logprobs", "values")


class PPOBatchPath(Protocol):
    """What the PPO step asks of the place its rows live.

    The hooks are :class:`~nemo_dp.algorithms.grpo_step.GRPOBatchPath`'s.  ``forward`` runs the policy,
    reference and value forwards and returns the training data handle; ``target_inputs`` gives its
    :data:`TARGET_INPUTS` columns; ``set_targets`` attaches targets and sample mask for training;
    ``train_epoch`` trains the policy, then the critic, on the rows in ``order``; ``finish`` is called
    after a step's training succeeded.
    """

    def make_evaluator(self, ctx: TrainContext) -> Callable[[], float]: ...
    def start_run(self) -> None: ...
    def begin_step(self, num_samples: int) -> None: ...
    def end_step(self) -> None: ...
    def rollout(self, problems: Sequence[Any], seeds: list[int], *, group: int, step: int) -> StepRows: ...
    def forward(self, rows: StepRows, sample_mask: torch.Tensor) -> Any: ...
    def target_inputs(self, rows: StepRows, data: Any) -> Mapping[str, torch.Tensor]: ...
    def set_targets(
        self, rows: StepRows, data: Any, advantages: torch.Tensor, returns: torch.Tensor, sample_mask: torch.Tensor
    ) -> None: ...
    def train_epoch(
        self, rows: StepRows, data: Any, order: list[int], policy_loss_fn: Any, value_loss_fn: Any
    ) -> tuple[dict[str, Any], dict[str, Any]]: ...
    def finish(self, rows: StepRows) -> None: ...
    def step_metrics(self, step_s: float) -> dict[str, Any]: ...


def run_ppo(ctx: TrainContext, value: Any, path: PPOBatchPath) -> dict[str, Any]:
    """Run PPO for ``algorithm.max_steps`` steps with the rows on ``path`` (``value``: the caller's critic)."""
    policy, master_config, train_loader, logger = ctx.policy, ctx.cfg, ctx.train_loader, ctx.logger
    algo = master_config.algorithm
    max_steps, group, per_step = rollout_shape(algo)
    counters = start_ppo_phase(ctx, value)
    policy_loss_fn = ClippedPGLossFn.from_algorithm(algo)
    value_loss_fn = ClippedValueLossFn(float(algo.value.value_clip))
    evaluate = open_step_loop(ctx, path, counters, max_steps)
    while counters["step"] < max_steps:
        step = int(counters["step"]) + 1
        t_step = time.perf_counter()
        path.begin_step(per_step)
        try:
            t0 = time.perf_counter()
            problems = train_loader.next_batch()
            seeds = sample_seeds(int(master_config.seed), step, 0, len(problems) * group)
            rows = path.rollout(problems, seeds, group=group, step=step)
            carry = rows.carry
            t_gen = time.perf_counter() - t0
            sample_mask = rollout_sample_mask(carry["truncated"], overlong_filtering=bool(algo.overlong_filtering))
            t1 = time.perf_counter()
            data = path.forward(rows, sample_mask)
            t_fwd = time.perf_counter() - t1
            cols = path.target_inputs(rows, data)
            targets = compute_ppo_targets(
                algo,
                scores=carry["rewards"],
                token_mask=cols["token_mask"],
                sample_mask=sample_mask,
                prev_logprobs=cols["prev_logprobs"],
                reference_logprobs=cols["reference_policy_logprobs"],
                values=cols["values"],
            )
            path.set_targets(rows, data, targets.advantages, targets.returns, sample_mask)
            t2 = time.perf_counter()
            policy_epochs, value_epochs = [], []
            for epoch in range(int(algo.ppo_epochs)):
                order = epoch_permutation(int(master_config.seed), step, epoch, rows.size)
                policy_metrics, value_metrics = path.train_epoch(rows, data, order, policy_loss_fn, value_loss_fn)
                policy_epochs.append(policy_metrics)
                value_epochs.append(value_metrics)
            t_train = time.perf_counter() - t2
            path.finish(rows)
        finally:
            path.end_step()
        counters["step"] = step
        counters["consumed_samples"] += rows.size
        metrics = ppo_step_metrics(
            scores=carry["rewards"],
            reward_parts=reward_part_means(carry),
            targets=targets,
            values=cols["values"],
            token_mask=cols["token_mask"],
            truncated=carry["truncated"],
            sample_mask=sample_mask,
            policy_epochs=policy_epochs,
            value_epochs=value_epochs,
            counters=counters,
            timings=(t_gen, t_fwd, t_train),
        )
        finish_step(
            ctx, step, max_steps, metrics, counters, evaluate,
            lambda: path.step_metrics(time.perf_counter() - t_step),
            lambda: trainer_state(
                "ppo", counters, policy_state=policy.state_dict(), value_state=value.state_dict(),
                loader_state=train_loader.state_dict(),
            ),
            detail=lambda: (
                f"value loss {metrics['value_loss']:.4f}, explained variance {metrics['explained_variance']:.3f}, "
            ),
        )
    logger.close()
    return dict(counters)
