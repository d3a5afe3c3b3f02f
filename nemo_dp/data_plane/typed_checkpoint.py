"""Pickle-free data-plane checkpoints shared by the adapters: ``manifest.json`` plus ``tensors.safetensors``.

Older formats and foreign files (a pickle) are refused unread.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import torch

from nemo_dp.data_plane.schema import RESERVED_PREFIX
from nemo_dp.data_plane.value_codec import CorruptValueError, UnencodableValueError, ValueEncoder, decode_value
from nemo_dp.utils.checkpoint_io import (
    MANIFEST_NAME,
    read_manifest,
    resolve_checkpoint_dir,
    write_checkpoint_atomically,
    write_manifest,
)

__all__ = [
    "TENSORS_FILE",
    "CHECKPOINT_FILES",
    "CorruptCheckpointError",
    "expect",
    "is_int",
    "str_list",
    "save_tensor_table",
    "load_tensor_table",
    "column_entry",
    "jagged_entry",
    "column_from_entry",
    "encode_values",
    "decode_values",
    "PartitionHeader",
    "field_kinds",
    "new_manifest",
    "write_checkpoint",
    "CheckpointContents",
    "read_checkpoint",
]

TENSORS_FILE = "tensors.safetensors"
#: The only files a data-plane checkpoint holds.
CHECKPOINT_FILES: tuple[str, ...] = (MANIFEST_NAME, TENSORS_FILE)
_RAW_KEY = "nemo_dp.raw_dtypes"
_NATIVE = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
    torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2,
}  # fmt: skip


class CorruptCheckpointError(ValueError):
    """A data-plane checkpoint's manifest or tensor table is malformed or inconsistent."""


def expect(cond: bool, where: str, what: str) -> None:
    """Raise :class:`CorruptCheckpointError` ``"<where>: <what>"`` unless ``cond`` holds."""
    if not cond:
        raise CorruptCheckpointError(f"{where}: {what}")


def is_int(v: Any) -> bool:
    """``v`` is an ``int`` and not a ``bool``."""
    return isinstance(v, int) and not isinstance(v, bool)


def str_list(v: Any, where: str, what: str) -> list[str]:
    """``v`` as a list of distinct non-empty strings, or :class:`CorruptCheckpointError`."""
    expect(isinstance(v, list) and all(isinstance(x, str) and x for x in v), where, f"{what} must be a list of non-empty str")
    expect(len(set(v)) == len(v), where, f"{what} has duplicates")
    return list(v)


