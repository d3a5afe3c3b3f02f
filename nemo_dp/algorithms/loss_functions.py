"""Loss functions for SFT and GRPO, normalised by global (whole-batch) counts.

Every loss divides by the valid-token (or sequence) count of the global batch, so summing
micro-batch losses over ranks gives exactly the full-batch mean whatever the DP size or
micro-batching.  Returned metrics are additive: each is this micro-batch's share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import torch

from nemo_dp.models.token_ops import token_logprobs_from_logits


class LossFn(Protocol):
    """Signature shared by all loss functions."""

    def __call__(
        self,
        logits: torch.Tensor,
        mb: Mapping[str, torch.Tensor],
        global_valid_tokens: float,
        global_valid_seqs: float,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


def _check_counts(name: str, global_valid_tokens: float, global_valid_seqs: float) -> None:
    if global_valid_tokens <= 0:
        raise ValueError(f"{name}: global_valid_tokens must be > 0, got {global_valid_tokens}")
    if global_valid_seqs <= 0:
        raise ValueError(f"{name}: global_valid_seqs must be > 0, got {global_valid_seqs}")


def _require(name: str, mb: Mapping[str, torch.Tensor], keys: tuple[str, ...]) -> None:
    for key in keys:
        if key not in mb:
            raise KeyError(f"{name}: micro-batch lacks key {key!r} (has {sorted(mb)})")


def _valid_mask(mb: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return mb["token_mask"].float() * mb["sample_mask"].float().unsqueeze(1)


class NLLLoss:
    """Next-token negative log-likelihood on response tokens (``token_mask``) of used rows.

    loss = -sum(logp * token_mask * sample_mask) / global_valid_tokens.
    Metrics: ``loss`` (share of the global mean), ``num_valid_tokens``, ``num_valid_seqs``.

    ``reads_masked_logprobs_only``: the loss reads log-probs only where ``token_mask`` is set,
    so the worker computes logits from one position before the first such token.
    """

    reads_masked_logprobs_only: bool = True

    def __call__(
        self,
        logits: torch.Tensor,
        mb: Mapping[str, torch.Tensor],
        global_valid_tokens: float,
        global_valid_seqs: float,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        _check_counts("NLLLoss", global_valid_tokens, global_valid_seqs)
        _require("NLLLoss", mb, ("input_ids", "token_mask", "sample_mask"))
        logp = token_logprobs_from_logits(logits, mb["input_ids"])
        mask = _valid_mask(mb)
        loss = -(logp * mask).sum() / global_valid_tokens
        metrics = {
            "loss": float(loss.detach()),
            "num_valid_tokens": float(mask.sum()),
            "num_valid_seqs": float((mb["sample_mask"].float() * (mask.sum(1) > 0).float()).sum()),
        }
        return loss, metrics


class ClippedPGLossFn:
    """PPO-style clipped policy-gradient loss with a k3 KL penalty to the reference policy.

    Per token: ``ratio = exp(logp - prev_logprobs)``,
    ``pg = -min(ratio * A, clip(ratio, 1 - ratio_clip_min, 1 + ratio_clip_max) * A)``,
    ``kl = exp(ref - logp) - (ref - logp) - 1``, loss ``= pg + reference_policy_kl_penalty * kl``;
    normalised by ``global_valid_tokens`` (``token_level_loss``) or by ``global_valid_seqs`` over
    per-sequence means.  With ``prev_logprobs_from_forward`` the forward's own detached log-probs
    serve as ``prev_logprobs`` (exact when the rollout is one optimizer step).  Reads log-probs
    only on ``token_mask`` (``reads_masked_logprobs_only``).

    Args:
        ratio_clip_min: Lower clip epsilon (ratio clipped at ``1 - ratio_clip_min``).
        ratio_clip_max: Upper clip epsilon (ratio clipped at ``1 + ratio_clip_max``).
        reference_policy_kl_penalty: KL coefficient (>= 0).
        token_level_loss: Token-level (True) or sequence-level (False) normalisation.
        prev_logprobs_from_forward: Take ``prev_logprobs`` from the forward (see above).

    Raises:
        ValueError: On negative clip epsilons or KL coefficient.
    """

    reads_masked_logprobs_only: bool = True

    def __init__(
        self,
        ratio_clip_min: float,
        ratio_clip_max: float,
        reference_policy_kl_penalty: float,
        token_level_loss: bool,
        *,
        prev_logprobs_from_forward: bool = False,
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

    def __call__(
        self,
        logits: torch.Tensor,
        mb: Mapping[str, torch.Tensor],
        global_valid_tokens: float,
        global_valid_seqs: float,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Compute this micro-batch's share of the global loss.

        Args:
            logits: ``[b, s, V]`` for the micro-batch.
            mb: Needs input_ids, token_mask, sample_mask, advantages, prev_logprobs (unless
                ``prev_logprobs_from_forward``), and reference_policy_logprobs when the KL
                coefficient is non-zero.
            global_valid_tokens: Valid (masked-in) tokens of the global batch.
            global_valid_seqs: Valid sequences of the global batch.

        Returns:
            The loss and additive metrics: ``loss``, ``pg_loss``, ``kl_penalty`` (KL value
            before the coefficient), ``clip_fraction`` (share of clipped-and-active tokens),
            ``probs_ratio`` (mean ratio), all as shares of the global normaliser, plus raw
            ``num_valid_tokens`` and ``num_valid_seqs``.
        """
        name = type(self).__name__
        _check_counts(name, global_valid_tokens, global_valid_seqs)
        keys = ("input_ids", "token_mask", "sample_mask", "advantages")
        if not self.prev_logprobs_from_forward:
            keys = keys + ("prev_logprobs",)
        keys = keys + self._extra_keys()
        if self.reference_policy_kl_penalty > 0:
            keys = keys + ("reference_policy_logprobs",)
        _require(name, mb, keys)
        weight = self._pg_weight(mb)
        logp = token_logprobs_from_logits(logits, mb["input_ids"])
        mask = _valid_mask(mb)
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
                return (x * mask).sum() / global_valid_tokens
            per_seq = (x * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            return per_seq.sum() / global_valid_seqs

        loss = reduce(token_loss)
        with torch.no_grad():
            metrics = {
                "loss": float(loss),
                "pg_loss": float(reduce(pg)),
                "kl_penalty": float(reduce(kl)),
                "clip_fraction": float(reduce(clip_active)),
                "probs_ratio": float(reduce(ratio)),
                **({} if weight is None else self._weight_metrics(reduce, weight)),
                "num_valid_tokens": float(mask.sum()),
                "num_valid_seqs": float((mb["sample_mask"].float() * (mask.sum(1) > 0).float()).sum()),
            }
        return loss, metrics

    def _extra_keys(self) -> tuple[str, ...]:
        """Micro-batch keys a subclass needs besides the clipped loss's own (none here)."""
        return ()

    def _pg_weight(self, mb: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        """A per-token weight of the policy-gradient term, or ``None`` (unweighted, here)."""
        return None

    def _weight_metrics(
        self, reduce: Callable[[torch.Tensor], torch.Tensor], weight: torch.Tensor
    ) -> dict[str, float]:
        """Additive metrics of a ``_pg_weight`` (none here)."""
        return {}


def global_valid_counts(token_mask: torch.Tensor, sample_mask: torch.Tensor) -> tuple[float, float]:
    """The normalisers the loss functions expect, computed over a (global) batch.

    Args:
        token_mask: int ``[B, S]``.
        sample_mask: float ``[B]``.

    Returns:
        ``(valid_tokens, valid_seqs)``: tokens with token_mask * sample_mask == 1, and rows
        with sample_mask == 1 that have at least one such token.
    """
    mask = token_mask.float() * sample_mask.float().unsqueeze(1)
    seqs = (sample_mask.float() * (mask.sum(1) > 0).float()).sum()
    return float(mask.sum()), float(seqs)
