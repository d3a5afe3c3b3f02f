"""What the GRPO trainers share: the log-prob plan, phase start and step metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.trainer_common import rollout_shape, start_counters

__all__ = [
    "PG_TRAIN_METRICS",
    "TRAIN_FORWARD",
    "SEPARATE_FORWARD",
    "LogprobPlan",
    "logprob_plan",
    "start_grpo_phase",
]

#: The policy-training metrics a GRPO step reports as they come from ``train`` / ``train_from_meta``.
PG_TRAIN_METRICS = ("loss", "pg_loss", "kl_penalty", "clip_fraction", "grad_norm", "lr")

#: ``prev_logprobs_source`` of a step whose ``prev_logprobs`` came from the training forward.
TRAIN_FORWARD = "train_forward"
#: ``prev_logprobs_source`` of a step that ran a separate no-grad log-prob forward.
SEPARATE_FORWARD = "separate_forward"


@dataclass(frozen=True)
class LogprobPlan:
    """Which log-prob forwards a GRPO step runs before training.

    Attributes:
        reuse_train_forward: ``prev_logprobs`` are the training forward's own (detached).
        reference: The reference policy's log-probs are computed (KL coefficient > 0).
    """

    reuse_train_forward: bool
    reference: bool

    @property
    def prev_logprobs_source(self) -> str:
        """:data:`TRAIN_FORWARD` or :data:`SEPARATE_FORWARD`."""
        return TRAIN_FORWARD if self.reuse_train_forward else SEPARATE_FORWARD

    @property
    def skipped_fields(self) -> frozenset[str]:
        """Training inputs this plan does not compute."""
        skipped = {"prev_logprobs"} if self.reuse_train_forward else set()
        if not self.reference:
            skipped.add("reference_policy_logprobs")
        return frozenset(skipped)


def logprob_plan(master_config: Any) -> LogprobPlan:
    """The log-prob plan of a synchronous GRPO run.

    With ``algorithm.reuse_train_forward_logprobs`` and a rollout of exactly one optimizer step,
    the training forward's log-probs replace the separate forward (same weights, same numbers).
    """
    algo = master_config.algorithm
    per_step = int(algo.num_prompts_per_step) * int(algo.num_generations_per_prompt)
    one_step = per_step == int(master_config.policy.train_global_batch_size)
    return LogprobPlan(
        reuse_train_forward=bool(algo.reuse_train_forward_logprobs) and one_step,
        reference=float(algo.loss.reference_policy_kl_penalty) > 0,
    )


def start_grpo_phase(
    ctx: TrainContext, restore_extra: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """The counters of a GRPO phase (:func:`start_counters`).

    A fresh run freezes the current weights as the reference policy and starts a fresh optimizer
    at ``policy.optimizer.lr`` (after an SFT warm start this makes the warm-started model the reference).
    """
    cfg = ctx.cfg
    max_steps, _, per_step = rollout_shape(cfg.algorithm)
    counters = start_counters(ctx, "grpo", restore_extra)
    if ctx.start_state is None:
        ctx.policy.snapshot_reference_policy()
        optimizer_steps = max_steps * (per_step // int(cfg.policy.train_global_batch_size))
        ctx.policy.reset_optimizer(float(cfg.policy.optimizer.lr), decay_steps=optimizer_steps)
    return counters

