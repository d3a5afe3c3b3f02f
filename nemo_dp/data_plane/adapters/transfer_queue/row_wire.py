"""The client half of the TransferQueue adapter's row-bytes wire layout: encode puts, decode gets.

A tensor column crosses the wire as one 2-D tensor of its own dtype (one sample per matrix row) and
is stored as one self-describing ``bytes`` value per row, sent back inline instead of one frame per row.
"""

from __future__ import annotations

import functools
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tensordict import NonTensorStack

from nemo_dp.data_plane.adapters.transfer_queue import object_rows, row_split
from nemo_dp.data_plane.adapters.transfer_queue.row_split import LENGTH_BYTES
from nemo_dp.data_plane.adapters.transfer_queue.wire_dtypes import DTYPE_CODES, DTYPES_BY_CODE
from nemo_dp.data_plane.codec import jagged_rows, stack_or_nest

__all__ = ["DTYPE_CODES", "EncodedPut", "decode_column", "encode_put", "plan_column"]

MAGIC = b"ndr1"
_HEAD = struct.Struct("<4sBB")  # magic, dtype code, row rank

_PICKLE_BY_VALUE = False
_MAX_DIMS = 32
#: Equal rows of at least this many bytes keep the library's own layout (see plan_column).
LARGE_ROW_BYTES = 16 * 1024


def _ship_splitter_by_value() -> None:
    """Make cloudpickle send ``row_split`` by value, so storage units never import nemo_dp."""
    global _PICKLE_BY_VALUE
    if not _PICKLE_BY_VALUE:
        import cloudpickle

        cloudpickle.register_pickle_by_value(row_split)
        _PICKLE_BY_VALUE = True


def densify(value: Any) -> Any:
    """A nested column whose rows all share one shape as a dense tensor; anything else as given.

    A compact jagged column's dense tensor is a view of its ``values()`` (no copy).
    """
    if not isinstance(value, torch.Tensor) or not value.is_nested:
        return value
    if value.layout == torch.jagged and getattr(value, "_ragged_idx", 1) == 1 and value.lengths() is None:
        offsets = value.offsets()
        n = offsets.numel() - 1
        if n <= 0:
            return value
        lengths = offsets.diff()
        first = int(lengths[0])
        if bool((lengths == first).all()):
            values = value.values()
            start = int(offsets[0])
            rows = values[start : start + n * first]
            return rows.reshape(n, first, *values.shape[1:])
        return value
    rows = value.unbind()
    if rows and all(r.shape == rows[0].shape for r in rows):
        return torch.stack(rows)
    return value


def descriptor(dtype: torch.dtype, rank: int, inner: Sequence[int]) -> bytes:
    """The bytes every stored row of a column starts with: its dtype, ``rank`` (dims of one row, 0 for a
    scalar) and ``inner`` (the ``rank - 1`` trailing dims after its first, possibly ragged, one)."""
    return _HEAD.pack(MAGIC, DTYPE_CODES[dtype], rank) + struct.pack(f"<{len(inner)}q", *inner)


@dataclass(frozen=True)
class ColumnPlan:
    """How one tensor column of a put crosses the wire.

    ``value`` is a 2-D row matrix, or (``descriptor`` ``None``) the column in the library's layout;
    ``header`` is the bytes of length header at the start of each matrix row (0: exact rows).
    """

    value: torch.Tensor
    descriptor: bytes | None = None
    header: int = 0


def _exact_rows(dense: torch.Tensor, rank: int, inner: tuple[int, ...]) -> ColumnPlan:
    """Equal rows: small ones as exact row bytes, large ones in the library's own layout."""
    n = int(dense.shape[0])
    matrix = dense.contiguous().reshape(n, -1)
    row_bytes = matrix.shape[1] * matrix.element_size()
    if row_bytes >= LARGE_ROW_BYTES:
        return ColumnPlan(dense)
    if row_bytes == 0:
        return _padded_rows(matrix, np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), rank, inner)
    return ColumnPlan(matrix, descriptor(dense.dtype, rank, inner), 0)


