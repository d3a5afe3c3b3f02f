"""Data-plane GRPO trainer ``grpo_train_sync``: ``grpo_step.run_grpo`` with the rows in the store.

The driver holds metas and a small per-row carry; a failed step drops its partition.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.grpo_common import LogprobPlan
from nemo_dp.algorithms.grpo_step import StepRows, run_grpo
from nemo_dp.algorithms.store_eval import StorePathHooks, check_sync_entry
from nemo_dp.data_plane.interfaces import KVBatchMeta
from nemo_dp.data_plane.schema import ADVANTAGES, DP_TRAIN_FIELDS, SAMPLE_MASK, TAG_BASELINE, TAG_STD
from nemo_dp.distributed.batched_data_dict import BatchedDataDict

__all__ = ["grpo_train_sync", "StoreGRPOPath", "TRAINER_TARGET"]

#: This trainer's registry entry in ``nemo_dp.config.trainer_lookup.TRAINER_REGISTRY``.
TRAINER_TARGET = "nemo_dp.algorithms.grpo_sync:grpo_train_sync"


class StoreGRPOPath(StorePathHooks):
    """GRPO's rows in the data plane (``policy`` a ``TQPolicy``; ``logger`` for the store line, or ``None``)."""

    def __init__(self, policy: Any, tokenizer: Any, env: Any, logger: Any = None) -> None:
        self.policy, self.tokenizer, self.env, self.logger = policy, tokenizer, env, logger

    def start_run(self) -> None:
        # Start the per-step store-metrics window here (drops pre-run traffic; no-op when off).
        self.policy.data_plane_step_metrics(1.0)

    def begin_step(self, num_samples: int, group_size: int) -> None:
        self.policy.prepare_step(num_samples=num_samples, group_size=group_size)

    def rollout(self, problems: Sequence[Any], seeds: list[int], *, group: int, step: int, iteration: int) -> StepRows:
        return self._rollout(problems, seeds, group, f"s{step}_b{iteration}")

    def stamp(self, rows: StepRows, baseline: torch.Tensor, std: torch.Tensor) -> None:
        rows.handle.stamp_tags({TAG_STD: std, TAG_BASELINE: baseline})

    def keep(self, rows: StepRows, keep: list[int]) -> StepRows | None:
        meta: KVBatchMeta = rows.handle
        kept = set(keep)
        self.policy.discard_samples([sid for i, sid in enumerate(meta.sample_ids) if i not in kept])
        return StepRows(meta.subset(keep), rows.carry.select_indices(keep)) if keep else None

    def concat(self, first: StepRows, second: StepRows) -> StepRows:
        return StepRows(first.handle.concat(second.handle), BatchedDataDict.from_batches([first.carry, second.carry]))

    def head(self, rows: StepRows, n: int) -> StepRows:
        self.policy.discard_samples(rows.handle.sample_ids[n:])
        return StepRows(rows.handle.slice(0, n), rows.carry.slice(0, n))

    def response_lengths(self, rows: StepRows) -> torch.Tensor:
        return rows.carry["response_lengths"].float()

    def logprobs(
        self, rows: StepRows, advantages: torch.Tensor, sample_mask: torch.Tensor, plan: LogprobPlan
    ) -> dict[str, torch.Tensor]:
        meta = rows.handle
        if not plan.reuse_train_forward and plan.reference:
            self.policy.get_policy_and_reference_logprobs_from_meta(meta)
        elif not plan.reuse_train_forward:
            self.policy.get_logprobs_from_meta(meta)
        elif plan.reference:
            self.policy.get_reference_policy_logprobs_from_meta(meta)
        return {ADVANTAGES: advantages, SAMPLE_MASK: sample_mask}

    def train(
        self, rows: StepRows, train_input: dict[str, torch.Tensor], loss_fn: Any, plan: LogprobPlan
    ) -> dict[str, Any]:
        fields = tuple(f for f in DP_TRAIN_FIELDS if f not in plan.skipped_fields)
        metrics = self.policy.train_from_meta(rows.handle, loss_fn, train_fields=fields, row_values=train_input)
        self.policy.finish_step(rows.handle)
        return metrics

    def step_metrics(self, step: int, step_s: float) -> dict[str, Any]:
        # Per-step store metrics (empty unless data_plane.observability.enabled).
        store_metrics = self.policy.data_plane_step_metrics(step_s)
        if store_metrics and self.logger is not None:
            self.logger.info(
                f"step {step}: data plane {store_metrics['data_plane/step/wall_ms']:.0f} ms "
                f"({100 * store_metrics['data_plane/step/frac_of_step']:.1f}% of step), "
                f"written {store_metrics['data_plane/step/bytes_written_mb']:.4f} MB, "
                f"read {store_metrics['data_plane/step/bytes_read_mb']:.4f} MB, "
                f"outstanding {store_metrics['data_plane/now/bytes_outstanding_mb']:.4f} MB"
            )
        return store_metrics


def grpo_train_sync(ctx: TrainContext) -> dict[str, Any]:
    """Run GRPO over the data plane: ``grpo_train``'s checkpoints and metrics (plus ``data_plane/*`` when observed).

    ``ctx.policy`` must be a ``TQPolicy`` from ``make_policy_factory``.

    Raises:
        ValueError: The config does not select this trainer, the policy is not a data-plane
            policy, or dynamic sampling exhausted ``max_gen_batches``.
    """
    check_sync_entry(ctx.policy, ctx.cfg, TRAINER_TARGET, "nemo_dp.algorithms.grpo:grpo_train")
    return run_grpo(ctx, StoreGRPOPath(ctx.policy, ctx.tokenizer, ctx.env, ctx.logger))
