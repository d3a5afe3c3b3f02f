"""GRPO baselines/advantages: group mean, leave-one-out, std normalisation, zero-std groups."""

from __future__ import annotations

import pytest
import torch

from nemo_dp.algorithms.advantages import grpo_advantages, grpo_baseline_and_std


def test_group_mean_baseline_and_std() -> None:
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    base, std = grpo_baseline_and_std(r, 4, leave_one_out=False)
    assert base.tolist() == [0.5] * 4 + [2.0] * 4
    s = torch.tensor([1.0, 0.0, 0.0, 1.0]).std().item()  # Bessel-corrected
    torch.testing.assert_close(std, torch.tensor([s] * 4 + [0.0] * 4))
    adv = grpo_advantages(r, base, std, normalize_std=True)
    torch.testing.assert_close(adv[:4], (r[:4] - 0.5) / (s + 1e-6))
    assert adv[4:].tolist() == [0.0] * 4  # zero-std group: no signal, no blow-up


def test_leave_one_out() -> None:
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 3.0, 3.0, 3.0, 3.0])
    base, std = grpo_baseline_and_std(r, 4, leave_one_out=True)
    torch.testing.assert_close(base, torch.tensor([0.0, 1 / 3, 1 / 3, 1 / 3, 3.0, 3.0, 3.0, 3.0]))
    adv = grpo_advantages(r, base, std, normalize_std=False)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3, 0, 0, 0, 0]))
    # A lone success keeps a finite advantage under std normalisation (group std, not LOO std).
    adv_n = grpo_advantages(r, base, std, normalize_std=True)
    assert torch.isfinite(adv_n).all() and float(adv_n[0]) == pytest.approx(1.0 / 0.5, rel=1e-4)
    assert adv_n[4:].tolist() == [0.0] * 4


def test_group_of_one_and_errors() -> None:
    r = torch.tensor([1.0, 0.0])
    base, std = grpo_baseline_and_std(r, 1, leave_one_out=False)
    assert base.tolist() == [1.0, 0.0] and std.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="leave_one_out needs group_size >= 2"):
        grpo_baseline_and_std(r, 1, leave_one_out=True)
    with pytest.raises(ValueError, match="3 rewards are not a multiple of group_size=2"):
        grpo_baseline_and_std(torch.ones(3), 2, leave_one_out=False)
    with pytest.raises(ValueError, match="shapes differ"):
        grpo_advantages(torch.ones(4), torch.ones(4), torch.ones(2), normalize_std=True)
