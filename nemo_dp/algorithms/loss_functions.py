"""Loss functions for SFT and GRPO, normalised by global (whole-batch) counts.

Summing micro-batch losses over ranks gives exactly the full-batch mean whatever the DP size or
micro-batching; returned metrics are additive (each is this micro-batch's share).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from nemo_dp.models.protocol import LossFn
from nemo_dp.models.token_ops import token_logprobs_from_logits

__all__ = ["ClippedPGLossFn", "GlobalLoss", "LossFn", "NLLLoss", "global_valid_counts"]


def _valid_counts(mask: torch.Tensor, sample_mask: torch.Tensor) -> tuple[float, float]:
    return float(mask.sum()), float((sample_mask.float() * (mask.sum(1) > 0).float()).sum())


class GlobalLoss:
    """A ``LossFn`` normalised by the global batch's counts.

    ``__call__`` checks counts and keys, hands the mask ``token_mask * sample_mask`` to :meth:`_compute`
    and adds ``num_valid_tokens`` and ``num_valid_seqs`` to its metrics.
    """

    def __call__(
        self, logits: torch.Tensor, mb: Mapping[str, torch.Tensor], global_valid_tokens: float, global_valid_seqs: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """This micro-batch's share of the global loss, and its metrics.

        Raises:
            ValueError: Non-positive global counts, or as :meth:`_compute`.
            KeyError: A required key is missing from ``mb``.
        """
        name = type(self).__name__
        if global_valid_tokens <= 0:
            raise ValueError(f"{name}: global_valid_tokens must be > 0, got {global_valid_tokens}")
        if global_valid_seqs <= 0:
            raise ValueError(f"{name}: global_valid_seqs must be > 0, got {global_valid_seqs}")
        for key in self._keys():
            if key not in mb:
                raise KeyError(f"{name}: micro-batch lacks key {key!r} (has {sorted(mb)})")
        mask = mb["token_mask"].float() * mb["sample_mask"].float().unsqueeze(1)
        loss, metrics = self._compute(logits, mb, mask, global_valid_tokens, global_valid_seqs)
        metrics["num_valid_tokens"], metrics["num_valid_seqs"] = _valid_counts(mask, mb["sample_mask"])
        return loss, metrics

    def _keys(self) -> tuple[str, ...]:
        """The micro-batch keys the loss reads."""
        raise NotImplementedError

    def _compute(
        self, logits: torch.Tensor, mb: Mapping[str, torch.Tensor], mask: torch.Tensor, tokens: float, seqs: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss and its metrics, from checked arguments and the valid-token ``mask``."""
        raise NotImplementedError


