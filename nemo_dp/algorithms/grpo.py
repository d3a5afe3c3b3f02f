"""Legacy (in-memory) GRPO trainer: ``grpo_train(ctx)``.  Never imports the data plane."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.grpo_common import LogprobPlan
from nemo_dp.algorithms.grpo_step import StepRows, run_grpo
from nemo_dp.algorithms.trainer_common import DriverPathHooks
from nemo_dp.algorithms.rollout import rollout
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.utils.packed_tensor import IMAGE_FIELDS

__all__ = ["grpo_train", "LegacyGRPOPath", "GRPO_TRAIN_KEYS"]

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


class LegacyGRPOPath(DriverPathHooks):
    """GRPO's rows in driver memory: one ``BatchedDataDict`` per step (``carry is handle``)."""

    def __init__(self, policy: Any, tokenizer: Any, env: Any) -> None:
        self.policy, self.tokenizer, self.env = policy, tokenizer, env

    def rollout(self, problems: Sequence[Any], seeds: list[int], *, group: int, step: int, iteration: int) -> StepRows:
        out = rollout(
            self.policy, problems, tokenizer=self.tokenizer, env=self.env, group_size=group, seeds=seeds, greedy=False
        )
        return StepRows(out.batch, out.batch)

    def stamp(self, rows: StepRows, baseline: torch.Tensor, std: torch.Tensor) -> None:
        pass

    def keep(self, rows: StepRows, keep: list[int]) -> StepRows | None:
        if not keep:
            return None
        batch = rows.handle.select_indices(keep)
        return StepRows(batch, batch)

    def concat(self, first: StepRows, second: StepRows) -> StepRows:
        batch = BatchedDataDict.from_batches(
            [first.handle, second.handle], pad_value_dict={"input_ids": self.tokenizer.pad_id}
        )
        return StepRows(batch, batch)

    def head(self, rows: StepRows, n: int) -> StepRows:
        batch = rows.handle.slice(0, n)
        return StepRows(batch, batch)

    def response_lengths(self, rows: StepRows) -> torch.Tensor:
        return rows.handle["token_mask"].sum(1).float()

    def logprobs(
        self, rows: StepRows, advantages: torch.Tensor, sample_mask: torch.Tensor, plan: LogprobPlan
    ) -> BatchedDataDict:
        batch = rows.handle
        token_mask = batch["token_mask"]
        train_batch = BatchedDataDict(
            {
                "input_ids": batch["input_ids"],
                "input_lengths": batch["input_lengths"],
                "token_mask": token_mask,
                "sample_mask": sample_mask,
                "generation_logprobs": batch["generation_logprobs"],
                "advantages": advantages.unsqueeze(1) * token_mask.float(),
                **{k: batch[k] for k in IMAGE_FIELDS if k in batch},
            }
        )
        if not plan.reuse_train_forward:
            train_batch["prev_logprobs"] = self.policy.get_logprobs(train_batch)["logprobs"]
        if plan.reference:
            train_batch["reference_policy_logprobs"] = self.policy.get_reference_policy_logprobs(train_batch)[
                "reference_logprobs"
            ]
        return train_batch

    def train(self, rows: StepRows, train_input: BatchedDataDict, loss_fn: Any, plan: LogprobPlan) -> dict[str, Any]:
        train_batch = train_input
        keys = [k for k in GRPO_TRAIN_KEYS if k not in plan.skipped_fields]
        keys += [k for k in IMAGE_FIELDS if k in train_batch]
        return self.policy.train(BatchedDataDict({k: train_batch[k] for k in keys}), loss_fn)


def grpo_train(ctx: TrainContext) -> dict[str, Any]:
    """Run GRPO for ``algorithm.max_steps`` steps with the batch in driver memory (``ctx.policy`` a plain ``Policy``).

    Raises:
        ValueError: Dynamic sampling exhausted ``max_gen_batches``.
    """
    return run_grpo(ctx, LegacyGRPOPath(ctx.policy, ctx.tokenizer, ctx.env))
