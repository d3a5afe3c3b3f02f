"""What the GRPO trainers share: the log-prob plan, phase start and step metrics."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from nemo_dp.algorithms.context import PhaseLogger, TrainContext
from nemo_dp.algorithms.trainer_common import rollout_shape, start_counters, step_time_metrics, validate_if_due

__all__ = [
    "PG_TRAIN_METRICS",
    "TRAIN_FORWARD",
    "SEPARATE_FORWARD",
    "LogprobPlan",
    "logprob_plan",
    "start_grpo_phase",
    "finish_grpo_step_metrics",
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
    counters = start_counters(
        ctx.start_state, algorithm="grpo", policy=ctx.policy, train_loader=ctx.train_loader, logger=ctx.logger,
        restore_extra=restore_extra,
    )
    if ctx.start_state is None:
        ctx.policy.snapshot_reference_policy()
        optimizer_steps = max_steps * (per_step // int(cfg.policy.train_global_batch_size))
        ctx.policy.reset_optimizer(float(cfg.policy.optimizer.lr), decay_steps=optimizer_steps)
    return counters


def finish_grpo_step_metrics(
    step: int,
    train_metrics: Mapping[str, Any],
    *,
    info: Mapping[str, Any],
    train_rewards: torch.Tensor,
    advantages: torch.Tensor,
    response_lengths: torch.Tensor,
    truncated: torch.Tensor,
    sample_mask: torch.Tensor,
    counters: dict[str, Any],
    timings: tuple[float, float, float],
    prev_logprobs_source: str,
    val_period: int,
    max_steps: int,
    evaluate: Callable[[], float],
    logger: PhaseLogger,
    reward_parts: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The step's metrics, with the held-out evaluation when it is due.

    Args:
        info: The collector's info (``unfiltered_rewards``, ``num_gen_batches``,
            ``num_discarded_valid_samples``).
        train_rewards, advantages, response_lengths, sample_mask: float ``[B]`` of the rows trained on.
        truncated: ``[B]`` rows without eos.
        reward_parts: Each reward's mean (``reward/<fn>``) when ``env.rewards`` lists several.
    """
    rewards = info["unfiltered_rewards"]
    metrics: dict[str, Any] = {
        **{k: train_metrics[k] for k in PG_TRAIN_METRICS},
        "reward_mean": float(rewards.mean()),
        "train_reward_mean": float(train_rewards.mean()),
        "advantage_abs_mean": float(advantages.abs().mean()),
        "mean_response_length": float(response_lengths.mean()),
        "truncated_fraction": float(truncated.float().mean()),
        "sample_mask_mean": float(sample_mask.mean()),
        "dynamic_sampling_num_gen_batches": info["num_gen_batches"],
        "dynamic_sampling_num_discarded_valid_samples": info["num_discarded_valid_samples"],
        **step_time_metrics(counters, timings),
        **(reward_parts or {}),
        "prev_logprobs_source": prev_logprobs_source,
    }
    validate_if_due(step, metrics, counters, evaluate, val_period=val_period, max_steps=max_steps, logger=logger)
    return metrics
