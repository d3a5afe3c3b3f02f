"""FlatGrads keeps every gradient a view of one flat buffer; make_adamw picks the fused step.

Plain torch modules, no workers: the accumulated gradients must equal those of an identical
model without the buffers, bit for bit, and a replaced ``.grad`` is folded back in.
"""

from __future__ import annotations

import torch

from nemo_dp.models.flat_grads import FlatGrads, make_adamw


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    model[0].bias.requires_grad_(False)  # a frozen parameter gets no view
    return model


def _backward_twice(model: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        model(torch.randn(4, 6, generator=g)).square().sum().backward()


def test_accumulated_gradients_equal_plain_ones_and_live_in_the_buffer() -> None:
    plain, flat_model = _model(), _model()
    flat = FlatGrads(flat_model.parameters())
    assert sum(b.numel() for b in flat.buffers) == sum(p.numel() for p in flat_model.parameters() if p.requires_grad)
    _backward_twice(plain)
    _backward_twice(flat_model)
    for a, b in zip(plain.parameters(), flat_model.parameters()):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            assert torch.equal(a.grad, b.grad)
    assert flat_model[0].bias.grad is None
    offset = 0
    for p in flat.params:  # the buffer holds the gradients in parameter order
        assert torch.equal(flat.buffers[0][offset : offset + p.numel()], p.grad.reshape(-1))
        offset += p.numel()


def test_all_reduce_sums_each_buffer_in_place_and_zero_grad_keeps_the_views() -> None:
    model = _model()
    flat = FlatGrads(model.parameters())
    _backward_twice(model)
    before = [p.grad.clone() for p in flat.params]
    calls: list[int] = []

    def double(t: torch.Tensor) -> None:  # stands in for a two-rank sum of equal gradients
        calls.append(t.numel())
        t.mul_(2)

    flat.all_reduce(double)
    assert calls == [sum(p.numel() for p in flat.params)]
    assert all(torch.equal(p.grad, 2 * b) for p, b in zip(flat.params, before))
    torch.optim.SGD(model.parameters(), lr=0.1).zero_grad(set_to_none=False)
    assert float(flat.buffers[0].abs().sum()) == 0.0
    _backward_twice(model)
    assert all(torch.equal(p.grad, b) for p, b in zip(flat.params, before))


def test_a_replaced_or_dropped_grad_is_folded_back_into_the_buffer() -> None:
    model = _model()
    flat = FlatGrads(model.parameters())
    first, second = flat.params[0], flat.params[1]
    first.grad = torch.full_like(first, 3.0)
    second.grad = None
    flat.all_reduce(lambda t: None)
    assert torch.equal(first.grad, torch.full_like(first, 3.0))
    assert torch.equal(second.grad, torch.zeros_like(second))
    assert float(flat.buffers[0].sum()) == 3.0 * first.numel()


def test_make_adamw_is_fused_on_cpu_and_steps_like_the_loop() -> None:
    a, b = _model(), _model()
    opt_fused = make_adamw(list(a.parameters()), lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    opt_loop = torch.optim.AdamW(b.parameters(), lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    assert opt_fused.defaults["fused"] is True
    for _ in range(3):
        for model, opt in ((a, opt_fused), (b, opt_loop)):
            opt.zero_grad()
            _backward_twice(model)
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    # Its state dict has the loop's layout, so a checkpoint from either loads into the other.
    opt_loop.load_state_dict(opt_fused.state_dict())
