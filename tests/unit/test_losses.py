"""Loss functions: NLL only on response tokens, clipped PG by hand, global normalisation."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_dp.algorithms.loss_functions import (
    ClippedPGLossFn,
    NLLLoss,
    global_valid_counts,
    token_logprobs_from_logits,
)
from nemo_dp.models.tiny.model import ModelConfig, TinyCausalLM


V = 7


def _batch(seed: int = 0, b: int = 6, s: int = 8) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (b, s), generator=g)
    token_mask = torch.zeros(b, s, dtype=torch.int32)
    for i in range(b):
        start = 2 + i % 3
        token_mask[i, start : s - i % 2] = 1
    sample_mask = torch.ones(b)
    sample_mask[1] = 0.0
    return {
        "input_ids": ids,
        "token_mask": token_mask,
        "sample_mask": sample_mask,
        "prev_logprobs": -torch.rand(b, s, generator=g) * 2 - 0.5,
        "reference_policy_logprobs": -torch.rand(b, s, generator=g) * 2 - 0.5,
        "advantages": torch.randn(b, 1, generator=g).expand(b, s) * token_mask,
    }


def test_token_logprobs_alignment() -> None:
    logits = torch.randn(2, 5, V)
    ids = torch.randint(0, V, (2, 5))
    lp = token_logprobs_from_logits(logits, ids)
    assert lp.shape == (2, 5) and (lp[:, 0] == 0).all()
    for b in range(2):
        for t in range(1, 5):
            assert math.isclose(float(lp[b, t]), float(torch.log_softmax(logits[b, t - 1], -1)[ids[b, t]]), rel_tol=1e-5)


def test_nll_only_on_response_tokens_of_used_rows() -> None:
    mb = _batch()
    logits = torch.randn(6, 8, V, requires_grad=True)
    tokens, seqs = global_valid_counts(mb["token_mask"], mb["sample_mask"])
    loss, metrics = NLLLoss()(logits, mb, tokens, seqs)
    lp = token_logprobs_from_logits(logits, mb["input_ids"])
    mask = mb["token_mask"].float() * mb["sample_mask"].unsqueeze(1)
    torch.testing.assert_close(loss, -(lp * mask).sum() / mask.sum())
    assert metrics["num_valid_tokens"] == float(mask.sum()) == tokens
    loss.backward()
    # Gradient reaches position t-1 only where token t is trained; masked rows get none.
    grad_rows = logits.grad.abs().sum(-1)
    shifted = torch.nn.functional.pad(mask[:, 1:], (0, 1))
    assert torch.equal(grad_rows > 0, shifted > 0)
    assert (logits.grad[1] == 0).all()


def _hand_pg(mb: dict[str, torch.Tensor], logp: torch.Tensor, eps_lo: float, eps_hi: float, beta: float) -> torch.Tensor:
    total, count = 0.0, 0.0
    for i in range(mb["input_ids"].shape[0]):
        for t in range(mb["input_ids"].shape[1]):
            if mb["token_mask"][i, t] == 0 or mb["sample_mask"][i] == 0:
                continue
            lp = float(logp[i, t])
            ratio = math.exp(lp - float(mb["prev_logprobs"][i, t]))
            a = float(mb["advantages"][i, t])
            pg = -min(ratio * a, min(max(ratio, 1 - eps_lo), 1 + eps_hi) * a)
            d = float(mb["reference_policy_logprobs"][i, t]) - lp
            kl = math.exp(d) - d - 1
            total += pg + beta * kl
            count += 1
    return torch.tensor(total / count)


def test_clipped_pg_against_hand_computation() -> None:
    mb = _batch(seed=3)
    logits = torch.randn(6, 8, V)
    logp = token_logprobs_from_logits(logits, mb["input_ids"])
    tokens, seqs = global_valid_counts(mb["token_mask"], mb["sample_mask"])
    loss, metrics = ClippedPGLossFn(0.2, 0.28, 0.05, token_level_loss=True)(logits, mb, tokens, seqs)
    expected = _hand_pg(mb, logp, 0.2, 0.28, 0.05)
    torch.testing.assert_close(loss, expected.float(), rtol=1e-5, atol=1e-6)
    assert 0.0 < metrics["clip_fraction"] < 1.0  # the random ratios do hit the clip range
    assert metrics["kl_penalty"] > 0.0


def test_on_policy_ratio_one_gives_reinforce_gradient() -> None:
    mb = _batch(seed=4)
    logits = torch.randn(6, 8, V, requires_grad=True)
    mb["prev_logprobs"] = token_logprobs_from_logits(logits, mb["input_ids"]).detach()
    tokens, seqs = global_valid_counts(mb["token_mask"], mb["sample_mask"])
    loss, metrics = ClippedPGLossFn(0.2, 0.2, 0.0, True)(logits, mb, tokens, seqs)
    assert metrics["clip_fraction"] == 0.0 and math.isclose(metrics["probs_ratio"], 1.0, rel_tol=1e-6)
    loss.backward()
    g1 = logits.grad.clone()
    logits.grad = None
    lp = token_logprobs_from_logits(logits, mb["input_ids"])
    mask = mb["token_mask"].float() * mb["sample_mask"].unsqueeze(1)
    (-(lp * mb["advantages"] * mask).sum() / tokens).backward()
    torch.testing.assert_close(g1, logits.grad)


def test_sequence_level_normalisation() -> None:
    mb = _batch(seed=5)
    logits = torch.randn(6, 8, V)
    logp = token_logprobs_from_logits(logits, mb["input_ids"])
    tokens, seqs = global_valid_counts(mb["token_mask"], mb["sample_mask"])
    assert seqs == 5.0
    loss, _ = ClippedPGLossFn(0.2, 0.2, 0.0, token_level_loss=False)(logits, mb, tokens, seqs)
    per_seq = []
    for i in range(6):
        if mb["sample_mask"][i] == 0:
            continue
        one = {k: v[i : i + 1] for k, v in mb.items()}
        per_seq.append(float(_hand_pg(one, logp[i : i + 1], 0.2, 0.2, 0.0)))
    assert math.isclose(float(loss), sum(per_seq) / 5, rel_tol=1e-5)


@pytest.mark.parametrize(
    "loss_fn",
    [NLLLoss(), ClippedPGLossFn(0.2, 0.2, 0.1, True), ClippedPGLossFn(0.2, 0.2, 0.1, False)],
    ids=["nll", "pg_token", "pg_seq"],
)
def test_microbatch_sum_equals_full_batch(loss_fn: object) -> None:
    cfg = ModelConfig(vocab_size=V, n_layers=1, d_model=16, n_heads=2, max_seq_len=8)
    model = TinyCausalLM(cfg, seed=0)
    mb = _batch(seed=6)
    tokens, seqs = global_valid_counts(mb["token_mask"], mb["sample_mask"])
    full, full_metrics = loss_fn(model(mb["input_ids"]), mb, tokens, seqs)
    full.backward()
    full_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    total, summed = torch.tensor(0.0), {}
    for rows in ([0, 1], [2], [3, 4, 5]):  # uneven micro-batches
        part = {k: v[rows] for k, v in mb.items()}
        loss, metrics = loss_fn(model(part["input_ids"]), part, tokens, seqs)
        loss.backward()
        total = total + loss.detach()
        for k, v in metrics.items():
            summed[k] = summed.get(k, 0.0) + v
    torch.testing.assert_close(total, full.detach(), rtol=1e-5, atol=1e-6)
    for p, g in zip(model.parameters(), full_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
    for k, v in full_metrics.items():
        assert math.isclose(summed[k], v, rel_tol=1e-4, abs_tol=1e-6), k


def test_errors() -> None:
    mb = _batch()
    logits = torch.randn(6, 8, V)
    with pytest.raises(ValueError, match="global_valid_tokens must be > 0, got 0"):
        NLLLoss()(logits, mb, 0, 1)
    del mb["reference_policy_logprobs"]
    with pytest.raises(KeyError, match="lacks key 'reference_policy_logprobs'"):
        ClippedPGLossFn(0.2, 0.2, 0.1, True)(logits, mb, 10, 2)
    ClippedPGLossFn(0.2, 0.2, 0.0, True)(logits, mb, 10, 2)  # no KL -> reference not needed
    with pytest.raises(ValueError, match="ratio_clip_min must be >= 0"):
        ClippedPGLossFn(-0.1, 0.2, 0.0, True)