def save_tensor_table(path: str | Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write dense CPU ``tensors`` with safetensors (other dtypes as raw bytes); ``TypeError`` names a bad entry."""
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
    """Read a :func:`save_tensor_table` file; ``CorruptCheckpointError`` (naming it) if missing or invalid."""
    from safetensors import safe_open

    where = f"checkpoint tensor file {str(path)!r}"
    expect(Path(path).is_file(), where, "is missing")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            meta = fh.metadata() or {}
            tensors = {key: fh.get_tensor(key) for key in fh.keys()}
    except Exception as exc:  # safetensors raises its own error types for a bad header
        raise CorruptCheckpointError(f"{where}: not a valid safetensors file: {type(exc).__name__}: {exc}") from exc
    try:
        raw = json.loads(meta.get(_RAW_KEY, "{}"))
    except json.JSONDecodeError as exc:
        raise CorruptCheckpointError(f"{where}: bad {_RAW_KEY} metadata: {exc}") from exc
    expect(isinstance(raw, dict), where, f"bad {_RAW_KEY} metadata")
    for key, spec in raw.items():
        ok = key in tensors and isinstance(spec, list) and len(spec) == 2 and isinstance(spec[1], list)
        expect(ok and all(is_int(d) and d >= 0 for d in spec[1]), where, f"bad raw-dtype entry for {key!r}")
        name = spec[0]
        dtype = getattr(torch, name[len("torch.") :], None) if isinstance(name, str) and name.startswith("torch.") else None
        expect(isinstance(dtype, torch.dtype), where, f"unknown dtype {name!r}")
        data = tensors[key]
        count = math.prod(spec[1])
        ok = data.dtype == torch.uint8 and data.dim() == 1 and data.numel() == count * dtype.itemsize
        expect(ok, where, f"raw bytes of {key!r} do not match {name} {spec[1]}")
        tensors[key] = data.view(dtype).reshape(spec[1])
    return tensors


def jagged_entry(tensors: dict[str, torch.Tensor], key: str, values: torch.Tensor, offsets: torch.Tensor) -> dict[str, Any]:
    """Add a jagged column (``values``, int64 ``offsets`` from 0 to ``values.size(0)``); return its manifest entry."""
    tensors[key] = values
    tensors[f"{key}.offsets"] = offsets
    return {"layout": "jagged", "key": key, "offsets_key": f"{key}.offsets", "dtype": str(values.dtype)}


def column_entry(tensors: dict[str, torch.Tensor], key: str, data: torch.Tensor) -> dict[str, Any] | None:
    """Add a dense column or a jagged one ragged in dim 1 under unique ``key``; return its manifest entry.

    ``None`` for any other layout (the caller stores rows).
    """
    if not data.is_nested:
        tensors[key] = data
        return {"layout": "dense", "key": key, "dtype": str(data.dtype)}
    if data.layout != torch.jagged or getattr(data, "_ragged_idx", 1) != 1 or data.lengths() is not None:
        return None
    offsets = data.offsets()
    start, end = int(offsets[0]), int(offsets[-1])
    return jagged_entry(tensors, key, data.values()[start:end], offsets - start)


def column_from_entry(
    entry: Any, tensors: dict[str, torch.Tensor], rows: int, where: str, dtype: str | None = None
) -> torch.Tensor:
    """Rebuild and check a column of ``rows`` rows (of stored ``dtype``, unless ``None``) from its entry.

    Raises:
        CorruptCheckpointError: A missing tensor, a wrong dtype, row count or inconsistent offsets.
    """
    expect(isinstance(entry, dict), where, "a column entry must be an object")
    key = entry.get("key")
    expect(isinstance(key, str) and key in tensors, where, f"tensor {key!r} is missing from the tensor file")
    data = tensors[key]
    stored = entry.get("dtype")
    expect(dtype is None or stored == dtype, where, f"dtype {stored!r}, the field is stored as {dtype!r}")
    expect(str(data.dtype) == stored, where, f"tensor {key!r} has dtype {data.dtype}, the manifest says {stored}")
    layout = entry.get("layout")
    if layout == "dense":
        expect(data.dim() >= 1 and data.size(0) == rows, where, f"tensor {key!r} must have {rows} rows")
        return data
    expect(layout == "jagged", where, f"unknown column layout {layout!r}")
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
    expect(ok, where, f"offsets of tensor {key!r} are missing or inconsistent")
    return torch.nested.nested_tensor_from_jagged(data.contiguous(), offsets.contiguous())


def encode_values(
    tensors: dict[str, torch.Tensor], key: str, values: Sequence[Any], ids: Sequence[str], pid: str, what: str
) -> list[Any]:
    """One typed JSON node per row (tensors go into ``tensors`` under prefix ``key``).

    ``ids``, ``pid`` and ``what`` (e.g. ``"field 'x'"``) are for messages only.

    Raises:
        UnencodableValueError: A value cannot be stored exactly (names partition, ``what`` and sample id).
    """
    encoder = ValueEncoder(tensors, key)
    nodes = []
    for sid, value in zip(ids, values, strict=True):
        try:
            nodes.append(encoder.encode(value))
        except UnencodableValueError as exc:
            raise UnencodableValueError(
                f"save_checkpoint: partition {pid!r} {what} of sample id {sid!r} cannot be saved: {exc}"
            ) from exc
    return nodes


def decode_values(nodes: Any, ids: Sequence[str], tensors: dict[str, torch.Tensor], where: str, what: str) -> list[Any]:
    """Rebuild and check :func:`encode_values`' nodes; ``CorruptCheckpointError`` names a bad sample id."""
    expect(isinstance(nodes, list) and len(nodes) == len(ids), where, f"{what} must hold {len(ids)} values")
    try:
        return [decode_value(node, tensors, f"{where} {what} of sample {sid!r}") for sid, node in zip(ids, nodes)]
    except CorruptValueError as exc:
        raise CorruptCheckpointError(str(exc)) from None


@dataclass
class PartitionHeader:
    """The part of a partition record every adapter writes: schema, live ids (adapter's order), tags, claims.

    ``tags`` holds tagged ids only; ``claimed`` maps task -> ids in ``sample_ids`` order.
    """

    partition_id: str
    fields: list[str]
    consumer_tasks: list[str]
    num_samples: int
    grpo_group_size: int | None
    enums: dict[str, list[str]]
    sample_ids: list[str]
    tags: dict[str, dict[str, Any]]
    claimed: dict[str, list[str]]

    def to_record(self, tensors: dict[str, torch.Tensor] | None, key: str) -> dict[str, Any]:
        """The JSON record; tags' tensors go into ``tensors`` under prefix ``key`` (``None``: plain JSON tags)."""
        tags = [self.tags.get(sid) for sid in self.sample_ids]
        return {
            "partition_id": self.partition_id,
            "fields": list(self.fields),
            "consumer_tasks": list(self.consumer_tasks),
            "num_samples": self.num_samples,
            "grpo_group_size": self.grpo_group_size,
            "enums": {k: list(v) for k, v in self.enums.items()},
            "sample_ids": list(self.sample_ids),
            "tags": tags if tensors is None else encode_values(tensors, key, tags, self.sample_ids, self.partition_id, "tags"),
            "claimed": {t: list(ids) for t, ids in self.claimed.items()},
        }

    @classmethod
    def from_record(
        cls, rec: Any, where: str, tensors: dict[str, torch.Tensor] | None, *, every_task: bool = True
    ) -> PartitionHeader:
        """Validate a :meth:`to_record` record; ``CorruptCheckpointError`` for anything malformed or inconsistent.

        ``tensors`` is the table for typed tags (``None``: plain JSON tags); ``every_task=False`` lets
        ``claimed`` name a subset of the consumer tasks.
        """
        expect(isinstance(rec, dict), where, "must be an object")
        pid = rec.get("partition_id")
        expect(isinstance(pid, str) and bool(pid) and not pid.startswith(RESERVED_PREFIX), where, "bad partition_id")
        fields = str_list(rec.get("fields"), where, "fields")
        tasks = str_list(rec.get("consumer_tasks"), where, "consumer_tasks")
        num_samples = rec.get("num_samples")
        expect(is_int(num_samples) and num_samples >= 1, where, "bad num_samples")
        group = rec.get("grpo_group_size")
        expect(group is None or (is_int(group) and group >= 1 and num_samples % group == 0), where, "bad grpo_group_size")
        enums = rec.get("enums")
        expect(isinstance(enums, dict) and set(enums) <= set(fields), where, "enums must name declared fields")
        enums = {k: str_list(v, where, f"enums[{k!r}]") for k, v in enums.items()}
        ids = str_list(rec.get("sample_ids"), where, "sample_ids")
        tags = rec.get("tags")
        if tensors is not None:
            tags = decode_values(tags, ids, tensors, where, "tags")
        expect(isinstance(tags, list) and len(tags) == len(ids), where, "tags must align with sample_ids")
        expect(all(t is None or type(t) is dict for t in tags), where, "a tag must be an object or null")
        claimed = rec.get("claimed")
        ok = isinstance(claimed, dict) and (set(claimed) == set(tasks) if every_task else set(claimed) <= set(tasks))
        expect(ok, where, "claimed must name every consumer task" if every_task else "claimed must name consumer tasks only")
        claimed = {t: str_list(v, where, f"claimed[{t!r}]") for t, v in claimed.items()}
        for t, got in claimed.items():
            expect(set(got) <= set(ids), where, f"claimed[{t!r}] names ids that are not rows")
        return cls(
            pid, fields, tasks, num_samples, group, enums, ids, {s: t for s, t in zip(ids, tags) if t is not None}, claimed
        )


def field_kinds(rec: dict[str, Any], fields: Sequence[str], where: str) -> dict[str, str]:
    """``rec["field_kinds"]``: declared fields -> the kind (dtype name or value kind) they hold."""
    kinds = rec.get("field_kinds")
    ok = isinstance(kinds, dict) and set(kinds) <= set(fields) and all(isinstance(v, str) for v in kinds.values())
    expect(ok, where, "bad field_kinds")
    return dict(kinds)


def new_manifest(
    fmt: str, version: int, metadata: dict[str, Any], partitions: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """A checkpoint manifest (``extra``: adapter keys); ``TypeError``/``ValueError`` before any write if not JSON."""
    manifest = {"format": fmt, "format_version": version, **extra, "metadata": metadata, "partitions": partitions}
    json.dumps(manifest, allow_nan=False)
    return manifest


def write_checkpoint(checkpoint_dir: str | PathLike, manifest: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Atomically write ``manifest.json`` and ``tensors.safetensors``; on error a previous checkpoint is intact."""

    def write(tmp: Path) -> None:
        save_tensor_table(tmp / TENSORS_FILE, tensors)
        write_manifest(tmp, manifest)

    write_checkpoint_atomically(checkpoint_dir, write)


@dataclass(frozen=True)
class CheckpointContents:
    """A checkpoint read by :func:`read_checkpoint`; ``partitions`` are not yet validated (ids are distinct)."""

    manifest: dict[str, Any]
    where: str
    metadata: dict[str, Any]
    partitions: list[Any]
    tensors: dict[str, torch.Tensor]


def read_checkpoint(
    checkpoint_dir: str | PathLike, fmt: str, version: int, old_files: Mapping[int, Sequence[str]]
) -> CheckpointContents:
    """Read a checkpoint's manifest and tensor table, refusing unread what it must not load.

    ``version`` is the only format version read; ``old_files`` maps older versions to the relative
    paths of files they held that can run code.

    Raises:
        FileNotFoundError: Missing directory (naming a surviving ``.old-*``) or manifest.
        ValueError: Unknown format or version; an older format or a file the format does not
            hold (named, never read); a corrupt manifest or tensor table (naming the file).
    """
    root = resolve_checkpoint_dir(checkpoint_dir)
    manifest = read_manifest(root, expected_format=fmt, supported_versions=(*old_files, version))
    where = f"checkpoint manifest {str(root / MANIFEST_NAME)!r}"
    found = manifest["format_version"]
    if found != version:
        held = ", ".join(repr(str(root / name)) for name in old_files[found])
        raise ValueError(
            f"{where} has format_version {found} of {fmt!r}, an older format that is no longer supported: it held "
            f"{held}, which can run code when loaded (pickle), so the checkpoint is refused and none of its files "
            f"was read. This version reads format_version {version} ({MANIFEST_NAME} + {TENSORS_FILE}, no pickle); "
            "start a fresh run or resume from a checkpoint written by this version"
        )
    _refuse_foreign_files(root, version)
    metadata = manifest.get("metadata")
    expect(isinstance(metadata, dict), where, "metadata must be an object")
    records = manifest.get("partitions")
    expect(isinstance(records, list), where, "partitions must be a list")
    pids = [r.get("partition_id") for r in records if isinstance(r, dict)]
    expect(len(set(map(repr, pids))) == len(pids), where, "a partition appears twice")
    return CheckpointContents(manifest, where, copy.deepcopy(metadata), records, load_tensor_table(root / TENSORS_FILE))


def _refuse_foreign_files(root: Path, version: int) -> None:
    """Refuse a checkpoint directory holding anything but :data:`CHECKPOINT_FILES` (unread)."""
    files: list[Path] = []
    dirs: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        dirs += [base / name for name in sorted(dirnames)]
        files += [base / name for name in sorted(filenames)]
    foreign = [p for p in files if p.relative_to(root).as_posix() not in CHECKPOINT_FILES or p.is_symlink()]
    if foreign or dirs:
        path = (foreign or dirs)[0]
        raise ValueError(
            f"data-plane checkpoint {str(root)!r} holds {str(path)!r}, which is not part of its format "
            f"(format_version {version} holds only {list(CHECKPOINT_FILES)}); refusing to load it. The file was "
            "not read: a pickle (such as the tensors.pt of an older local or ray checkpoint, or TransferQueue's "
            "own controller_state.pkl or su_*.pkl) can run code when loaded"
        )
