"""The PPO critic's loss (``values[:, t]`` aligned with ``prev_logprobs[:, t]`` by :func:`align_values`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from nemo_dp.algorithms.loss_functions import GlobalLoss
from nemo_dp.models.token_ops import align_values

__all__ = ["align_values", "ClippedValueLossFn"]


class ClippedValueLossFn(GlobalLoss):
    """Clipped value loss of PPO over ``global_valid_tokens``.

    Per token: ``v_clip = v_old + clamp(v - v_old, -value_clip, value_clip)``,
    ``loss_t = 0.5 * max((v - R)^2, (v_clip - R)^2)``.  Metrics also give ``value_loss`` (the same),
    ``value_clip_fraction``, ``value_pred_mean`` and ``value_abs_error``.

    Raises:
        ValueError: If ``value_clip <= 0``.
    """

    def __init__(self, value_clip: float) -> None:
        if not value_clip > 0:
            raise ValueError(f"ClippedValueLossFn: value_clip must be > 0, got {value_clip}")
        self.value_clip = float(value_clip)

    def _keys(self) -> tuple[str, ...]:
        return ("token_mask", "sample_mask", "values", "returns")

    def _compute(
        self, logits: torch.Tensor, mb: Mapping[str, torch.Tensor], mask: torch.Tensor, tokens: float, seqs: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of the value head's raw ``[b, s]`` output (``logits``).

        Raises:
            ValueError: The head's output does not match ``returns``' width.
        """
        pred = align_values(logits)
        if pred.shape != mb["returns"].shape:
            raise ValueError(
                f"{type(self).__name__}: value-head output {tuple(logits.shape)} does not match returns "
                f"{tuple(mb['returns'].shape)}"
            )
        old = mb["values"].float()
        ret = mb["returns"].float()
        clipped = old + (pred - old).clamp(-self.value_clip, self.value_clip)
        err_unclipped = (pred - ret) ** 2
        err_clipped = (clipped - ret) ** 2
        token_loss = 0.5 * torch.maximum(err_unclipped, err_clipped)
        loss = (token_loss * mask).sum() / tokens
        with torch.no_grad():
            share = float(loss)
            metrics = {
                "loss": share,
                "value_loss": share,
                "value_clip_fraction": float(((err_clipped > err_unclipped).float() * mask).sum() / tokens),
                "value_pred_mean": float((pred * mask).sum() / tokens),
                "value_abs_error": float(((pred - ret).abs() * mask).sum() / tokens),
            }
        return loss, metrics
