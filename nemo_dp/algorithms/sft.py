"""Legacy (in-memory) SFT trainer: ``sft_train(ctx)``.  Never imports the data plane."""

from __future__ import annotations

from typing import Any

from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.sft_step import run_sft
from nemo_dp.algorithms.trainer_common import DriverPathHooks, save_if_due, trainer_state
from nemo_dp.data.datasets import collate_sft

__all__ = ["sft_train", "LegacySFTPath"]


class LegacySFTPath(DriverPathHooks):
    """SFT batches collated on the driver and sent with the train call (``ctx.train_loader`` yields global batches)."""

    def __init__(self, ctx: TrainContext) -> None:
        self.policy, self.train_loader, self.tokenizer = ctx.policy, ctx.train_loader, ctx.tokenizer
        self.max_seq_len = int(ctx.cfg.policy.model.max_seq_len)

    def restore(self, state: dict[str, Any]) -> None:
        pass

    def prepare(self, ctx: TrainContext, next_batch: int) -> None:
        pass

    def train_step(self, batch_index: int, loss_fn: Any) -> tuple[dict[str, Any], int, dict[str, Any]]:
        examples = self.train_loader.next_batch()
        batch = collate_sft(examples, self.tokenizer, max_seq_len=self.max_seq_len)
        return self.policy.train(batch, loss_fn), len(examples), {}

    def save_if_due(self, ctx: TrainContext, step: int, max_steps: int, counters: dict[str, Any]) -> None:
        save_if_due(
            ctx.checkpointer,
            step,
            max_steps,
            lambda: trainer_state("sft", counters, self.policy.state_dict(), self.train_loader.state_dict()),
        )

    def close(self) -> None:
        pass


def sft_train(ctx: TrainContext) -> dict[str, Any]:
    """Run SFT for ``algorithm.max_steps`` steps (``ctx.policy`` a plain ``Policy``, global-batch loader)."""
    return run_sft(ctx, LegacySFTPath(ctx))
