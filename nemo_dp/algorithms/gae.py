"""Token-level PPO advantage estimation over ``[B, S]`` tensors aligned with ``input_ids``.

``values[:, t]`` estimates the state before token ``t``; ``mask`` is ``token_mask * sample_mask``;
the step after a row's last masked-in token is terminal (value 0).
"""

from __future__ import annotations

import torch

__all__ = ["token_level_rewards", "compute_gae", "masked_mean", "masked_whiten", "explained_variance"]


def _check_2d(name: str, t: torch.Tensor, shape: torch.Size | None = None) -> None:
    if t.dim() != 2:
        raise ValueError(f"{name} must be [B, S], got shape {tuple(t.shape)}")
    if shape is not None and t.shape != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")


def token_level_rewards(
    scores: torch.Tensor, mask: torch.Tensor, logprobs: torch.Tensor, reference_logprobs: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards: ``-kl_coef * (logprobs - reference_logprobs)`` on the mask, plus the score at the last token.

    Rows without a masked-in token get no reward.  Returns float32 ``(rewards, kl)``, ``kl`` 0 off the mask.

    Raises:
        ValueError: On mismatched shapes or a negative ``kl_coef``.
    """
    _check_2d("mask", mask)
    _check_2d("logprobs", logprobs, mask.shape)
    _check_2d("reference_logprobs", reference_logprobs, mask.shape)
    if scores.shape != (mask.shape[0],):
        raise ValueError(f"scores has shape {tuple(scores.shape)}, expected ({mask.shape[0]},)")
    if kl_coef < 0:
        raise ValueError(f"token_level_rewards: kl_coef must be >= 0, got {kl_coef}")
    m = mask.float()
    kl = (logprobs.float() - reference_logprobs.float()) * m
    rewards = -float(kl_coef) * kl
    width = m.shape[1]
    has_token = m.sum(1) > 0
    # Index of the last masked-in column of each row (response tokens are contiguous, but the
    # last 1 is found directly so that no contiguity assumption is needed here).
    cols = torch.arange(width, dtype=torch.long).unsqueeze(0).expand_as(m)
    last = torch.where(m > 0, cols, torch.full_like(cols, -1)).max(dim=1).values
    rows = torch.nonzero(has_token, as_tuple=False).squeeze(1)
    rewards[rows, last[rows]] += scores.float()[rows]
    return rewards, kl


def compute_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each row's masked-in tokens; returns float32 ``(advantages, returns)``.

    With ``V'_t`` the value of the row's next masked-in token (0 after the last one):
    ``delta_t = r_t + gamma * V'_t - V_t``, ``A_t = delta_t + gamma * lam * A'_t``, ``R_t = A_t + V_t``.
    Masked-out columns are skipped and get 0.

    Raises:
        ValueError: On mismatched shapes or ``gamma`` / ``lam`` outside ``[0, 1]``.
    """
    _check_2d("rewards", rewards)
    _check_2d("values", values, rewards.shape)
    _check_2d("mask", mask, rewards.shape)
    for name, v in (("gamma", gamma), ("lam", lam)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"compute_gae: {name} must be in [0, 1], got {v}")
    m = mask.float()
    r = rewards.float() * m
    v = values.float() * m
    batch, width = r.shape
    adv = torch.zeros_like(r)
    next_value = torch.zeros(batch, dtype=torch.float32)
    next_adv = torch.zeros(batch, dtype=torch.float32)
    for t in range(width - 1, -1, -1):
        on = m[:, t] > 0
        delta = r[:, t] + gamma * next_value - v[:, t]
        a_t = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(on, a_t, torch.zeros_like(a_t))
        # Carry across masked-out columns unchanged, so the recursion links masked-in tokens.
        next_value = torch.where(on, v[:, t], next_value)
        next_adv = torch.where(on, a_t, next_adv)
    returns = (adv + v) * m
    return adv, returns


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Float32 mean of ``x`` where the 0/1 ``mask`` is 1; raises ``ValueError`` if the mask selects nothing."""
    m = mask.float()
    n = m.sum()
    if float(n) <= 0:
        raise ValueError("masked_mean: the mask selects no element")
    return (x.float() * m).sum() / n


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Like :func:`masked_mean`, but whitens ``x``: zero mean, unit population variance (+ ``eps``), 0 off the mask."""
    m = mask.float()
    mean = masked_mean(x, m)
    var = masked_mean((x.float() - mean) ** 2, m)
    return (x.float() - mean) * torch.rsqrt(var + eps) * m


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var[returns - values] / Var[returns]`` over the mask; 0 when the returns have no variance.

    Raises:
        ValueError: If the mask selects nothing.
    """
    m = mask.float()
    ret = returns.float()
    var_r = masked_mean((ret - masked_mean(ret, m)) ** 2, m)
    resid = ret - values.float()
    var_e = masked_mean((resid - masked_mean(resid, m)) ** 2, m)
    if float(var_r) <= 0.0:
        return 0.0
    return float(1.0 - var_e / var_r)
