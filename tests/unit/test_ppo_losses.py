"""ClippedValueLossFn: value, clipping, global normalisation, gradient flow; value alignment."""

from __future__ import annotations

import pytest
import torch

from nemo_dp.algorithms.ppo_losses import ClippedValueLossFn, align_values


def test_align_values_shifts_by_one_column() -> None:
    out = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert align_values(out).tolist() == [[0.0, 1.0, 2.0], [0.0, 4.0, 5.0]]
    with pytest.raises(ValueError, match="align_values: expected value-head output"):
        align_values(torch.zeros(2, 3, 5))


def _mb(old, ret, token_mask, sample_mask=None):
    b = len(old)
    return {
        "values": torch.tensor(old),
        "returns": torch.tensor(ret),
        "token_mask": torch.tensor(token_mask, dtype=torch.int32),
        "sample_mask": torch.ones(b) if sample_mask is None else torch.tensor(sample_mask),
    }


def test_value_loss_matches_hand_computation_with_clipping() -> None:
    # head output h -> aligned prediction [0, h0, h1]
    head = torch.tensor([[0.5, 1.0, 42.0]], requires_grad=True)
    mb = _mb([[0.0, 0.0, 0.0]], [[0.0, 1.0, 0.0]], [[0, 1, 1]])
    loss, m = ClippedValueLossFn(value_clip=0.2)(head, mb, 2.0, 1.0)
    # token 1: pred 0.5, clip 0.2, R 1 -> max(0.25, 0.64) = 0.64 (clipped term wins)
    # token 2: pred 1.0, clip 0.2, R 0 -> max(1.0, 0.04) = 1.0
    assert float(loss.detach()) == pytest.approx(0.5 * (0.64 + 1.0) / 2.0)
    assert m["value_clip_fraction"] == pytest.approx(0.5)
    assert m["num_valid_tokens"] == 2.0 and m["num_valid_seqs"] == 1.0
    loss.backward()
    # The clipped branch has no gradient w.r.t. the prediction (clamp saturated) -> token 1
    # contributes 0; token 2: d/dpred 0.5*(pred-R)^2 / 2 = (1.0 - 0)/2
    assert head.grad.tolist()[0] == pytest.approx([0.0, 0.5, 0.0])


def test_value_loss_microbatch_shares_sum_to_full_batch_mean() -> None:
    gen = torch.Generator().manual_seed(3)
    head = torch.randn(6, 5, generator=gen)
    mb = {
        "values": torch.randn(6, 5, generator=gen),
        "returns": torch.randn(6, 5, generator=gen),
        "token_mask": (torch.rand(6, 5, generator=gen) > 0.3).to(torch.int32),
        "sample_mask": torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 1.0]),
    }
    mask = mb["token_mask"].float() * mb["sample_mask"].unsqueeze(1)
    tokens = float(mask.sum())
    fn = ClippedValueLossFn(value_clip=0.3)
    full, _ = fn(head, mb, tokens, 5.0)
    parts = [fn(head[a:b], {k: v[a:b] for k, v in mb.items()}, tokens, 5.0)[0] for a, b in ((0, 2), (2, 6))]
    assert float(sum(parts)) == pytest.approx(float(full), rel=1e-6)
    # The sample-masked row contributes nothing even with a huge error.
    head2 = head.clone()
    head2[2] += 1e6
    assert float(fn(head2, mb, tokens, 5.0)[0]) == pytest.approx(float(full), rel=1e-6)


def test_value_loss_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="value_clip must be > 0"):
        ClippedValueLossFn(0.0)
    fn = ClippedValueLossFn(0.2)
    mb = _mb([[0.0, 0.0]], [[0.0, 1.0]], [[0, 1]])
    with pytest.raises(KeyError, match="returns"):
        fn(torch.zeros(1, 2), {k: v for k, v in mb.items() if k != "returns"}, 1.0, 1.0)
    with pytest.raises(ValueError, match="global_valid_tokens must be > 0"):
        fn(torch.zeros(1, 2), mb, 0.0, 1.0)
    with pytest.raises(ValueError, match="does not match returns"):
        fn(torch.zeros(1, 3), mb, 1.0, 1.0)
