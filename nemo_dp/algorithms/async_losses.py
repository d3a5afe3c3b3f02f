"""Off-policy correction for asynchronous GRPO: a truncated importance weight on stale samples.

A lag-0 sample gets weight 1, so the loss equals ``ClippedPGLossFn``'s bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from nemo_dp.algorithms.loss_functions import ClippedPGLossFn
from nemo_dp.models.policy.rollout_worker import POLICY_VERSION

__all__ = ["POLICY_VERSION", "TruncatedISClippedPGLoss", "truncated_importance_weights"]



def truncated_importance_weights(
    prev_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    lag: torch.Tensor,
    cap: float,
) -> torch.Tensor:
    """Per-token ``min(exp(prev - gen), cap)`` for rows with ``lag > 0``, exactly 1 for fresh ones (no gradient).

    Raises:
        ValueError: On a negative lag or a cap below 1.
    """
    if cap < 1.0:
        raise ValueError(f"truncated_importance_weights: cap must be >= 1, got {cap}")
    if bool((lag < 0).any()):
        raise ValueError(f"truncated_importance_weights: negative policy lag {lag.tolist()}")
    with torch.no_grad():
        ratio = torch.exp(prev_logprobs.float() - generation_logprobs.float()).clamp(max=float(cap))
        stale = (lag > 0).unsqueeze(1)
        return torch.where(stale, ratio, torch.ones_like(ratio))


class TruncatedISClippedPGLoss(ClippedPGLossFn):
    """``ClippedPGLossFn`` with the policy-gradient term re-weighted on stale samples.

    ``trainer_version`` is the trainer's policy version for this step.

    Raises:
        ValueError: On bad clip/KL values, a cap below 1 or a negative version.
    """

    def __init__(
        self, ratio_clip_min: float, ratio_clip_max: float, reference_policy_kl_penalty: float, token_level_loss: bool,
        *, importance_ratio_cap: float, trainer_version: int,
    ) -> None:
        super().__init__(ratio_clip_min, ratio_clip_max, reference_policy_kl_penalty, token_level_loss)
        if importance_ratio_cap < 1.0:
            raise ValueError(f"TruncatedISClippedPGLoss: importance_ratio_cap must be >= 1, got {importance_ratio_cap}")
        if trainer_version < 0:
            raise ValueError(f"TruncatedISClippedPGLoss: trainer_version must be >= 0, got {trainer_version}")
        self.importance_ratio_cap = float(importance_ratio_cap)
        self.trainer_version = int(trainer_version)

    def _extra_keys(self) -> tuple[str, ...]:
        return ("generation_logprobs", POLICY_VERSION)

    def _pg_weight(self, mb: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The truncated importance weight of each token.

        Raises:
            ValueError: A row's version is newer than the trainer's.
        """
        lag = self.trainer_version - mb[POLICY_VERSION].to(torch.long)
        if bool((lag < 0).any()):
            raise ValueError(
                f"{type(self).__name__}: sample policy_version {mb[POLICY_VERSION].tolist()} newer "
                f"than the trainer's version {self.trainer_version}"
            )
        return truncated_importance_weights(
            mb["prev_logprobs"], mb["generation_logprobs"], lag, self.importance_ratio_cap
        )

    def _weight_metrics(
        self, reduce: Callable[[torch.Tensor], torch.Tensor], weight: torch.Tensor
    ) -> dict[str, float]:
        return {
            "is_weight": float(reduce(weight)),
            "is_truncated_fraction": float(reduce((weight >= self.importance_ratio_cap).float())),
        }
