"""Multimodal batch values: ``PackedTensor`` (per-sample tensors packed when the model uses them).

The class lives in ``nemo_dp.utils.packed_tensor`` so that the batch container and the data
plane, which sit below ``nemo_dp.data``, can handle it; this module is its public home.
"""

from __future__ import annotations

from nemo_dp.utils.packed_tensor import PackedTensor

__all__ = ["PackedTensor"]