def _padded_rows(
    values: torch.Tensor, first: np.ndarray, nbytes: np.ndarray, rank: int, inner: tuple[int, ...]
) -> ColumnPlan:
    """Ragged rows: a length header, the row's bytes, zero padding to the longest row."""
    n = int(nbytes.shape[0])
    itemsize = values.element_size()
    header_items = -(-LENGTH_BYTES // itemsize)
    header = header_items * itemsize
    width_items = header_items + int(nbytes.max(initial=0)) // itemsize
    matrix = torch.zeros((n, width_items), dtype=values.dtype)
    out = matrix.view(torch.uint8).numpy()
    out[:, :LENGTH_BYTES] = nbytes.astype("<i8").view(np.uint8).reshape(n, LENGTH_BYTES)
    src = values.contiguous().reshape(-1).view(torch.uint8).numpy()
    for i in range(n):
        size = int(nbytes[i])
        if size:
            s = int(first[i])
            out[i, header : header + size] = src[s : s + size]
    return ColumnPlan(matrix, descriptor(values.dtype, rank, inner), header)


def plan_column(value: torch.Tensor) -> ColumnPlan:
    """Decide how one CPU tensor column (dense ``(n, ...)`` or nested, ``n >= 1``) crosses the wire.

    Equal rows below :data:`LARGE_ROW_BYTES` go as exact row bytes (no copy); larger equal rows in
    the library's own layout; ragged rows padded to the longest row after a length header (the
    storage unit keeps only each row's bytes).  Columns the row layout cannot describe keep the
    library's layout.  Every layout sends the field's own dtype.
    """
    if value.dtype not in DTYPE_CODES or sys.byteorder != "little" or value.dim() > _MAX_DIMS:
        return ColumnPlan(value)
    rank = value.dim() - 1
    if not value.is_nested:
        inner = tuple(int(d) for d in value.shape[2:])
        if 0 in inner:
            return ColumnPlan(value)  # zero-size trailing dims: a row's length is not in its bytes
        return _exact_rows(value, rank, inner)
    if value.layout != torch.jagged or getattr(value, "_ragged_idx", 1) != 1:
        return ColumnPlan(value)
    values, starts, lengths = jagged_rows(value)
    inner = tuple(int(d) for d in values.shape[1:])
    if 0 in inner:
        return ColumnPlan(value)
    n = int(lengths.shape[0])
    per_row = values.element_size() * int(np.prod(inner, dtype=np.int64))
    nbytes = (lengths * per_row).numpy()
    first = (starts * per_row).numpy()
    if value.lengths() is None and int(nbytes.min()) == int(nbytes.max()) and nbytes[0] > 0:
        # Equal rows of a compact jagged tensor: its values already are the dense rows.
        length = int(lengths[0])
        start = int(starts[0])
        dense = values[start : start + n * length].reshape(n, length, *inner)
        return _exact_rows(dense, rank, inner)
    return _padded_rows(values, first, nbytes, rank, inner)


@dataclass
class EncodedPut:
    """A put's columns as sent, and the library ``data_parser`` splitting them into rows (``None``: none encoded)."""

    wire: dict[str, Any]
    parser: Any


def encode_put(columns: Mapping[str, Any], n: int) -> EncodedPut:
    """Encode every column of a put (field -> CPU tensor or per-row ``NonTensorStack``) that a row layout describes.

    A ``NonTensorStack`` of per-sample tensors or one-entry ``PackedTensor``s goes as ``object_rows``.
    """
    wire: dict[str, Any] = {}
    plans: dict[str, tuple[bytes, int]] = {}
    for name, value in columns.items():
        if isinstance(value, NonTensorStack) and n > 0:
            matrix = object_rows.encode_rows(value.tolist())
            if matrix is not None:
                wire[name] = matrix
                plans[name] = (object_rows.MAGIC, LENGTH_BYTES)
                continue
        if not isinstance(value, torch.Tensor) or n == 0:
            wire[name] = value
            continue
        plan = plan_column(value)
        wire[name] = plan.value
        if plan.descriptor is not None:
            plans[name] = (plan.descriptor, plan.header)
    if not plans:
        return EncodedPut(wire, None)
    _ship_splitter_by_value()
    return EncodedPut(wire, functools.partial(row_split.split_rows, columns=plans))


def _parse_descriptor(row: bytes, field: str) -> tuple[torch.dtype, int, tuple[int, ...], int]:
    if len(row) < _HEAD.size:
        raise RuntimeError(f"field {field!r}: a stored row is too short for its descriptor")
    magic, code, rank = _HEAD.unpack_from(row)
    if magic != MAGIC or code not in DTYPES_BY_CODE:
        raise RuntimeError(f"field {field!r}: a stored row has no valid row-layout descriptor")
    n_inner = max(rank - 1, 0)
    header = _HEAD.size + 8 * n_inner
    if len(row) < header:
        raise RuntimeError(f"field {field!r}: a stored row is too short for its descriptor")
    inner = struct.unpack_from(f"<{n_inner}q", row, _HEAD.size)
    return DTYPES_BY_CODE[code], rank, tuple(inner), header


def _row_tensor(row: Any, field: str) -> torch.Tensor:
    """One stored row as a tensor (a row-layout ``bytes`` value or a library tensor)."""
    if isinstance(row, torch.Tensor):
        return row
    dtype, rank, inner, header = _parse_descriptor(row, field)
    data = torch.frombuffer(bytearray(row[header:]), dtype=torch.uint8) if len(row) > header else (
        torch.empty(0, dtype=torch.uint8)
    )
    values = data.view(dtype)
    return values.reshape(()) if rank == 0 else values.reshape(-1, *inner)


def decode_column(value: Any, field: str) -> Any:
    """Turn a column read back from the library into what was put.

    A dense tensor when all rows share one shape, else a jagged nested tensor ragged in dim 1; object
    rows as a per-row ``NonTensorStack``; the library's own layout through :func:`densify`.

    Raises:
        RuntimeError: A stored row is malformed.
    """
    if isinstance(value, torch.Tensor):
        return densify(value)
    rows = value if isinstance(value, list) else value.tolist() if hasattr(value, "tolist") else value
    if not isinstance(rows, list) or not rows or not any(isinstance(r, bytes) for r in rows):
        return densify(value)
    if any(object_rows.is_object_row(r) for r in rows):
        # rows written by another put in the library's layout stay as they came
        return NonTensorStack.from_list(
            [object_rows.decode_row(r, field) if object_rows.is_object_row(r) else r for r in rows]
        )
    first = rows[0]
    if not all(isinstance(r, bytes) for r in rows) or not isinstance(first, bytes):
        return stack_or_nest([_row_tensor(r, field) for r in rows])
    dtype, rank, inner, header = _parse_descriptor(first, field)
    head = first[:header]
    if not all(r.startswith(head) for r in rows):
        return stack_or_nest([_row_tensor(r, field) for r in rows])
    itemsize = dtype.itemsize
    per_row = itemsize * int(np.prod(inner, dtype=np.int64)) if rank else itemsize
    sizes = np.fromiter((len(r) - header for r in rows), dtype=np.int64, count=len(rows))
    if per_row == 0 or (sizes % per_row).any():
        raise RuntimeError(
            f"field {field!r}: a stored row's size is not a whole number of {dtype} elements"
        )
    total = int(sizes.sum())
    buf = torch.empty(total, dtype=torch.uint8)
    out = memoryview(buf.numpy())
    pos = 0
    for r, size in zip(rows, sizes.tolist()):
        if size:
            out[pos : pos + size] = memoryview(r)[header:]
            pos += size
    values = buf.view(dtype)
    n = len(rows)
    if rank == 0:
        if int(sizes.min()) != per_row or int(sizes.max()) != per_row:
            raise RuntimeError(f"field {field!r}: a scalar row does not hold exactly one {dtype}")
        return values
    lengths = sizes // per_row
    if int(lengths.min()) == int(lengths.max()):
        return values.reshape(n, int(lengths[0]), *inner)
    offsets = torch.zeros(n + 1, dtype=torch.int64)
    offsets[1:] = torch.from_numpy(np.cumsum(lengths))
    return torch.nested.nested_tensor_from_jagged(values.reshape(-1, *inner), offsets)
