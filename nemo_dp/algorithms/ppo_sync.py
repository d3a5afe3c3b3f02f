"""Data-plane PPO trainer ``ppo_train_sync``: ``ppo_step.run_ppo`` with the per-token tensors in the store.

The driver reads only the columns the advantages need and writes the targets back.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.grpo_step import StepRows
from nemo_dp.algorithms.ppo_common import make_value
from nemo_dp.algorithms.ppo_step import run_ppo
from nemo_dp.algorithms.store_eval import StorePathHooks, check_sync_entry
from nemo_dp.data_plane.schema import (
    ADVANTAGES,
    DP_TRAIN_FIELDS,
    DP_VALUE_TRAIN_FIELDS,
    PPO_VALUE_FIELDS,
    PREV_LOGPROBS,
    REFERENCE_POLICY_LOGPROBS,
    RETURNS,
    SAMPLE_MASK,
    TOKEN_MASK,
    VALUES,
)
from nemo_dp.models.value.tq_value import TQValue

__all__ = ["ppo_train_sync", "StorePPOPath", "TRAINER_TARGET"]

#: This trainer's registry entry in ``nemo_dp.config.trainer_lookup.TRAINER_REGISTRY``.
TRAINER_TARGET = "nemo_dp.algorithms.ppo_sync:ppo_train_sync"

#: Per-token columns the driver reads back for the advantage.
_TARGET_READ_FIELDS: tuple[str, ...] = (TOKEN_MASK, PREV_LOGPROBS, REFERENCE_POLICY_LOGPROBS, VALUES)


class StorePPOPath(StorePathHooks):
    """PPO's rows in the data plane (``policy`` a ``TQPolicy``, ``value`` the ``TQValue`` sharing it)."""

    def __init__(self, policy: Any, value: Any, tokenizer: Any, env: Any) -> None:
        self.policy, self.value, self.tokenizer, self.env = policy, value, tokenizer, env

    def start_run(self) -> None:
        # Start the per-step store-metrics windows here (drops pre-run traffic; no-op when off).
        self.policy.data_plane_step_metrics(1.0)
        self.value.data_plane_worker_metrics(1.0)

    def begin_step(self, num_samples: int) -> None:
        self.policy.prepare_step(num_samples=num_samples, extra_fields=PPO_VALUE_FIELDS)

    def rollout(self, problems: Sequence[Any], seeds: list[int], *, group: int, step: int) -> StepRows:
        return self._rollout(problems, seeds, group, f"s{step}")

    def forward(self, rows: StepRows, sample_mask: torch.Tensor) -> None:
        self.policy.get_policy_and_reference_logprobs_from_meta(rows.handle)
        self.value.get_values_from_meta(rows.handle)

    def target_inputs(self, rows: StepRows, data: None) -> Mapping[str, torch.Tensor]:
        cols = self.policy.read_from_dataplane(rows.handle, select_fields=list(_TARGET_READ_FIELDS))
        return {
            "token_mask": cols[TOKEN_MASK],
            "prev_logprobs": cols[PREV_LOGPROBS],
            "reference_policy_logprobs": cols[REFERENCE_POLICY_LOGPROBS],
            "values": cols[VALUES],
        }

    def set_targets(
        self, rows: StepRows, data: None, advantages: torch.Tensor, returns: torch.Tensor, sample_mask: torch.Tensor
    ) -> None:
        # Everything the driver computes goes back in one put; the forward passes never read
        # the mask (the rollout's all-ones column stands until here).
        targets = {ADVANTAGES: advantages, RETURNS: returns, SAMPLE_MASK: sample_mask}
        self.policy.write_to_dataplane(rows.handle, targets)

    def train_epoch(
        self, rows: StepRows, data: None, order: list[int], policy_loss_fn: Any, value_loss_fn: Any
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        epoch_meta = rows.handle.subset(order)
        policy_metrics = self.policy.train_from_meta(epoch_meta, policy_loss_fn, train_fields=DP_TRAIN_FIELDS)
        value_metrics = self.value.train_from_meta(epoch_meta, value_loss_fn, train_fields=DP_VALUE_TRAIN_FIELDS)
        return policy_metrics, value_metrics

    def finish(self, rows: StepRows) -> None:
        self.policy.finish_step(rows.handle)

    def step_metrics(self, step_s: float) -> dict[str, Any]:
        return {**self.policy.data_plane_step_metrics(step_s), **self.value.data_plane_worker_metrics(step_s)}


def ppo_train_sync(ctx: TrainContext) -> dict[str, Any]:
    """Run PPO over the data plane: ``ppo_train``'s checkpoints and metrics; the ``TQValue`` critic lives for the call.

    ``ctx.policy`` must be a ``TQPolicy`` from ``make_policy_factory``.

    Raises:
        ValueError: The config does not select this trainer or the policy is not a data-plane policy.
    """
    check_sync_entry(ctx.policy, ctx.cfg, TRAINER_TARGET, "nemo_dp.algorithms.ppo:ppo_train")
    value = make_value(ctx.cfg, ctx.tokenizer, value_factory=functools.partial(TQValue.from_policy, ctx.policy))
    try:
        ctx.hooks.model_built("value", value)
        return run_ppo(ctx, value, StorePPOPath(ctx.policy, value, ctx.tokenizer, ctx.env))
    finally:
        value.shutdown()
