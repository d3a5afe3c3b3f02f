"""Training's held-out accuracy and ``launchers/evaluate.py`` report the same number."""

from __future__ import annotations

import pytest
import torch

from nemo_dp.algorithms.rollout import mean_reward


def test_mean_reward_is_the_exact_fraction_whatever_the_dtype() -> None:
    rewards = torch.zeros(400, dtype=torch.float32)
    rewards[7] = 1.0
    # A float32 mean (what training recorded before) prints 0.002; the fraction is 1/400.
    assert f"{float(rewards.mean()):.3f}" == "0.002"
    assert mean_reward(rewards.tolist()) == 1 / 400 and f"{mean_reward(rewards.tolist()):.3f}" == "0.003"
    # The order of the sum does not matter (evaluation sums batch by batch).
    values = [0.1] * 7 + [1.0] * 3 + [0.3] * 11
    assert mean_reward(values) == mean_reward(list(reversed(values)))
    with pytest.raises(ValueError, match="no rewards"):
        mean_reward([])
