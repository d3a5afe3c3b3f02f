"""What the legacy and data-plane PPO trainers share: critic, phase start, shuffles, targets, metrics."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.gae import compute_gae, explained_variance, masked_mean, masked_whiten, token_level_rewards
from nemo_dp.algorithms.trainer_common import rollout_shape, start_counters, step_time_metrics
from nemo_dp.distributed.worker_group import RayCluster
from nemo_dp.models.value.value import Value, critic_config

__all__ = [
    "PPO_POLICY_TRAIN_KEYS",
    "PPO_VALUE_TRAIN_KEYS",
    "PPOTargets",
    "compute_ppo_targets",
    "epoch_permutation",
    "make_value",
    "ppo_step_metrics",
    "start_ppo_phase",
]

#: Fields ``policy.train`` receives (same names as the data plane's ``DP_TRAIN_FIELDS``).
PPO_POLICY_TRAIN_KEYS: tuple[str, ...] = (
    "input_ids",
    "input_lengths",
    "generation_logprobs",
    "prev_logprobs",
    "reference_policy_logprobs",
    "advantages",
    "token_mask",
    "sample_mask",
)
#: Fields ``value.train`` receives (same names as the data plane's ``DP_VALUE_TRAIN_FIELDS``).
PPO_VALUE_TRAIN_KEYS: tuple[str, ...] = ("input_ids", "input_lengths", "token_mask", "sample_mask", "values", "returns")


def epoch_permutation(seed: int, step: int, epoch: int, n: int) -> list[int]:
    """The row order of one PPO epoch: a permutation of ``range(n)``, a pure function of (seed, step, epoch).

    Both trainers, a resumed run and any DP size use the same order.
    """
    gen = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(step)) * 1_009 + int(epoch))
    return [int(i) for i in torch.randperm(n, generator=gen).tolist()]


@dataclass
class PPOTargets:
    """Advantages, returns and diagnostics of one PPO batch (``[B, S]`` float32).

    Attributes:
        advantages: GAE advantages (whitened when configured), 0 off the mask.
        kl: Per-token ``prev_logprobs - reference_policy_logprobs`` on the mask.
        mask: ``token_mask * sample_mask`` as float.
        width: The canonical width (through the last trained column) metrics are reduced over.
    """

    advantages: torch.Tensor
    returns: torch.Tensor
    token_rewards: torch.Tensor
    kl: torch.Tensor
    mask: torch.Tensor
    width: int


def compute_ppo_targets(
    algo: Any,
    *,
    scores: torch.Tensor,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    prev_logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    values: torch.Tensor,
) -> PPOTargets:
    """Token-level rewards, GAE advantages and returns for one batch (``scores``, ``sample_mask``: ``[B]``).

    Raises:
        ValueError: No trained token in the whole batch, or mismatched shapes.
    """
    full_width = token_mask.shape[1]
    columns = {"prev_logprobs": prev_logprobs, "reference_logprobs": reference_logprobs, "values": values}
    for name, t in columns.items():
        if t.shape != token_mask.shape:
            raise ValueError(f"PPO targets: {name} has shape {tuple(t.shape)}, token_mask {tuple(token_mask.shape)}")
    mask = token_mask.float() * sample_mask.float().unsqueeze(1)
    if float(mask.sum()) <= 0:
        raise ValueError(
            "PPO: the batch has no trained token (every row masked out by sample_mask / algorithm.overlong_filtering)"
        )
    # Compute at one canonical width (through the last trained column), whatever padding the
    # caller's tensors carry (legacy batch width vs. the data plane's pad target), so that both
    # trainers reduce exactly the same tensors and agree bit for bit.
    width = int(torch.nonzero(mask.sum(0) > 0).max()) + 1
    m = mask[:, :width]
    rewards, kl = token_level_rewards(
        scores, m, prev_logprobs[:, :width], reference_logprobs[:, :width], float(algo.kl_coef)
    )
    adv, ret = compute_gae(rewards, values[:, :width], m, float(algo.gamma), float(algo.lam))
    if bool(algo.whiten_advantages):
        adv = masked_whiten(adv, m)

    def widen(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, full_width - width)).contiguous()

    return PPOTargets(
        advantages=widen(adv), returns=widen(ret), token_rewards=widen(rewards), kl=widen(kl), mask=mask, width=width
    )


def _mean_over_epochs(per_epoch: Sequence[Mapping[str, Any]], key: str) -> float:
    return float(sum(float(m[key]) for m in per_epoch) / len(per_epoch))


def ppo_step_metrics(
    *,
    scores: torch.Tensor,
    targets: PPOTargets,
    values: torch.Tensor,
    token_mask: torch.Tensor,
    truncated: torch.Tensor,
    sample_mask: torch.Tensor,
    policy_epochs: Sequence[Mapping[str, Any]],
    value_epochs: Sequence[Mapping[str, Any]],
    counters: Mapping[str, Any],
    timings: tuple[float, float, float],
    reward_parts: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The step's metrics, identical in both trainers.

    Training metrics are averaged over the epochs; ``explained_variance`` compares the rollout's
    values with the returns they produced.
    """
    w = targets.width
    mask = targets.mask[:, :w]
    values = values[:, :w]
    returns = targets.returns[:, :w]
    out: dict[str, Any] = {
        "loss": _mean_over_epochs(policy_epochs, "loss"),
        "pg_loss": _mean_over_epochs(policy_epochs, "pg_loss"),
        "kl_penalty": _mean_over_epochs(policy_epochs, "kl_penalty"),
        "clip_fraction": _mean_over_epochs(policy_epochs, "clip_fraction"),
        "grad_norm": _mean_over_epochs(policy_epochs, "grad_norm"),
        "lr": float(policy_epochs[-1]["lr"]),
        "value_loss": _mean_over_epochs(value_epochs, "value_loss"),
        "value_clip_fraction": _mean_over_epochs(value_epochs, "value_clip_fraction"),
        "value_grad_norm": _mean_over_epochs(value_epochs, "grad_norm"),
        "value_lr": float(value_epochs[-1]["lr"]),
        "explained_variance": explained_variance(values, returns, mask),
        "reward_mean": float(scores.float().mean()),
        "kl_mean": float(masked_mean(targets.kl[:, :w], mask)),
        "returns_mean": float(masked_mean(returns, mask)),
        "values_mean": float(masked_mean(values, mask)),
        "advantage_abs_mean": float(masked_mean(targets.advantages[:, :w].abs(), mask)),
        "mean_response_length": float(token_mask[:, :w].float().sum(1).mean()),
        "truncated_fraction": float(truncated.float().mean()),
        "sample_mask_mean": float(sample_mask.float().mean()),
        **(reward_parts or {}),
    }
    for k, (pm, vm) in enumerate(zip(policy_epochs, value_epochs)):
        out[f"policy_loss_epoch{k}"] = float(pm["loss"])
        out[f"value_loss_epoch{k}"] = float(vm["value_loss"])
    out.update(step_time_metrics(counters, timings))
    return out


