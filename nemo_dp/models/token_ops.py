"""Per-token views of model outputs the workers compute: log-probs and aligned values.

Why this module exists: the policy worker needs per-token log-probs and the value worker
needs values shifted onto the tokens they predict, and the models layer may not import the
algorithms layer above it.  The loss functions use the same definitions, so the numbers a
worker returns and the numbers a loss sees are computed by one piece of code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["token_logprobs_from_logits", "align_values"]


def token_logprobs_from_logits(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Per-token log-probabilities aligned with ``input_ids``.

    Args:
        logits: float ``[B, S, V]``; position t predicts token t + 1.
        input_ids: int64 ``[B, S]``.

    Returns:
        float32 ``[B, S]`` where column t is log p(token t | tokens < t) and column 0 is 0.

    Raises:
        ValueError: If the shapes do not line up.
    """
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise ValueError(
            f"token_logprobs_from_logits: logits {tuple(logits.shape)} do not match "
            f"input_ids {tuple(input_ids.shape)}"
        )
    logp = F.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(2, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return F.pad(picked, (1, 0), value=0.0)


def align_values(head_out: torch.Tensor) -> torch.Tensor:
    """Shift value-head outputs so that column ``t`` is the value of the prefix ``tokens < t``.

    Args:
        head_out: float ``[B, S]`` value-head output (position ``t`` has seen tokens ``<= t``).

    Returns:
        float32 ``[B, S]`` with column 0 = 0 and column ``t`` = ``head_out[:, t - 1]``.

    Raises:
        ValueError: If ``head_out`` is not 2-D.
    """
    if head_out.dim() != 2:
        raise ValueError(
            f"align_values: expected value-head output [B, S], got shape {tuple(head_out.shape)}"
        )
    return F.pad(head_out[:, :-1].float(), (1, 0), value=0.0)
