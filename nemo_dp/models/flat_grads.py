"""A model's gradients as views of one flat buffer per dtype and device (one all-reduce each), and AdamW."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

__all__ = ["FlatGrads", "make_adamw"]


class FlatGrads:
    """Keeps ``p.grad`` of each parameter a view of its (dtype, device) group's flat buffer."""

    def __init__(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Allocate zeroed buffers and point every ``requires_grad`` parameter's ``.grad`` (value kept) into them."""
        self.params: list[torch.nn.Parameter] = [p for p in params if p.requires_grad]
        groups: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
        for p in self.params:
            groups.setdefault((p.dtype, p.device), []).append(p)
        self.buffers: list[torch.Tensor] = []
        self._views: dict[int, torch.Tensor] = {}
        for (dtype, device), members in groups.items():
            flat = torch.zeros(sum(p.numel() for p in members), dtype=dtype, device=device)
            offset = 0
            for p in members:
                self._views[id(p)] = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            self.buffers.append(flat)
        self.attach()

    def attach(self) -> None:
        """Point each ``.grad`` back into the buffers, keeping its value (``None`` reads as 0)."""
        for p in self.params:
            view = self._views[id(p)]
            grad = p.grad
            if grad is view:
                continue
            if grad is None:
                view.zero_()
            else:
                view.copy_(grad)
            p.grad = view

    def all_reduce(self, reduce_sum: Callable[[torch.Tensor], object]) -> None:
        """Sum the gradients over ranks in place, one ``reduce_sum`` (in-place all-reduce) call per buffer."""
        self.attach()
        for flat in self.buffers:
            reduce_sum(flat)


def make_adamw(
    params: Sequence[torch.nn.Parameter], *, lr: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> torch.optim.AdamW:
    """AdamW, fused into one kernel per step where torch has one (CPU and CUDA floats; same update up to rounding)."""
    params = list(params)
    fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused or None)