class NLLLoss(GlobalLoss):
    """Next-token negative log-likelihood on response tokens of used rows, over ``global_valid_tokens``.

    It reads log-probs only on ``token_mask`` (``reads_masked_logprobs_only``).
    """

    reads_masked_logprobs_only: bool = True

    def _keys(self) -> tuple[str, ...]:
        return ("input_ids", "token_mask", "sample_mask")

    def _compute(
        self, logits: torch.Tensor, mb: Mapping[str, torch.Tensor], mask: torch.Tensor, tokens: float, seqs: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        logp = token_logprobs_from_logits(logits, mb["input_ids"])
        loss = -(logp * mask).sum() / tokens
        return loss, {"loss": float(loss.detach())}


class ClippedPGLossFn(GlobalLoss):
    """PPO-style clipped policy-gradient loss with a k3 KL penalty to the reference policy.

    Per token: ``ratio = exp(logp - prev_logprobs)``,
    ``pg = -min(ratio * A, clip(ratio, 1 - ratio_clip_min, 1 + ratio_clip_max) * A)``,
    ``kl = exp(ref - logp) - (ref - logp) - 1``, loss ``= pg + reference_policy_kl_penalty * kl``;
    normalised by ``global_valid_tokens`` (``token_level_loss``) or by ``global_valid_seqs`` over
    per-sequence means.  With ``prev_logprobs_from_forward`` the forward's own detached log-probs
    serve as ``prev_logprobs``.  Metrics: ``loss``, ``pg_loss``, ``kl_penalty`` (before the
    coefficient), ``clip_fraction``, ``probs_ratio``.

    Raises:
        ValueError: On negative clip epsilons or KL coefficient.
    """

    reads_masked_logprobs_only: bool = True

    def __init__(
        self, ratio_clip_min: float, ratio_clip_max: float, reference_policy_kl_penalty: float, token_level_loss: bool,
        *, prev_logprobs_from_forward: bool = False,
    ) -> None:
        for name, value in (
            ("ratio_clip_min", ratio_clip_min),
            ("ratio_clip_max", ratio_clip_max),
            ("reference_policy_kl_penalty", reference_policy_kl_penalty),
        ):
            if value < 0:
                raise ValueError(f"ClippedPGLossFn: {name} must be >= 0, got {value}")
        self.ratio_clip_min = ratio_clip_min
        self.ratio_clip_max = ratio_clip_max
        self.reference_policy_kl_penalty = reference_policy_kl_penalty
        self.token_level_loss = token_level_loss
        self.prev_logprobs_from_forward = prev_logprobs_from_forward

    @classmethod
    def from_algorithm(cls, algo: Any, **kwargs: Any) -> ClippedPGLossFn:
        """The loss a GRPO / PPO ``algorithm`` node's ``loss`` section configures; ``kwargs`` go to ``cls`` too."""
        loss_cfg = algo.loss
        return cls(
            float(loss_cfg.ratio_clip_min),
            float(loss_cfg.ratio_clip_max),
            float(loss_cfg.reference_policy_kl_penalty),
            bool(loss_cfg.token_level_loss),
            **kwargs,
        )

    def _keys(self) -> tuple[str, ...]:
        prev = () if self.prev_logprobs_from_forward else ("prev_logprobs",)
        ref = ("reference_policy_logprobs",) if self.reference_policy_kl_penalty > 0 else ()
        return ("input_ids", "token_mask", "sample_mask", "advantages", *prev, *self._extra_keys(), *ref)

    def _compute(
        self, logits: torch.Tensor, mb: Mapping[str, torch.Tensor], mask: torch.Tensor, tokens: float, seqs: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        weight = self._pg_weight(mb)
        logp = token_logprobs_from_logits(logits, mb["input_ids"])
        adv = mb["advantages"].float()
        prev = logp.detach() if self.prev_logprobs_from_forward else mb["prev_logprobs"].float()
        # Off the mask the two log-probs may come from passes that kept different columns (0
        # for a skipped prompt column): exponentiate only the masked ones, so an unmasked
        # difference can never overflow into inf * 0 = NaN.
        on = mask > 0
        ratio = torch.exp(torch.where(on, logp - prev, 0.0))
        clipped = ratio.clamp(1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)
        pg_unclipped = -ratio * adv
        pg_clipped = -clipped * adv
        pg = torch.maximum(pg_unclipped, pg_clipped)
        if weight is not None:
            pg = pg * weight
        if self.reference_policy_kl_penalty > 0:
            log_r = torch.where(on, mb["reference_policy_logprobs"].float() - logp, 0.0)
            kl = torch.exp(log_r) - log_r - 1.0
        else:
            kl = torch.zeros_like(logp)
        token_loss = pg + self.reference_policy_kl_penalty * kl
        clip_active = (pg_clipped > pg_unclipped).float()

        def reduce(x: torch.Tensor) -> torch.Tensor:
            if self.token_level_loss:
                return (x * mask).sum() / tokens
            per_seq = (x * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            return per_seq.sum() / seqs

        loss = reduce(token_loss)
        with torch.no_grad():
            metrics = {
                "loss": float(loss),
                "pg_loss": float(reduce(pg)),
                "kl_penalty": float(reduce(kl)),
                "clip_fraction": float(reduce(clip_active)),
                "probs_ratio": float(reduce(ratio)),
                **({} if weight is None else self._weight_metrics(reduce, weight)),
            }
        return loss, metrics

    def _extra_keys(self) -> tuple[str, ...]:
        """Extra micro-batch keys of a subclass."""
        return ()

    def _pg_weight(self, mb: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        """A per-token weight of the policy-gradient term of a subclass, or ``None``."""
        return None

    def _weight_metrics(
        self, reduce: Callable[[torch.Tensor], torch.Tensor], weight: torch.Tensor
    ) -> dict[str, float]:
        """Additive metrics of a subclass's ``_pg_weight``."""
        return {}


def global_valid_counts(token_mask: torch.Tensor, sample_mask: torch.Tensor) -> tuple[float, float]:
    """``(valid_tokens, valid_seqs)`` of a global batch: the normalisers the losses expect."""
    return _valid_counts(token_mask.float() * sample_mask.float().unsqueeze(1), sample_mask)
