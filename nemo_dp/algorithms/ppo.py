"""Legacy (in-memory) PPO trainer: ``ppo_train(ctx)``.  Never imports the data plane."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.grpo_step import StepRows
from nemo_dp.algorithms.ppo_common import PPO_POLICY_TRAIN_KEYS, PPO_VALUE_TRAIN_KEYS, make_value
from nemo_dp.algorithms.ppo_step import TARGET_INPUTS, run_ppo
from nemo_dp.algorithms.rollout import rollout
from nemo_dp.algorithms.trainer_common import DriverPathHooks
from nemo_dp.distributed.batched_data_dict import BatchedDataDict

__all__ = ["ppo_train", "LegacyPPOPath"]


class LegacyPPOPath(DriverPathHooks):
    """PPO's rows in driver memory: the rollout batch plus a training ``BatchedDataDict``."""

    def __init__(self, policy: Any, value: Any, tokenizer: Any, env: Any) -> None:
        self.policy, self.value, self.tokenizer, self.env = policy, value, tokenizer, env

    def rollout(self, problems: Sequence[Any], seeds: list[int], *, group: int, step: int) -> StepRows:
        batch = rollout(
            self.policy, problems, tokenizer=self.tokenizer, env=self.env, group_size=group, seeds=seeds, greedy=False
        ).batch
        return StepRows(batch, batch)

    def forward(self, rows: StepRows, sample_mask: torch.Tensor) -> BatchedDataDict:
        batch = rows.handle
        data = BatchedDataDict(
            {
                "input_ids": batch["input_ids"],
                "input_lengths": batch["input_lengths"],
                "token_mask": batch["token_mask"],
                "sample_mask": sample_mask,
                "generation_logprobs": batch["generation_logprobs"],
            }
        )
        data["prev_logprobs"] = self.policy.get_logprobs(data)["logprobs"]
        data["reference_policy_logprobs"] = self.policy.get_reference_policy_logprobs(data)["reference_logprobs"]
        data["values"] = self.value.get_values(data)["values"]
        return data

    def target_inputs(self, rows: StepRows, data: BatchedDataDict) -> Mapping[str, torch.Tensor]:
        return {k: data[k] for k in TARGET_INPUTS}

    def set_targets(
        self, rows: StepRows, data: BatchedDataDict, advantages: torch.Tensor, returns: torch.Tensor,
        sample_mask: torch.Tensor,
    ) -> None:
        data["advantages"] = advantages
        data["returns"] = returns

    def train_epoch(
        self, rows: StepRows, data: BatchedDataDict, order: list[int], policy_loss_fn: Any, value_loss_fn: Any
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        shuffled = data.select_indices(order)
        policy_batch = BatchedDataDict({k: shuffled[k] for k in PPO_POLICY_TRAIN_KEYS})
        value_batch = BatchedDataDict({k: shuffled[k] for k in PPO_VALUE_TRAIN_KEYS})
        return self.policy.train(policy_batch, policy_loss_fn), self.value.train(value_batch, value_loss_fn)

    def finish(self, rows: StepRows) -> None:
        pass


def ppo_train(ctx: TrainContext) -> dict[str, Any]:
    """Run PPO for ``algorithm.max_steps`` steps with in-memory batches (``ctx.policy`` a plain ``Policy``)."""
    value = make_value(ctx.cfg, ctx.tokenizer)
    try:
        ctx.hooks.model_built("value", value)
        return run_ppo(ctx, value, LegacyPPOPath(ctx.policy, value, ctx.tokenizer, ctx.env))
    finally:
        value.shutdown()
