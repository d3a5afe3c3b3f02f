"""The tensor half of a typed data-plane checkpoint: one flat safetensors table, no pickle.

A checkpoint writer collects every tensor (columns, and tensors inside object values encoded
by ``nemo_dp.data_plane.value_codec``) into one ``{key: tensor}`` table and its JSON manifest
refers to them by key.  :func:`save_tensor_table` writes the table with safetensors (a header of
JSON and raw bytes, so reading it never executes code); dtypes safetensors has no code for
(``complex128``, ...) are stored as their raw bytes and viewed back on load.  The column helpers
turn a dense or jagged column into manifest entries and back, validating everything read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "TENSORS_FILE",
    "CorruptTableError",
    "save_tensor_table",
    "load_tensor_table",
    "column_entry",
    "column_from_entry",
]

TENSORS_FILE = "tensors.safetensors"
_RAW_KEY = "nemo_dp.raw_dtypes"
_NATIVE = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
    torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2,
}  # fmt: skip


class CorruptTableError(ValueError):
    """A tensor table or a column entry that refers into it is malformed."""


def _dtype_from_name(name: Any, where: str) -> torch.dtype:
    attr = name[len("torch."):] if isinstance(name, str) and name.startswith("torch.") else None
    dtype = getattr(torch, attr, None) if attr else None
    if not isinstance(dtype, torch.dtype):
        raise CorruptTableError(f"{where}: unknown dtype {name!r}")
    return dtype


def save_tensor_table(path: str | Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write ``tensors`` to ``path`` with safetensors.

    Args:
        path: The file to write (inside the checkpoint's temp directory).
        tensors: Dense CPU tensors by key.

    Raises:
        TypeError: A value is not a dense CPU tensor (names the key).
    """
    from safetensors.torch import save_file

    out: dict[str, torch.Tensor] = {}
    raw: dict[str, list[Any]] = {}
    for key, t in tensors.items():
        if type(t) is not torch.Tensor or t.is_nested or t.layout != torch.strided or t.device.type != "cpu":
            raise TypeError(f"tensor table entry {key!r} must be a dense CPU torch.Tensor")
        t = t.detach().contiguous().clone()
        if t.dtype not in _NATIVE:
            raw[key] = [str(t.dtype), list(t.shape)]
            t = t.reshape(-1).view(torch.uint8)
        out[key] = t
    save_file(out, str(path), metadata={_RAW_KEY: json.dumps(raw)})


def load_tensor_table(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a table written by :func:`save_tensor_table`.

    Args:
        path: The safetensors file.

    Returns:
        The tensors by key.

    Raises:
        ValueError: The file is missing or is not a valid table (names the file).
    """
    from safetensors import safe_open

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"checkpoint tensor file {str(file)!r} is missing")
    where = f"checkpoint tensor file {str(file)!r}"
    try:
        with safe_open(str(file), framework="pt", device="cpu") as fh:
            meta = fh.metadata() or {}
            tensors = {key: fh.get_tensor(key) for key in fh.keys()}
    except Exception as exc:  # safetensors raises its own error types for a bad header
        raise ValueError(f"{where} is not a valid safetensors file: {type(exc).__name__}: {exc}") from exc
    try:
        raw = json.loads(meta.get(_RAW_KEY, "{}"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: bad {_RAW_KEY} metadata: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: bad {_RAW_KEY} metadata")
    for key, spec in raw.items():
        ok = (
            key in tensors
            and isinstance(spec, list)
            and len(spec) == 2
            and isinstance(spec[1], list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in spec[1])
        )
        if not ok:
            raise ValueError(f"{where}: bad raw-dtype entry for {key!r}")
        dtype = _dtype_from_name(spec[0], where)
        data = tensors[key]
        count = 1
        for d in spec[1]:
            count *= d
        if data.dtype != torch.uint8 or data.dim() != 1 or data.numel() != count * dtype.itemsize:
            raise ValueError(f"{where}: raw bytes of {key!r} do not match {spec[0]} {spec[1]}")
        tensors[key] = data.view(dtype).reshape(spec[1])
    return tensors


def column_entry(tensors: dict[str, torch.Tensor], key: str, data: torch.Tensor) -> dict[str, Any] | None:
    """Add a column to the table and return its manifest entry.

    Args:
        tensors: The table being built.
        key: The column's key (unique in the table).
        data: A dense tensor (one row per sample) or a jagged nested tensor ragged in dim 1.

    Returns:
        ``{"layout": "dense", "key", "dtype"}`` or ``{"layout": "jagged", "key",
        "offsets_key", "dtype"}``; ``None`` for any other layout (the caller stores rows).
    """
    if not data.is_nested:
        tensors[key] = data
        return {"layout": "dense", "key": key, "dtype": str(data.dtype)}
    if data.layout != torch.jagged or getattr(data, "_ragged_idx", 1) != 1 or data.lengths() is not None:
        return None
    offsets = data.offsets()
    start, end = int(offsets[0]), int(offsets[-1])
    tensors[key] = data.values()[start:end]
    tensors[f"{key}.offsets"] = offsets - start
    return {"layout": "jagged", "key": key, "offsets_key": f"{key}.offsets", "dtype": str(data.dtype)}


def column_from_entry(entry: Any, tensors: dict[str, torch.Tensor], rows: int, where: str) -> torch.Tensor:
    """Rebuild a column from :func:`column_entry`'s manifest entry, checking it fully.

    Args:
        entry: The manifest entry.
        tensors: The loaded table.
        rows: The number of rows the column must have.
        where: Location for error messages (file and position).

    Returns:
        The dense tensor or jagged nested tensor.

    Raises:
        CorruptTableError: A missing tensor, a wrong dtype, row count or inconsistent offsets.
    """
    if not isinstance(entry, dict):
        raise CorruptTableError(f"{where}: a column entry must be an object")
    key = entry.get("key")
    if not isinstance(key, str) or key not in tensors:
        raise CorruptTableError(f"{where}: tensor {key!r} is missing from the tensor file")
    data = tensors[key]
    if str(data.dtype) != entry.get("dtype"):
        raise CorruptTableError(f"{where}: tensor {key!r} has dtype {data.dtype}, the manifest says {entry.get('dtype')}")
    layout = entry.get("layout")
    if layout == "dense":
        if data.dim() < 1 or data.size(0) != rows:
            raise CorruptTableError(f"{where}: tensor {key!r} must have {rows} rows")
        return data
    if layout != "jagged":
        raise CorruptTableError(f"{where}: unknown column layout {layout!r}")
    okey = entry.get("offsets_key")
    offsets = tensors.get(okey) if isinstance(okey, str) else None
    ok = (
        offsets is not None
        and offsets.dtype == torch.int64
        and offsets.dim() == 1
        and offsets.numel() == rows + 1
        and data.dim() >= 1
        and int(offsets[0]) == 0
        and int(offsets[-1]) == data.size(0)
        and bool((offsets[1:] >= offsets[:-1]).all())
    )
    if not ok:
        raise CorruptTableError(f"{where}: offsets of tensor {key!r} are missing or inconsistent")
    return torch.nested.nested_tensor_from_jagged(data.contiguous(), offsets.contiguous())
