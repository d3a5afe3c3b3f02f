"""Public home of ``PackedTensor`` (defined in ``nemo_dp.utils.packed_tensor``, below this layer)."""

from __future__ import annotations

from nemo_dp.utils.packed_tensor import PackedTensor

__all__ = ["PackedTensor"]