def start_ppo_phase(ctx: TrainContext, value: Any) -> dict[str, Any]:
    """Fresh start or resume of both models; returns the trainer counters.

    A fresh run freezes the policy as the reference, starts fresh optimizers and (when
    ``algorithm.value.init_from_policy``) copies the policy's trunk into the critic.
    """
    policy, master_config = ctx.policy, ctx.cfg
    algo = master_config.algorithm
    counters = start_counters(ctx, "ppo", restore_extra=lambda state: value.load_state_dict(state["value"]))
    if ctx.start_state is not None:
        return counters
    policy.snapshot_reference_policy()
    max_steps, _, rows = rollout_shape(algo)
    # Each model's optimizer steps over the phase (the horizon of a cosine schedule).
    steps = max_steps * int(algo.ppo_epochs) * (rows // int(master_config.policy.train_global_batch_size))
    policy.reset_optimizer(float(master_config.policy.optimizer.lr), decay_steps=steps)
    if bool(algo.value.init_from_policy):
        value.init_trunk_from(policy.state_dict()["weights"]["model"])
    value.reset_optimizer(float(algo.value.lr), decay_steps=steps)
    return counters


def make_value(master_config: Any, tokenizer: Any, *, value_factory: Callable[..., Any] = Value) -> Any:
    """Build the critic with ``value_factory`` (``Value`` or a callable taking its keyword arguments)."""
    return value_factory(
        cluster=RayCluster(),
        config=critic_config(master_config.policy, master_config.algorithm.value),
        vocab_size=tokenizer.vocab_size,
        pad_id=tokenizer.pad_id,
        eos_id=tokenizer.eos_id,
        seed=int(master_config.seed),
    )
