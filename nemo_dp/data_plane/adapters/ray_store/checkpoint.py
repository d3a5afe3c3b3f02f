"""Checkpoints of the Ray object-store data plane: typed, pickle-free, exact, written by the driver.

Why this module exists: the store is cluster-wide (checkpoint scope ``"cluster"``), so the
bootstrapping client saves it once: it asks the metadata actor for a snapshot (schemas, rows,
claims, tags, object values and the chunk refs), fetches the chunks, and writes one atomic
directory: ``manifest.json`` (format ``nemo_dp.ray_store_data_plane`` version 1) plus one flat
tensor table ``tensors.pt`` read back with ``torch.load(weights_only=True)``.  Object values and
tags use the typed value codec (``nemo_dp.data_plane.value_codec``), so loading never executes
code and every stored value comes back exactly or the save is refused before anything is
written.

Manifest record per partition: ``partition_id``, ``fields``, ``num_samples``,
``consumer_tasks``, ``grpo_group_size``, ``enums``, ``field_kinds``, ``sample_ids`` (stored
order), ``tags`` (one typed node or ``null`` per row), ``claimed`` (task -> ids) and
``columns``: field -> ``{"kind": "tensor", "layout": "dense"|"jagged", "key", ["offsets_key"],
"ids"}`` (one row per id, in that order) or ``{"kind": "object", "ids", "values"}``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any

import torch

from nemo_dp.data_plane.adapters._validation import CorruptCheckpointError as _Corrupt
from nemo_dp.data_plane.adapters._validation import expect as _expect, str_list as _str_list
from nemo_dp.data_plane.adapters.ray_store.columns import (
    JAGGED,
    Segment,
    dtype_from_name,
    encode_column,
    gather_field,
)
from nemo_dp.data_plane.adapters.ray_store.state import OBJECT, TensorColumnSpec
from nemo_dp.data_plane.schema import RESERVED_PREFIX
from nemo_dp.data_plane.value_codec import (
    CorruptValueError,
    UnencodableValueError,
    ValueEncoder,
    decode_value,
)
from nemo_dp.utils.checkpoint_io import (
    read_manifest,
    resolve_checkpoint_dir,
    validate_json_metadata,
    write_checkpoint_atomically,
    write_manifest,
)

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "TENSORS_FILE", "RayStoreCheckpointMixin"]

CHECKPOINT_FORMAT = "nemo_dp.ray_store_data_plane"
CHECKPOINT_VERSION = 1
TENSORS_FILE = "tensors.pt"


# ---------------------------------------------------------------------------------------------
# save
# ---------------------------------------------------------------------------------------------


def _encode(encoder: ValueEncoder, value: Any, pid: str, what: str, sid: str) -> Any:
    try:
        return encoder.encode(value)
    except UnencodableValueError as exc:
        raise UnencodableValueError(
            f"save_checkpoint: partition {pid!r} {what} of sample id {sid!r} cannot be saved: {exc}"
        ) from exc


def build_snapshot(
    snap: Mapping[str, Any], payloads: Mapping[int, Any], user_metadata: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The manifest and tensor table of a checkpoint (nothing written).

    Args:
        snap: ``StoreState.snapshot()``.
        payloads: chunk id -> fetched payload.
        user_metadata: Validated user metadata.

    Returns:
        ``(manifest, tensors)``.

    Raises:
        TypeError: An object value or tag the typed codec cannot represent (names partition,
            field or tags, and sample id).
    """
    chunks = snap["chunks"]
    tensors: dict[str, torch.Tensor] = {}
    records: list[dict[str, Any]] = []
    for p_index, rec in enumerate(snap["partitions"]):
        pid = rec["partition_id"]
        ids = rec["sample_ids"]
        columns: dict[str, Any] = {}
        for c_index, (name, kind) in enumerate(rec["field_kinds"].items()):
            holders = [sid for sid in ids if name in rec["row_fields"][sid]]
            key = f"p{p_index}.c{c_index}"
            if kind == OBJECT:
                encoder = ValueEncoder(tensors, f"{key}.v")
                values = [
                    _encode(encoder, rec["values"][sid][name], pid, f"field {name!r}", sid)
                    for sid in holders
                ]
                columns[name] = {"kind": "object", "ids": holders, "values": values}
                continue
            if not holders:
                continue
            segments: list[Segment] = []
            last = -1
            for sid in holders:
                cid, pos = rec["cells"][sid][name]
                if cid == last:
                    segments[-1].positions.append(pos)
                else:
                    segments.append(Segment(chunks[cid][2], payloads[cid], [pos]))
                    last = cid
            data = gather_field(name, dtype_from_name(kind), segments)
            if data.is_nested:
                tensors[key] = data.values().contiguous()
                tensors[f"{key}.offsets"] = data.offsets().contiguous()
                columns[name] = {
                    "kind": "tensor",
                    "layout": JAGGED,
                    "key": key,
                    "offsets_key": f"{key}.offsets",
                    "ids": holders,
                }
            else:
                tensors[key] = data
                columns[name] = {"kind": "tensor", "layout": "dense", "key": key, "ids": holders}
        tag_encoder = ValueEncoder(tensors, f"p{p_index}.tags")
        records.append(
            {
                "partition_id": pid,
                "fields": list(rec["fields"]),
                "num_samples": rec["num_samples"],
                "consumer_tasks": list(rec["consumer_tasks"]),
                "grpo_group_size": rec["grpo_group_size"],
                "enums": rec["enums"],
                "field_kinds": dict(rec["field_kinds"]),
                "sample_ids": list(ids),
                "tags": [
                    None
                    if sid not in rec["tags"]
                    else _encode(tag_encoder, rec["tags"][sid], pid, "tags", sid)
                    for sid in ids
                ],
                "claimed": rec["claimed"],
                "columns": columns,
            }
        )
    manifest = {
        "format": CHECKPOINT_FORMAT,
        "format_version": CHECKPOINT_VERSION,
        "metadata": user_metadata,
        "partitions": records,
    }
    json.dumps(manifest, allow_nan=False)  # a bad value fails before the temp dir exists
    return manifest, tensors


