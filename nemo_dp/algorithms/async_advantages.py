"""The GRPO advantage estimator rollout actors apply to their shards (the functions ``grpo_sync`` uses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nemo_dp.algorithms.advantages import grpo_advantages, grpo_baseline_and_std

__all__ = ["GroupAdvantages"]


@dataclass(frozen=True)
class GroupAdvantages:
    """Picklable group-relative baselines, stds and advantages of contiguous whole groups."""

    group_size: int
    leave_one_out: bool
    normalize_rewards: bool

    @classmethod
    def from_algorithm(cls, algo: Any) -> GroupAdvantages:
        return cls(
            group_size=int(algo.num_generations_per_prompt),
            leave_one_out=bool(algo.use_leave_one_out_baseline),
            normalize_rewards=bool(algo.normalize_rewards),
        )

    def __call__(self, rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(baseline, std, advantages)`` of float ``[N]`` contiguous-group ``rewards``.

        Raises:
            ValueError: ``N`` is not a multiple of ``group_size``.
        """
        baseline, std = grpo_baseline_and_std(rewards, self.group_size, self.leave_one_out)
        return baseline, std, grpo_advantages(rewards, baseline, std, self.normalize_rewards)
