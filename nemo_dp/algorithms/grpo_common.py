"""The GRPO step tail both GRPO trainers share: step metrics and the held-out evaluation.

``grpo_train`` (in-memory) and ``grpo_train_sync`` (data plane) differ only in where the
batch lives; once a step has trained, both hand the same tensors here, so their records and
log lines cannot drift apart (their exact equality is tested end to end).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from nemo_dp.algorithms.context import PhaseLogger
from nemo_dp.algorithms.trainer_common import record_validation, should_validate

__all__ = ["finish_grpo_step_metrics"]


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
    val_period: int,
    max_steps: int,
    evaluate: Callable[[], float],
    logger: PhaseLogger,
    reward_parts: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The step's metrics, with the held-out evaluation when it is due.

    Args:
        step: The step just trained.
        train_metrics: ``policy.train`` / ``train_from_meta`` result.
        info: The collector's info (``unfiltered_rewards``, ``num_gen_batches``,
            ``num_discarded_valid_samples``).
        train_rewards: float ``[B]`` rewards of the rows trained on.
        advantages: float ``[B]`` per-row advantages.
        response_lengths: float ``[B]`` response lengths (tokens, eos included).
        truncated: ``[B]`` rows without eos.
        sample_mask: float ``[B]``.
        counters: The trainer counters (``consumed_samples`` is recorded; validation sets
            ``val_accuracy``).
        timings: Seconds spent in generation, log-probs and training.
        val_period: ``algorithm.val_period``.
        max_steps: The phase's last step.
        evaluate: Held-out evaluation returning accuracy.
        logger: For the validation line.
        reward_parts: Each reward's mean over the rows trained on (``reward/<fn>``), when
            ``env.rewards`` lists several.

    Returns:
        The step's metrics.
    """
    t_gen, t_lp, t_train = timings
    rewards = info["unfiltered_rewards"]
    metrics: dict[str, Any] = {
        "loss": train_metrics["loss"],
        "pg_loss": train_metrics["pg_loss"],
        "kl_penalty": train_metrics["kl_penalty"],
        "clip_fraction": train_metrics["clip_fraction"],
        "grad_norm": train_metrics["grad_norm"],
        "lr": train_metrics["lr"],
        "reward_mean": float(rewards.mean()),
        "train_reward_mean": float(train_rewards.mean()),
        "advantage_abs_mean": float(advantages.abs().mean()),
        "mean_response_length": float(response_lengths.mean()),
        "truncated_fraction": float(truncated.float().mean()),
        "sample_mask_mean": float(sample_mask.mean()),
        "dynamic_sampling_num_gen_batches": info["num_gen_batches"],
        "dynamic_sampling_num_discarded_valid_samples": info["num_discarded_valid_samples"],
        "consumed_samples": counters["consumed_samples"],
        "time/generation_s": t_gen,
        "time/logprobs_s": t_lp,
        "time/train_s": t_train,
        **(reward_parts or {}),
    }
    if should_validate(step, val_period=val_period, max_steps=max_steps):
        acc = record_validation(counters, metrics, evaluate)
        logger.info(
            f"step {step}: reward {metrics['reward_mean']:.3f}, loss {metrics['loss']:.4f}, "
            f"held-out accuracy {acc:.3f}"
        )
    return metrics
