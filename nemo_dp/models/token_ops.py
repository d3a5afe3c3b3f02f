"""Per-token views of model outputs, shared by the workers and the losses so both compute the same numbers."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "token_logprobs_from_logits", "align_values", "first_logits_position", "first_masked_columns",
    "rollout_sample_mask",
]


def first_logits_position(token_mask: torch.Tensor) -> int:
    """``logits_from`` for a masked log-prob: one before the first nonzero ``[B, S]`` mask column of any row (>= 0)."""
    cols = torch.nonzero(token_mask.reshape(token_mask.shape[0], -1).ne(0).any(0))
    return max(int(cols[0]) - 1, 0) if cols.numel() else 0


def first_masked_columns(token_mask: torch.Tensor) -> torch.Tensor:
    """Each row's first column with a nonzero ``token_mask`` ``[B, S]``, as int64 ``[B]`` (``S`` for none)."""
    on = token_mask.ne(0)
    first = on.to(torch.int8).argmax(dim=1)
    return torch.where(on.any(dim=1), first, torch.full_like(first, on.shape[1]))


def token_logprobs_from_logits(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Float32 ``[B, S]``: column t is log p(token t | tokens < t), columns ``0 .. S - K`` are 0.

    ``logits`` ``[B, K, V]`` are those of the last ``K <= S`` positions (else ``ValueError``).
    """
    if (
        logits.dim() != 3
        or input_ids.dim() != 2
        or logits.shape[0] != input_ids.shape[0]
        or not 1 <= logits.shape[1] <= input_ids.shape[1]
    ):
        raise ValueError(
            f"token_logprobs_from_logits: logits {tuple(logits.shape)} do not match "
            f"input_ids {tuple(input_ids.shape)}"
        )
    first = input_ids.shape[1] - logits.shape[1]  # the position of the first logits row
    logp = F.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(2, input_ids[:, first + 1 :].unsqueeze(-1)).squeeze(-1)
    return F.pad(picked, (first + 1, 0), value=0.0)


def align_values(head_out: torch.Tensor) -> torch.Tensor:
    """Float32 value-head outputs ``[B, S]`` shifted right by one (column ``t``: value of ``tokens < t``; column 0: 0).

    Raises ``ValueError`` when ``head_out`` is not 2-D.
    """
    if head_out.dim() != 2:
        raise ValueError(f"align_values: expected value-head output [B, S], got shape {tuple(head_out.shape)}")
    return F.pad(head_out[:, :-1].float(), (1, 0), value=0.0)


def rollout_sample_mask(truncated: torch.Tensor, *, overlong_filtering: bool) -> torch.Tensor:
    """The float32 ``[B]`` per-sample loss mask of a rollout: ones, zero on truncated responses if filtering."""
    mask = torch.ones(truncated.shape[0], dtype=torch.float32)
    if overlong_filtering:
        mask = mask * (~truncated.bool()).float()
    return mask
