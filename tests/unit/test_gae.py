"""GAE, token-level rewards, whitening and explained variance against plain per-row loops."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_dp.algorithms.gae import (
    compute_gae,
    explained_variance,
    masked_mean,
    masked_whiten,
    token_level_rewards,
)


def _reference_gae(rewards: list[float], values: list[float], gamma: float, lam: float):
    """Textbook GAE over one episode (a list of steps), terminal value 0."""
    n = len(rewards)
    adv = [0.0] * n
    nxt_v, nxt_a = 0.0, 0.0
    for t in reversed(range(n)):
        delta = rewards[t] + gamma * nxt_v - values[t]
        nxt_a = delta + gamma * lam * nxt_a
        adv[t] = nxt_a
        nxt_v = values[t]
    return adv, [a + v for a, v in zip(adv, values)]


@st.composite
def _batches(draw):
    b = draw(st.integers(1, 5))
    s = draw(st.integers(2, 9))
    mask = torch.zeros(b, s)
    for i in range(b):
        start = draw(st.integers(0, s - 1))
        length = draw(st.integers(0, s - start))
        mask[i, start : start + length] = 1
    gen = torch.Generator().manual_seed(draw(st.integers(0, 10_000)))
    rewards = torch.randn(b, s, generator=gen)
    values = torch.randn(b, s, generator=gen)
    gamma = draw(st.sampled_from([1.0, 0.99, 0.5, 0.0]))
    lam = draw(st.sampled_from([1.0, 0.95, 0.5, 0.0]))
    return rewards, values, mask, gamma, lam


@settings(max_examples=60, deadline=None)
@given(_batches())
def test_gae_matches_per_episode_reference(case) -> None:
    rewards, values, mask, gamma, lam = case
    adv, ret = compute_gae(rewards, values, mask, gamma, lam)
    for i in range(mask.shape[0]):
        cols = [t for t in range(mask.shape[1]) if mask[i, t] > 0]
        ref_a, ref_r = _reference_gae(
            [float(rewards[i, t]) for t in cols], [float(values[i, t]) for t in cols], gamma, lam
        )
        for k, t in enumerate(cols):
            assert adv[i, t].item() == pytest.approx(ref_a[k], rel=1e-5, abs=1e-5)
            assert ret[i, t].item() == pytest.approx(ref_r[k], rel=1e-5, abs=1e-5)
        off = [t for t in range(mask.shape[1]) if mask[i, t] == 0]
        assert all(adv[i, t].item() == 0.0 and ret[i, t].item() == 0.0 for t in off)


def test_gae_lambda_one_gamma_one_is_reward_to_go_minus_value() -> None:
    rewards = torch.tensor([[0.0, 0.1, 0.2, 1.0, 7.0]])
    values = torch.tensor([[9.0, 0.5, 0.25, 0.125, 9.0]])
    mask = torch.tensor([[0, 1, 1, 1, 0]])
    adv, ret = compute_gae(rewards, values, mask, 1.0, 1.0)
    assert ret[0, 1:4].tolist() == pytest.approx([1.3, 1.2, 1.0])
    assert adv[0, 1:4].tolist() == pytest.approx([0.8, 0.95, 0.875])
    assert adv[0, 0] == 0 and adv[0, 4] == 0


def test_gae_lambda_zero_is_one_step_td() -> None:
    rewards = torch.tensor([[0.5, 0.0, 1.0]])
    values = torch.tensor([[0.2, 0.4, 0.6]])
    mask = torch.ones(1, 3)
    adv, _ = compute_gae(rewards, values, mask, 0.9, 0.0)
    assert adv[0].tolist() == pytest.approx([0.5 + 0.9 * 0.4 - 0.2, 0.0 + 0.9 * 0.6 - 0.4, 1.0 - 0.6])


def test_gae_rejects_bad_arguments() -> None:
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="gamma must be in"):
        compute_gae(z, z, z, 1.5, 0.9)
    with pytest.raises(ValueError, match="values has shape"):
        compute_gae(z, torch.zeros(2, 4), z, 1.0, 0.9)


def test_token_level_rewards_places_score_at_last_response_token_with_kl() -> None:
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    lp = torch.tensor([[0.0, -1.0, -2.0, -0.5, 0.0]] * 3)
    ref = torch.tensor([[0.0, -1.5, -1.0, -0.5, -3.0]] * 3)
    scores = torch.tensor([1.0, 0.0, 1.0])
    rewards, kl = token_level_rewards(scores, mask, lp, ref, kl_coef=0.1)
    assert kl[0].tolist() == pytest.approx([0.0, 0.5, -1.0, 0.0, 0.0])
    assert rewards[0].tolist() == pytest.approx([0.0, -0.05, 0.1, 1.0, 0.0])
    assert rewards[1].tolist() == pytest.approx([0.0, 0.0, 0.1, 0.0, -0.3])
    # A row without response tokens receives nothing, not even its score.
    assert rewards[2].abs().sum() == 0
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        token_level_rewards(scores, mask, lp, ref, kl_coef=-1.0)


def test_masked_whiten_zero_mean_unit_variance_on_mask_only() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=gen) * 3 + 2
    mask = (torch.rand(4, 6, generator=gen) > 0.4).float()
    w = masked_whiten(x, mask)
    assert float(masked_mean(w, mask)) == pytest.approx(0.0, abs=1e-5)
    assert float(masked_mean(w**2, mask)) == pytest.approx(1.0, rel=1e-4)
    assert bool((w[mask == 0] == 0).all())
    with pytest.raises(ValueError, match="selects no element"):
        masked_whiten(x, torch.zeros_like(mask))


def test_explained_variance() -> None:
    ret = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(ret, ret, mask) == pytest.approx(1.0)
    mean_pred = torch.full_like(ret, 2.0)
    assert explained_variance(mean_pred, ret, mask) == pytest.approx(0.0, abs=1e-6)
    bad = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    # residual = (-2, 0, 2): variance 8/3 against 2/3 -> 1 - 4 = -3
    assert explained_variance(bad, ret, mask) == pytest.approx(-3.0)
    assert explained_variance(ret, torch.ones_like(ret), mask) == 0.0
    assert not math.isnan(explained_variance(mean_pred, ret, mask))
