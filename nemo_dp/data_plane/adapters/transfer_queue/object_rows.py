"""Per-sample multimodal values as self-describing row bytes on the TransferQueue wire.

A multimodal column (one tensor per sample of any shape, or one ``PackedTensor`` entry per
sample) is a per-row object column the library would pickle row by row; instead it crosses the
wire in the padded row-bytes layout of ``row_wire`` as ``uint8``, each stored row carrying its own
dtype and shape, so any dtype comes back bit for bit and no row is ever unpickled.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from nemo_dp.data_plane.adapters.transfer_queue.row_split import LENGTH_BYTES
from nemo_dp.data_plane.adapters.transfer_queue.wire_dtypes import DTYPE_CODES, DTYPES_BY_CODE
from nemo_dp.utils.packed_tensor import PackedTensor

__all__ = ["MAGIC", "decode_row", "encode_rows", "is_object_row"]

MAGIC = b"ndo1"
_NONE, _TENSOR, _PACKED, _PACKED_NONE = 0, 1, 2, 3
_MAX_DIMS = 32
_Q = struct.Struct("<q")
_TENSOR_HEAD = struct.Struct("<BB")  # dtype code, rank


def _carriable(t: Any) -> bool:
    return (
        type(t) is torch.Tensor
        and t.layout == torch.strided
        and not t.is_nested
        and t.device.type == "cpu"
        and t.dtype in DTYPE_CODES
        and t.dim() <= _MAX_DIMS
        and not t.requires_grad
        and not t.is_conj()
        and not t.is_neg()
    )


def _tensor_part(t: torch.Tensor) -> bytes:
    dims = struct.pack(f"<{t.dim()}q", *t.shape)
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return _TENSOR_HEAD.pack(DTYPE_CODES[t.dtype], t.dim()) + dims + raw


def _payload(value: Any) -> bytes | None:
    """The payload of one row, or ``None`` if the row layout cannot carry it."""
    if value is None:
        return bytes([_NONE])
    if _carriable(value):
        return bytes([_TENSOR]) + _tensor_part(value)
    if type(value) is PackedTensor and len(value) == 1:
        entry = value.tensors[0]
        dim = _Q.pack(value.dim_to_pack)
        if entry is None:
            return bytes([_PACKED_NONE]) + dim
        if _carriable(entry):
            return bytes([_PACKED]) + dim + _tensor_part(entry)
    return None


def encode_rows(rows: Sequence[Any]) -> torch.Tensor | None:
    """The ``uint8`` padded-row matrix of an object column, or ``None`` if it does not qualify.

    A column qualifies when every row is ``None``, a tensor or a one-entry ``PackedTensor``
    (of a tensor or ``None``) and at least one row holds a tensor; tensors must be dense CPU
    tensors without autograd history, of a dtype with a code.  A stored row is :data:`MAGIC`,
    then (little-endian) one kind byte (``0`` ``None``, ``1`` tensor, ``2`` packed tensor, ``3``
    packed ``None``), for kinds 2 and 3 the ``dim_to_pack`` (int64), and for kinds 1 and 2 the
    dtype code (``wire_dtypes``), the rank, one int64 per dim and the raw bytes.  ``rows`` holds
    one value per sample (``NonTensorStack.tolist()``).

    Returns:
        An ``(n, LENGTH_BYTES + longest payload)`` ``uint8`` matrix: each row starts with its
        payload's byte count (little-endian int64), then the payload, then zero padding.  The
        storage unit prefixes :data:`MAGIC` (the column's descriptor) when it splits the rows.
    """
    if not rows or sys.byteorder != "little":
        return None
    if not any(v is not None and (type(v) is torch.Tensor or type(v) is PackedTensor) for v in rows):
        return None
    payloads: list[bytes] = []
    for v in rows:
        p = _payload(v)
        if p is None:
            return None
        payloads.append(p)
    width = LENGTH_BYTES + max(len(p) for p in payloads)
    matrix = np.zeros((len(payloads), width), dtype=np.uint8)
    for i, p in enumerate(payloads):
        matrix[i, :LENGTH_BYTES] = np.frombuffer(_Q.pack(len(p)), dtype=np.uint8)
        matrix[i, LENGTH_BYTES : LENGTH_BYTES + len(p)] = np.frombuffer(p, dtype=np.uint8)
    return torch.from_numpy(matrix)


def is_object_row(row: Any) -> bool:
    """Whether a stored value is a row written by :func:`encode_rows`."""
    return isinstance(row, bytes) and row.startswith(MAGIC)


def _bad(field: str, what: str) -> RuntimeError:
    return RuntimeError(f"field {field!r}: a stored multimodal row is malformed ({what})")


def _read_tensor(row: bytes, pos: int, field: str) -> torch.Tensor:
    if len(row) < pos + _TENSOR_HEAD.size:
        raise _bad(field, "truncated tensor header")
    code, rank = _TENSOR_HEAD.unpack_from(row, pos)
    if code not in DTYPES_BY_CODE or rank > _MAX_DIMS:
        raise _bad(field, f"dtype code {code}, rank {rank}")
    pos += _TENSOR_HEAD.size
    if len(row) < pos + 8 * rank:
        raise _bad(field, "truncated shape")
    shape = struct.unpack_from(f"<{rank}q", row, pos)
    pos += 8 * rank
    dtype = DTYPES_BY_CODE[code]
    if any(d < 0 for d in shape):
        raise _bad(field, f"negative dim in {shape}")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(row) - pos != nbytes:
        raise _bad(field, f"{len(row) - pos} data bytes for shape {tuple(shape)} of {dtype}")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    data = torch.frombuffer(bytearray(row[pos:]), dtype=torch.uint8)
    return data.view(dtype).reshape(shape)


def decode_row(row: bytes, field: str) -> Any:
    """The value one stored row stands for (a fresh tensor, PackedTensor or ``None``).

    Raises:
        RuntimeError: The row is malformed (names the field).
    """
    pos = len(MAGIC)
    if len(row) <= pos:
        raise _bad(field, "no kind byte")
    kind = row[pos]
    pos += 1
    if kind == _NONE:
        if len(row) != pos:
            raise _bad(field, "trailing bytes after None")
        return None
    if kind == _TENSOR:
        return _read_tensor(row, pos, field)
    if kind in (_PACKED, _PACKED_NONE):
        if len(row) < pos + _Q.size:
            raise _bad(field, "truncated dim_to_pack")
        (dim,) = _Q.unpack_from(row, pos)
        pos += _Q.size
        if kind == _PACKED_NONE:
            if len(row) != pos:
                raise _bad(field, "trailing bytes after an empty entry")
            return PackedTensor([None], int(dim))
        return PackedTensor(_read_tensor(row, pos, field), int(dim))
    raise _bad(field, f"unknown kind {kind}")
