"""A put's tensor column in Ray's object store, and how reads gather rows from it.

Columns are numpy arrays (dense, or a jagged ``(values, offsets)`` pair) that Ray deserialises
zero-copy; dtypes numpy lacks travel as a same-width integer view and come back bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nemo_dp.data_plane.adapters.local.store import contiguous_run, store_tensor

DENSE = "dense"
JAGGED = "jagged"

# dtypes whose numpy counterpart exists; others travel as a same-width integer view
_NUMPY_NATIVE = {
    getattr(torch, name)
    for name in "bool uint8 int8 int16 int32 int64 float16 float32 float64 complex64 complex128".split()
}
_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def dtype_from_name(name: str) -> torch.dtype:
    """``"torch.float32"`` -> ``torch.float32`` (``ValueError`` for a name of no torch dtype)."""
    attr = name[len("torch.") :] if name.startswith("torch.") else name
    dtype = getattr(torch, attr, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor (same-width ints for exotic dtypes, else ``TypeError``)."""
    if t.dtype not in _NUMPY_NATIVE:
        carrier = _SAME_WIDTH_INT.get(t.element_size())
        if carrier is None:
            raise TypeError(f"dtype {t.dtype} cannot be stored in Ray's object store")
        t = t.view(carrier)
    return t.numpy()


def from_numpy(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of :func:`to_numpy` for a writable array (the result shares its memory)."""
    t = torch.from_numpy(a)
    return t if t.dtype == dtype else t.view(dtype)


@dataclass
class EncodedColumn:
    """A put's tensor column for ``ray.put``: ``payload`` is an ``ndarray`` (:data:`DENSE`) or ``(values, offsets)``."""

    dtype: str
    layout: str
    payload: Any

    @property
    def nbytes(self) -> int:
        if self.layout == DENSE:
            return int(self.payload.nbytes)
        values, offsets = self.payload
        return int(values.nbytes) + int(offsets.nbytes)


def encode_column(name: str, t: torch.Tensor) -> EncodedColumn:
    """Encode a put's tensor leaf; contiguous dense CPU tensors are not copied (``ray.put`` makes the copy).

    Raises:
        TypeError: A strided nested tensor whose rows differ beyond their first dimension, or
            a dtype the object store cannot carry.
    """
    t = t.detach()
    if not t.is_nested:
        dense = t.to("cpu").contiguous()
        return EncodedColumn(str(t.dtype), DENSE, to_numpy(dense))
    if t.layout == torch.jagged and t.lengths() is None and getattr(t, "_ragged_idx", 1) == 1:
        offsets = t.offsets().to("cpu", torch.long)
        values = t.values().to("cpu")
        lo, hi = int(offsets[0]), int(offsets[-1])
        if lo != 0 or hi != values.size(0):
            values = values[lo:hi]
            offsets = offsets - lo
        return EncodedColumn(
            str(t.dtype), JAGGED, (to_numpy(values.contiguous()), offsets.contiguous().numpy())
        )
    col = store_tensor(name, t)  # holey jagged or strided nested: one compact copy
    return EncodedColumn(str(t.dtype), JAGGED, (to_numpy(col.values), col.offsets.numpy()))


@dataclass
class Segment:
    """Consecutive output rows of one field in one chunk: its layout, payload (read-only) and row positions."""

    layout: str
    payload: Any
    positions: list[int]


def _take_dense(a: np.ndarray, positions: list[int]) -> np.ndarray:
    run = contiguous_run(positions)
    if run is not None:
        return a[run[0] : run[1]].copy()
    return a.take(np.asarray(positions, dtype=np.int64), axis=0)


def _take_jagged(values: np.ndarray, offsets: np.ndarray, positions: list[int]) -> tuple[np.ndarray, np.ndarray]:
    run = contiguous_run(positions)
    if run is not None:
        lo, hi = int(offsets[run[0]]), int(offsets[run[1]])
        return values[lo:hi].copy(), offsets[run[0] : run[1] + 1] - lo
    rows = np.asarray(positions, dtype=np.int64)
    starts = offsets[:-1].take(rows)
    lengths = offsets[1:].take(rows) - starts
    out_offsets = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=out_offsets[1:])
    total = int(out_offsets[-1])
    # element k of output row i comes from values[starts[i] + k]
    index = np.repeat(starts - out_offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
    return values.take(index, axis=0), out_offsets


def _as_jagged(seg: Segment, field: str) -> tuple[np.ndarray, np.ndarray]:
    if seg.layout == JAGGED:
        values, offsets = seg.payload
        return _take_jagged(values, offsets, seg.positions)
    rows = _take_dense(seg.payload, seg.positions)
    if rows.ndim < 2:
        raise TypeError(
            f"field {field!r} mixes 1-D dense rows with jagged rows; they cannot form one column"
        )
    width = rows.shape[1]
    offsets = np.arange(rows.shape[0] + 1, dtype=np.int64) * width
    return rows.reshape(rows.shape[0] * width, *rows.shape[2:]), offsets


def gather_field(field: str, dtype: torch.dtype, segments: list[Segment]) -> torch.Tensor:
    """The rows of one field from its segments (in output order, at least one), as a fresh tensor.

    All-dense segments of one row shape give a dense tensor; anything else a jagged nested tensor
    ragged in dim 1.  ``TypeError`` for segments whose rows cannot form one column.
    """
    dense = all(s.layout == DENSE for s in segments)
    if dense and len({tuple(s.payload.shape[1:]) for s in segments}) == 1:
        parts = [_take_dense(s.payload, s.positions) for s in segments]
        out = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        return from_numpy(out, dtype)
    pairs = [_as_jagged(s, field) for s in segments]
    if len({tuple(v.shape[1:]) for v, _ in pairs}) != 1:
        raise TypeError(f"field {field!r}: stored rows have different trailing shapes")
    if len(pairs) == 1:
        values, offsets = pairs[0]
    else:
        values = np.concatenate([v for v, _ in pairs], axis=0)
        shifted = [pairs[0][1]]
        base = int(pairs[0][1][-1])
        for _, off in pairs[1:]:
            shifted.append(off[1:] + base)
            base += int(off[-1])
        offsets = np.concatenate(shifted)
    return torch.nested.nested_tensor_from_jagged(
        from_numpy(np.ascontiguousarray(values), dtype), torch.from_numpy(offsets)
    )
