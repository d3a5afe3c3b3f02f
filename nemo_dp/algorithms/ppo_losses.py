"""The PPO critic's loss and the alignment of value-head outputs with tokens.

The loss follows the ``LossFn`` protocol (normalised by the global valid-token count).
:func:`align_values` shifts the head output one column right so ``values[:, t]`` lines up with
``prev_logprobs[:, t]``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from nemo_dp.models.token_ops import align_values

__all__ = ["align_values", "ClippedValueLossFn"]


class ClippedValueLossFn:
    """Clipped value loss of PPO, normalised by the global valid-token count.

    Per token, with ``v`` the aligned prediction, ``v_old`` the rollout's ``values`` and ``R``
    the GAE ``returns``: ``v_clip = v_old + clamp(v - v_old, -value_clip, value_clip)`` and
    ``loss_t = 0.5 * max((v - R)^2, (v_clip - R)^2)``.  The token losses of valid tokens
    (``token_mask * sample_mask``) are summed and divided by ``global_valid_tokens``.

    Args:
        value_clip: Clip range of the value update (> 0).

    Raises:
        ValueError: If ``value_clip <= 0``.
    """

    def __init__(self, value_clip: float) -> None:
        if not value_clip > 0:
            raise ValueError(f"ClippedValueLossFn: value_clip must be > 0, got {value_clip}")
        self.value_clip = float(value_clip)

    def __call__(
        self,
        logits: torch.Tensor,
        mb: Mapping[str, torch.Tensor],
        global_valid_tokens: float,
        global_valid_seqs: float,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Compute this micro-batch's share of the global value loss.

        Args:
            logits: The value head's raw output ``[b, s]`` for the micro-batch (the protocol's
                first argument; not logits for a critic).
            mb: Needs ``token_mask``, ``sample_mask``, ``values`` (rollout values, aligned) and
                ``returns``.
            global_valid_tokens: Valid tokens of the global batch (> 0).
            global_valid_seqs: Valid sequences of the global batch (> 0).

        Returns:
            The loss and additive metrics (shares of the global mean): ``loss``,
            ``value_loss`` (same value), ``value_clip_fraction`` (share of tokens where the
            clipped term is the larger one), ``value_pred_mean``, ``value_abs_error``, plus raw
            ``num_valid_tokens`` and ``num_valid_seqs``.

        Raises:
            ValueError: Non-positive global counts or a width mismatch.
            KeyError: A required key is missing from ``mb``.
        """
        name = "ClippedValueLossFn"
        if global_valid_tokens <= 0:
            raise ValueError(f"{name}: global_valid_tokens must be > 0, got {global_valid_tokens}")
        if global_valid_seqs <= 0:
            raise ValueError(f"{name}: global_valid_seqs must be > 0, got {global_valid_seqs}")
        for key in ("token_mask", "sample_mask", "values", "returns"):
            if key not in mb:
                raise KeyError(f"{name}: micro-batch lacks key {key!r} (has {sorted(mb)})")
        pred = align_values(logits)
        if pred.shape != mb["returns"].shape:
            raise ValueError(
                f"{name}: value-head output {tuple(logits.shape)} does not match returns "
                f"{tuple(mb['returns'].shape)}"
            )
        mask = mb["token_mask"].float() * mb["sample_mask"].float().unsqueeze(1)
        old = mb["values"].float()
        ret = mb["returns"].float()
        clipped = old + (pred - old).clamp(-self.value_clip, self.value_clip)
        err_unclipped = (pred - ret) ** 2
        err_clipped = (clipped - ret) ** 2
        token_loss = 0.5 * torch.maximum(err_unclipped, err_clipped)
        loss = (token_loss * mask).sum() / global_valid_tokens
        with torch.no_grad():
            share = float(loss)
            metrics = {
                "loss": share,
                "value_loss": share,
                "value_clip_fraction": float(
                    ((err_clipped > err_unclipped).float() * mask).sum() / global_valid_tokens
                ),
                "value_pred_mean": float((pred * mask).sum() / global_valid_tokens),
                "value_abs_error": float(((pred - ret).abs() * mask).sum() / global_valid_tokens),
                "num_valid_tokens": float(mask.sum()),
                "num_valid_seqs": float(
                    (mb["sample_mask"].float() * (mask.sum(1) > 0).float()).sum()
                ),
            }
        return loss, metrics