# ---------------------------------------------------------------------------------------------
# load (pure: validates and rebuilds records, touches no store)
# ---------------------------------------------------------------------------------------------


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ValueError(f"checkpoint tensor file {str(path)!r} is missing")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unpickling/format error; never retried without weights_only
        raise ValueError(
            f"checkpoint tensor file {str(path)!r} could not be loaded safely (weights-only): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    ok = isinstance(loaded, dict) and all(
        isinstance(k, str) and type(v) is torch.Tensor and not v.is_nested for k, v in loaded.items()
    )
    if not ok:
        raise ValueError(f"checkpoint tensor file {str(path)!r} is not a flat dict of tensors")
    return loaded


def _decode(node: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    try:
        return decode_value(node, tensors, where)
    except CorruptValueError as exc:
        raise _Corrupt(str(exc)) from None


def _restore_record(
    rec: Any, where: str, tensors: dict[str, torch.Tensor]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate one partition record; return it with decoded values and its tensor columns."""
    _expect(isinstance(rec, dict), where, "must be an object")
    pid = rec.get("partition_id")
    ok = isinstance(pid, str) and bool(pid) and not pid.startswith(RESERVED_PREFIX)
    _expect(ok, where, "bad partition_id")
    fields = _str_list(rec.get("fields"), where, "fields")
    tasks = _str_list(rec.get("consumer_tasks"), where, "consumer_tasks")
    ids = _str_list(rec.get("sample_ids"), where, "sample_ids")
    id_set = set(ids)
    kinds = rec.get("field_kinds")
    ok = isinstance(kinds, dict) and all(k in fields and isinstance(v, str) for k, v in kinds.items())
    _expect(ok, where, "bad field_kinds")
    tags_rec = rec.get("tags")
    _expect(isinstance(tags_rec, list) and len(tags_rec) == len(ids), where, "tags must align with sample_ids")
    tags: dict[str, dict[str, Any]] = {}
    for sid, node in zip(ids, tags_rec):
        if node is not None:
            tag = _decode(node, tensors, f"{where} tags of {sid!r}")
            _expect(type(tag) is dict, where, f"tag of {sid!r} must be an object or null")
            tags[sid] = tag
    claimed = rec.get("claimed")
    _expect(isinstance(claimed, dict) and set(claimed) == set(tasks), where, "claimed must list every task")
    for task, got in claimed.items():
        _expect(set(_str_list(got, where, f"claimed[{task!r}]")) <= id_set, where, f"claimed[{task!r}] names unknown ids")
    columns_rec = rec.get("columns")
    _expect(isinstance(columns_rec, dict) and set(columns_rec) <= set(kinds), where, "columns must have field_kinds")
    row_fields: dict[str, list[str]] = {sid: [] for sid in ids}
    tensor_cols: dict[str, Any] = {}
    object_cols: dict[str, dict[str, Any]] = {}
    for name, col in columns_rec.items():
        _expect(isinstance(col, dict), where, f"column {name!r} must be an object")
        holders = _str_list(col.get("ids"), where, f"column {name!r} ids")
        _expect(set(holders) <= id_set, where, f"column {name!r} names unknown ids")
        for sid in holders:
            row_fields[sid].append(name)
        if col.get("kind") == "object":
            _expect(kinds[name] == OBJECT, where, f"column {name!r} kind mismatch")
            values = col.get("values")
            _expect(isinstance(values, list) and len(values) == len(holders), where, f"column {name!r} values must align with its ids")
            object_cols[name] = {
                sid: _decode(node, tensors, f"{where} column {name!r} sample {sid!r}")
                for sid, node in zip(holders, values)
            }
            continue
        _expect(col.get("kind") == "tensor", where, f"column {name!r} has an unknown kind")
        key = col.get("key")
        _expect(isinstance(key, str) and key in tensors, where, f"tensor {key!r} of column {name!r} is missing")
        data = tensors[key]
        _expect(str(data.dtype) == kinds[name], where, f"column {name!r} has dtype {data.dtype}, manifest says {kinds[name]}")
        if col.get("layout") == "dense":
            _expect(data.dim() >= 1 and data.size(0) == len(holders), where, f"column {name!r} must have {len(holders)} rows")
            tensor_cols[name] = (data, holders)
        elif col.get("layout") == JAGGED:
            okey = col.get("offsets_key")
            _expect(isinstance(okey, str) and okey in tensors, where, f"offsets of column {name!r} are missing")
            offsets = tensors[okey]
            _expect(
                offsets.dtype == torch.long
                and offsets.dim() == 1
                and offsets.numel() == len(holders) + 1
                and data.dim() >= 1
                and int(offsets[0]) == 0
                and int(offsets[-1]) == data.size(0)
                and bool((offsets[1:] >= offsets[:-1]).all()),
                where,
                f"offsets of column {name!r} are inconsistent",
            )
            tensor_cols[name] = (torch.nested.nested_tensor_from_jagged(data, offsets), holders)
        else:
            raise _Corrupt(f"{where}: column {name!r} has an unknown layout")
    out = {
        "partition_id": pid,
        "fields": fields,
        "num_samples": rec.get("num_samples"),
        "consumer_tasks": tasks,
        "grpo_group_size": rec.get("grpo_group_size"),
        "enums": rec.get("enums"),
        "field_kinds": dict(kinds),
        "sample_ids": ids,
        "row_fields": row_fields,
        "tags": tags,
        "claimed": {t: list(v) for t, v in claimed.items()},
        "columns": {name: (OBJECT, values) for name, values in object_cols.items()},
    }
    return out, tensor_cols


def read_checkpoint(checkpoint_dir: Any) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], dict]:
    """Read and validate a checkpoint without touching any store.

    Returns:
        ``([(record, tensor columns), ...], user metadata)``.

    Raises:
        FileNotFoundError: Missing directory (naming a surviving ``.old-*``) or manifest.
        ValueError: Unknown format/version, corrupt manifest or tensor file (naming the file).
    """
    root = resolve_checkpoint_dir(checkpoint_dir)
    manifest = read_manifest(root, expected_format=CHECKPOINT_FORMAT, supported_versions=(CHECKPOINT_VERSION,))
    where = f"checkpoint manifest {str(root / 'manifest.json')!r}"
    metadata = manifest.get("metadata")
    _expect(isinstance(metadata, dict), where, "metadata must be an object")
    records = manifest.get("partitions")
    _expect(isinstance(records, list), where, "partitions must be a list")
    tensors = _load_tensors(root / TENSORS_FILE)
    out = [_restore_record(rec, f"{where} partitions[{i}]", tensors) for i, rec in enumerate(records)]
    pids = [rec["partition_id"] for rec, _ in out]
    _expect(len(set(pids)) == len(pids), where, "a partition appears twice")
    return out, copy.deepcopy(metadata)


# ---------------------------------------------------------------------------------------------
# the client half
# ---------------------------------------------------------------------------------------------


class RayStoreCheckpointMixin:
    """``save_checkpoint`` / ``load_checkpoint`` of ``RayStoreClient``.

    Host contract: ``_check_open()``, ``_call(op, partition_id, *args)``,
    ``_chunk_payloads(chunks, partition_id, op)``, ``_used`` and ``_bootstrap``.
    """

    _used: bool
    _bootstrap: bool

    def _require_owner(self, op: str) -> None:
        if not self._bootstrap:
            raise RuntimeError(
                f"{op} is only available on the bootstrapping ray_store client (the driver); "
                "this client attached with bootstrap=False"
            )

    def save_checkpoint(
        self, checkpoint_dir: str | PathLike, *, metadata: Mapping | None = None
    ) -> None:
        """Atomically save every partition plus user ``metadata``.

        Raises:
            RuntimeError: Closed, or not the bootstrapping client.
            TypeError | ValueError: ``metadata`` is not JSON, or a stored object value or tag
                cannot be encoded exactly (nothing written).
        """
        self._check_open()  # type: ignore[attr-defined]
        self._require_owner("save_checkpoint")
        user_metadata = validate_json_metadata(metadata)
        snap = self._call("snapshot", "")  # type: ignore[attr-defined]
        payloads = self._chunk_payloads(snap["chunks"], "", "save_checkpoint")  # type: ignore[attr-defined]
        manifest, tensors = build_snapshot(snap, payloads, user_metadata)

        def write(tmp: Path) -> None:
            torch.save(tensors, tmp / TENSORS_FILE)
            write_manifest(tmp, manifest)

        write_checkpoint_atomically(checkpoint_dir, write)

    def load_checkpoint(self, checkpoint_dir: str | PathLike) -> dict:
        """Restore a checkpoint into this clean bootstrapping client; return the user metadata.

        Raises:
            RuntimeError: Closed, not the bootstrapping client, or not a clean client (a data
                operation or a load already ran, or the store holds partitions).
            FileNotFoundError: Missing directory or manifest.
            ValueError: Unknown format/version or corrupt content (naming the file).
        """
        import ray

        self._check_open()  # type: ignore[attr-defined]
        self._require_owner("load_checkpoint")
        if self._used:
            raise RuntimeError(
                "load_checkpoint needs a clean data-plane client: a data operation or a load "
                "already ran on this client"
            )
        self._used = True
        if not self._call("is_empty", ""):  # type: ignore[attr-defined]
            raise RuntimeError(
                "load_checkpoint needs a clean data-plane client: the cluster-wide store "
                "already holds partitions"
            )
        loaded, metadata = read_checkpoint(checkpoint_dir)
        records = []
        for rec, tensor_cols in loaded:
            for name, (data, holders) in tensor_cols.items():
                enc = encode_column(name, data)
                ref = ray.put({name: enc.payload})
                rec["columns"][name] = (TensorColumnSpec(enc.dtype, enc.layout, ref, name), holders)
            records.append(rec)
        try:
            self._call("restore", "", records)  # type: ignore[attr-defined]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint {str(checkpoint_dir)!r} could not be restored: {exc}") from exc
        return metadata
