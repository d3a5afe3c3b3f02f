"""Group-relative (GRPO) baselines and advantages; a prompt's samples are ``group_size`` contiguous rows."""

from __future__ import annotations

import torch


def grpo_baseline_and_std(
    rewards: torch.Tensor, group_size: int, leave_one_out: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample baseline (group mean, or with ``leave_one_out`` the mean of the others) and group std.

    The std is the unbiased std of the whole group, whatever the baseline (a leave-one-out std would
    be 0 for a lone success and blow its advantage up); 0 for groups of one or of equal rewards.

    Raises:
        ValueError: On a bad shape or group size.
    """
    if rewards.dim() != 1:
        raise ValueError(f"grpo_baseline_and_std: rewards must be 1-D, got shape {tuple(rewards.shape)}")
    if group_size < 1:
        raise ValueError(f"grpo_baseline_and_std: group_size must be >= 1, got {group_size}")
    n = rewards.shape[0]
    if n % group_size != 0:
        raise ValueError(f"grpo_baseline_and_std: {n} rewards are not a multiple of group_size={group_size}")
    if leave_one_out and group_size < 2:
        raise ValueError("grpo_baseline_and_std: leave_one_out needs group_size >= 2, got 1")
    groups = rewards.float().view(-1, group_size)
    total = groups.sum(dim=1, keepdim=True)
    baseline = (total - groups) / (group_size - 1) if leave_one_out else (total / group_size).expand_as(groups)
    if group_size >= 2:
        std = groups.std(dim=1, unbiased=True, keepdim=True).expand_as(groups)
    else:
        std = torch.zeros_like(groups)
    return baseline.reshape(n).clone(), std.reshape(n).clone()


def grpo_advantages(
    rewards: torch.Tensor, baseline: torch.Tensor, std: torch.Tensor, normalize_std: bool, eps: float = 1e-6
) -> torch.Tensor:
    """Float32 advantages ``rewards - baseline``, divided by ``std + eps`` when ``normalize_std``.

    Groups of equal rewards get zero advantage with either baseline.

    Raises:
        ValueError: If the shapes differ.
    """
    if rewards.shape != baseline.shape or rewards.shape != std.shape:
        raise ValueError(
            f"grpo_advantages: shapes differ: rewards {tuple(rewards.shape)}, baseline "
            f"{tuple(baseline.shape)}, std {tuple(std.shape)}"
        )
    adv = rewards.float() - baseline.float()
    if normalize_std:
        adv = adv / (std.float() + eps)
    return adv
