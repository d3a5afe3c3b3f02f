"""Checkpoints of the process-local data plane: typed, pickle-free, exact (format version 2).

Why it exists: a Local checkpoint must give back every value the store accepts exactly - same
value, same Python type - and loading one must never execute code.  This module turns the
client's partitions into a JSON manifest plus one flat tensor table (``tensors.pt``, read back
with ``torch.load(weights_only=True)``) and rebuilds partitions from them; the client
(``local.py``) only takes the lock and calls it.

Layout of ``<dir>/manifest.json`` (version 2): format, version, ``next_generation``, user
``metadata`` (plain JSON) and one record per partition (id, schema, ``num_samples``, consumer
tasks, group size, enums, generation, written flag, ordered sample ids, tags, per-task
cursors, field kinds and columns).  Tensor columns name their key in the table (jagged ones
also an offsets key); object columns hold one typed value node per row, and tags one node (or
``null``) per row, both in the encoding of ``nemo_dp.data_plane.value_codec``.  A
``PackedTensor`` column (``"kind": "packed"``) holds its ``dim_to_pack`` and one tensor node (or
``null``) per row; a dict column (``"kind": "dict"``) one such record per key, each with its
``field_kind``.  Version-1
checkpoints (object values and tags as plain JSON) still load.

A value the encoding cannot represent makes :func:`snapshot` raise ``TypeError`` naming the
partition, field (or tags) and sample id; the caller runs it before anything is written, so the
previous checkpoint stays intact.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nemo_dp.data_plane.adapters._validation import CorruptCheckpointError as _Corrupt
from nemo_dp.data_plane.adapters._validation import expect as _expect, str_list as _str_list, is_int as _is_int
from nemo_dp.data_plane.adapters.local.store import (
    DICT_KIND,
    OBJECT_KIND,
    PACKED_KIND,
    Column,
    DenseColumn,
    DictColumn,
    JaggedColumn,
    ObjectColumn,
    PackedColumn,
    Partition,
    Selection,
    compact,
)
from nemo_dp.data_plane.schema import RESERVED_PREFIX
from nemo_dp.data_plane.value_codec import (
    CorruptValueError,
    UnencodableValueError,
    ValueEncoder,
    decode_value,
)
from nemo_dp.utils.checkpoint_io import read_manifest, resolve_checkpoint_dir, write_manifest

__all__ = [
    "LOCAL_CHECKPOINT_FORMAT",
    "LOCAL_CHECKPOINT_VERSION",
    "TENSORS_FILE",
    "read_checkpoint",
    "snapshot",
    "write_snapshot",
]

LOCAL_CHECKPOINT_FORMAT = "nemo_dp.local_data_plane"
LOCAL_CHECKPOINT_VERSION = 2
_READABLE_VERSIONS = (1, 2)
TENSORS_FILE = "tensors.pt"


# ---------------------------------------------------------------------------------------------
# save
# ---------------------------------------------------------------------------------------------


def _encode(
    encoder: ValueEncoder, value: Any, partition_id: str, what: str, sample_id: str
) -> Any:
    try:
        return encoder.encode(value)
    except UnencodableValueError as exc:
        raise UnencodableValueError(
            f"save_checkpoint: partition {partition_id!r} {what} of sample id {sample_id!r} "
            f"cannot be saved: {exc}"
        ) from exc


def _encode_tags(
    part: Partition, ids: list[str], tensors: dict[str, torch.Tensor], prefix: str
) -> list[Any]:
    encoder = ValueEncoder(tensors, prefix)
    pid = part.partition_id
    return [
        None if sid not in part.tags else _encode(encoder, part.tags[sid], pid, "tags", sid)
        for sid in ids
    ]


def _column_record(
    col: Column,
    key: str,
    ids: list[str],
    sel: Selection,
    tensors: dict[str, torch.Tensor],
    where: tuple[str, str],
) -> dict[str, Any]:
    """The manifest record of one stored column's live rows (its tensors added to ``tensors``)."""
    pid, what = where
    everything = sel.run == (0, col.num_rows) or (not ids and col.num_rows == 0)
    if isinstance(col, ObjectColumn):
        encoder = ValueEncoder(tensors, f"{key}.v")
        values = [
            _encode(encoder, col.values[pos], pid, what, sid) for sid, pos in zip(ids, sel.positions)
        ]
        return {"kind": "object", "values": values}
    if isinstance(col, PackedColumn):
        encoder = ValueEncoder(tensors, f"{key}.v")
        values = [
            _encode(encoder, col.entries[pos], pid, what, sid) for sid, pos in zip(ids, sel.positions)
        ]
        return {"kind": PACKED_KIND, "dim_to_pack": col.dim_to_pack, "values": values}
    if isinstance(col, DictColumn):
        subs = {}
        for i, (sub, sub_col) in enumerate(col.columns.items()):
            record = _column_record(sub_col, f"{key}.d{i}", ids, sel, tensors, (pid, f"{what}[{sub!r}]"))
            subs[sub] = {**record, "field_kind": sub_col.kind}
        return {"kind": DICT_KIND, "columns": subs}
    if isinstance(col, DenseColumn):
        tensors[key] = compact(col.data if everything else col.take(sel))
        return {"kind": "tensor", "layout": "dense", "key": key}
    values_t, offsets_t = (col.values, col.offsets) if everything else col.take_parts(sel)
    tensors[key] = compact(values_t)
    tensors[f"{key}.offsets"] = compact(offsets_t)
    return {"kind": "tensor", "layout": "jagged", "key": key, "offsets_key": f"{key}.offsets"}


def snapshot(
    partitions: Iterable[Partition], next_generation: int, user_metadata: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The manifest and tensor table of a checkpoint of ``partitions`` (nothing written).

    Every object value and tag is encoded with the typed value codec; tensors (columns and
    tensors inside objects) go into one flat table.

    Args:
        partitions: The live partitions, in registration order.
        next_generation: The generation the next registration would get.
        user_metadata: The validated user metadata.

    Returns:
        ``(manifest, tensors)``.

    Raises:
        TypeError: A stored object value or tag cannot be encoded exactly (message names the
            partition, the field or tags, and the sample id).
    """
    tensors: dict[str, torch.Tensor] = {}
    records: list[dict[str, Any]] = []
    for p_index, part in enumerate(partitions):
        ids = list(part.row_of)
        sel = Selection.of([part.row_of[sid] for sid in ids])
        columns: dict[str, Any] = {}
        for c_index, (name, col) in enumerate(part.columns.items()):
            where = (part.partition_id, f"field {name!r}")
            columns[name] = _column_record(col, f"p{p_index}.c{c_index}", ids, sel, tensors, where)
        records.append(
            {
                "partition_id": part.partition_id,
                "fields": list(part.fields),
                "num_samples": part.num_samples,
                "consumer_tasks": list(part.consumer_tasks),
                "grpo_group_size": part.grpo_group_size,
                "enums": {k: list(v) for k, v in part.enums.items()},
                "generation": part.generation,
                "written": part.written,
                "sample_ids": ids,
                "tags": _encode_tags(part, ids, tensors, f"p{p_index}.tags"),
                "cursors": {
                    t: [sid for sid in ids if sid in part.claimed[t]]
                    for t in part.consumer_tasks
                },
                "field_kinds": dict(part.field_kinds),
                "columns": columns,
            }
        )
    manifest = {
        "format": LOCAL_CHECKPOINT_FORMAT,
        "format_version": LOCAL_CHECKPOINT_VERSION,
        "next_generation": next_generation,
        "metadata": user_metadata,
        "partitions": records,
    }
    # Serialise once now so a bad value fails before the temp dir exists.
    json.dumps(manifest, allow_nan=False)
    return manifest, tensors


def write_snapshot(
    directory: Path, manifest: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> None:
    """Write a :func:`snapshot` into ``directory`` (the atomic writer's temp dir).

    Args:
        directory: An existing, empty directory.
        manifest: The manifest from :func:`snapshot`.
        tensors: The tensor table from :func:`snapshot`.
    """
    torch.save(tensors, directory / TENSORS_FILE)
    write_manifest(directory, manifest)


def read_checkpoint(
    checkpoint_dir: Any, max_partitions: int
) -> tuple[dict[str, Partition], int, dict[str, Any]]:
    """Read and validate a Local checkpoint (versions 1 and 2) without touching any client.

    Args:
        checkpoint_dir: The checkpoint directory.
        max_partitions: The loading client's partition limit.

    Returns:
        ``(partitions by id, next_generation, a copy of the user metadata)``.

    Raises:
        FileNotFoundError: Missing directory (naming a surviving ``.old-*``) or manifest.
        ValueError: Unknown format/version, corrupt or inconsistent manifest or tensor file
            (naming the file), or more partitions than ``max_partitions``.
    """
    root = resolve_checkpoint_dir(checkpoint_dir)
    manifest = read_manifest(
        root, expected_format=LOCAL_CHECKPOINT_FORMAT, supported_versions=_READABLE_VERSIONS
    )
    return _restore(manifest, root / "manifest.json", root / TENSORS_FILE, max_partitions)


def _value(node: Any, typed: bool, tensors: dict[str, torch.Tensor], where: str) -> Any:
    """Decode one stored object value or tag (version 1 stored plain JSON)."""
    if not typed:
        return node
    try:
        return decode_value(node, tensors, where)
    except CorruptValueError as exc:
        raise _Corrupt(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# load (pure: builds new partitions, touches no client state)
# ---------------------------------------------------------------------------------------------


def _load_tensor_file(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ValueError(f"checkpoint tensor file {str(path)!r} is missing")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unpickling/format error: never retried without weights_only
        raise ValueError(
            f"checkpoint tensor file {str(path)!r} could not be loaded safely "
            f"(weights-only): {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(loaded, dict) or not all(
        isinstance(k, str) and type(v) is torch.Tensor and not v.is_nested
        for k, v in loaded.items()
    ):
        raise ValueError(f"checkpoint tensor file {str(path)!r} is not a flat dict of tensors")
    return loaded


def _restore(
    manifest: dict[str, Any], manifest_path: Path, tensor_path: Path, max_partitions: int
) -> tuple[dict[str, Partition], int, dict[str, Any]]:
    where = f"checkpoint manifest {str(manifest_path)!r}"
    next_generation = manifest.get("next_generation")
    _expect(_is_int(next_generation) and next_generation >= 1, where, "bad next_generation")
    metadata = manifest.get("metadata")
    _expect(isinstance(metadata, dict), where, "metadata must be an object")
    records = manifest.get("partitions")
    _expect(isinstance(records, list), where, "partitions must be a list")
    if len(records) > max_partitions:
        raise ValueError(
            f"{where} holds {len(records)} partitions, above this client's partition limit "
            f"(max_partitions={max_partitions})"
        )
    tensors = _load_tensor_file(tensor_path)
    typed = manifest.get("format_version") != 1
    partitions: dict[str, Partition] = {}
    for r_index, rec in enumerate(records):
        rwhere = f"{where} partitions[{r_index}]"
        part = _restore_partition(rec, rwhere, tensors, tensor_path, typed)
        pid = part.partition_id
        _expect(pid not in partitions, where, f"partition {pid!r} appears twice")
        _expect(
            part.generation < next_generation,
            where,
            f"generation of {pid!r} is not below next_generation",
        )
        partitions[part.partition_id] = part
    gens = [p.generation for p in partitions.values()]
    _expect(len(set(gens)) == len(gens), where, "partition generations are not unique")
    return partitions, next_generation, copy.deepcopy(metadata)


@dataclass(frozen=True)
class _ColumnContext:
    """What restoring one partition's columns needs (rows, tensor table, message locations)."""

    n: int
    ids: list[str]
    tensors: dict[str, torch.Tensor]
    typed: bool
    where: str
    twhere: str
    vwhere: str


def _restore_column(col: Any, name: str, kind_name: str, ctx: _ColumnContext) -> Column:
    """Rebuild one column record (``name`` is its quoted name, e.g. ``'img'['pixels']``)."""
    n, ids, tensors, where, twhere = ctx.n, ctx.ids, ctx.tensors, ctx.where, ctx.twhere
    _expect(isinstance(col, dict), where, f"column {name} must be an object")
    kind = col.get("kind")
    if kind in ("object", PACKED_KIND):
        values = col.get("values")
        ok_values = isinstance(values, list) and len(values) == n
        _expect(ok_values, where, f"column {name} must hold {n} values")
        expected = OBJECT_KIND if kind == "object" else PACKED_KIND
        _expect(kind_name == expected, where, f"column {name} kind mismatch")
        decoded = [
            _value(node, ctx.typed, tensors, f"{ctx.vwhere} column {name} sample {sid!r}")
            for sid, node in zip(ids, values)
        ]
        if kind == "object":
            return ObjectColumn(decoded)
        dim = col.get("dim_to_pack")
        _expect(_is_int(dim), where, f"column {name} needs an int dim_to_pack")
        ok_entries = all(v is None or type(v) is torch.Tensor for v in decoded)
        _expect(ok_entries, where, f"column {name} entries must be tensors or null")
        return PackedColumn(decoded, dim)
    if kind == DICT_KIND:
        _expect(kind_name == DICT_KIND, where, f"column {name} kind mismatch")
        subs = col.get("columns")
        ok_subs = isinstance(subs, dict) and bool(subs) and all(isinstance(k, str) and k for k in subs)
        _expect(ok_subs, where, f"column {name} must hold a non-empty object of sub-columns")
        out: dict[str, Column] = {}
        for sub, rec in subs.items():
            sub_kind = rec.get("field_kind") if isinstance(rec, dict) else None
            _expect(isinstance(sub_kind, str), where, f"column {name}[{sub!r}] needs a field_kind")
            out[sub] = _restore_column(rec, f"{name}[{sub!r}]", sub_kind, ctx)
        return DictColumn(out)
    _expect(kind == "tensor", where, f"column {name} has unknown kind {kind!r}")
    key = col.get("key")
    ok_key = isinstance(key, str) and key in tensors
    _expect(ok_key, twhere, f"tensor {key!r} of column {name} is missing")
    data = tensors[key]
    _expect(
        str(data.dtype) == kind_name,
        twhere,
        f"column {name} has dtype {data.dtype}, manifest says {kind_name}",
    )
    layout = col.get("layout")
    if layout == "dense":
        ok_rows = data.dim() >= 1 and data.size(0) == n
        _expect(ok_rows, twhere, f"column {name} must have {n} rows")
        return DenseColumn(data.contiguous())
    if layout == "jagged":
        okey = col.get("offsets_key")
        ok_okey = isinstance(okey, str) and okey in tensors
        _expect(ok_okey, twhere, f"offsets of column {name} are missing")
        offsets = tensors[okey]
        _expect(
            offsets.dtype == torch.long
            and offsets.dim() == 1
            and offsets.numel() == n + 1
            and data.dim() >= 1
            and int(offsets[0]) == 0
            and int(offsets[-1]) == data.size(0)
            and bool((offsets[1:] >= offsets[:-1]).all()),
            twhere,
            f"offsets of column {name} are inconsistent",
        )
        return JaggedColumn(data.contiguous(), offsets.contiguous())
    raise _Corrupt(f"{where}: column {name} has unknown layout {layout!r}")


def _restore_partition(
    rec: Any, where: str, tensors: dict[str, torch.Tensor], tensor_path: Path, typed: bool
) -> Partition:
    _expect(isinstance(rec, dict), where, "must be an object")
    pid = rec.get("partition_id")
    ok_pid = isinstance(pid, str) and bool(pid) and not pid.startswith(RESERVED_PREFIX)
    _expect(ok_pid, where, "bad partition_id")
    fields = _str_list(rec.get("fields"), where, "fields")
    tasks = _str_list(rec.get("consumer_tasks"), where, "consumer_tasks")
    num_samples = rec.get("num_samples")
    _expect(_is_int(num_samples) and num_samples >= 1, where, "bad num_samples")
    group = rec.get("grpo_group_size")
    ok_group = group is None or (_is_int(group) and group >= 1 and num_samples % group == 0)
    _expect(ok_group, where, "bad grpo_group_size")
    generation = rec.get("generation")
    _expect(_is_int(generation) and generation >= 1, where, "bad generation")
    written = rec.get("written")
    _expect(isinstance(written, bool), where, "bad written flag")
    enums_rec = rec.get("enums")
    _expect(isinstance(enums_rec, dict), where, "enums must be an object")
    enums: dict[str, tuple[str, ...]] = {}
    for name, words in enums_rec.items():
        _expect(name in fields, where, f"enums key {name!r} is not a field")
        enums[name] = tuple(_str_list(words, where, f"enums[{name!r}]"))
    ids = rec.get("sample_ids")
    _expect(isinstance(ids, list), where, "sample_ids must be a list")
    ids = _str_list(ids, where, "sample_ids")
    _expect(written or not ids, where, "rows present in an unwritten partition")
    tags_rec = rec.get("tags")
    ok_tags = isinstance(tags_rec, list) and len(tags_rec) == len(ids)
    _expect(ok_tags, where, "tags must align with sample_ids")
    tags: dict[str, dict[str, Any]] = {}
    vwhere = f"{where} (tensors in {str(tensor_path)!r})"
    for sid, node in zip(ids, tags_rec):
        tag = None if node is None else _value(node, typed, tensors, f"{vwhere} tags of {sid!r}")
        ok_tag = tag is None or type(tag) is dict
        _expect(ok_tag, where, f"tag of {sid!r} must be an object or null")
        if tag is not None:
            tags[sid] = tag
    cursors = rec.get("cursors")
    ok_cursors = isinstance(cursors, dict) and set(cursors) == set(tasks)
    _expect(ok_cursors, where, "cursors must list every consumer task")
    id_set = set(ids)
    claimed: dict[str, set[str]] = {}
    for task in tasks:
        claimed_ids = _str_list(cursors[task], where, f"cursors[{task!r}]")
        ok_claimed = set(claimed_ids) <= id_set
        _expect(ok_claimed, where, f"cursors[{task!r}] names ids that are not rows")
        claimed[task] = set(claimed_ids)
    kinds = rec.get("field_kinds")
    ok_kinds = isinstance(kinds, dict) and all(
        k in fields and isinstance(v, str) for k, v in kinds.items()
    )
    _expect(ok_kinds, where, "bad field_kinds")
    columns_rec = rec.get("columns")
    ok_columns = isinstance(columns_rec, dict) and set(columns_rec) <= set(kinds)
    _expect(ok_columns, where, "columns must have field_kinds")
    n = len(ids)
    twhere = f"checkpoint tensor file {str(tensor_path)!r} ({where})"
    ctx = _ColumnContext(n, ids, tensors, typed, where, twhere, vwhere)
    columns = {name: _restore_column(col, repr(name), kinds[name], ctx) for name, col in columns_rec.items()}
    return Partition(
        partition_id=pid,
        fields=tuple(fields),
        num_samples=num_samples,
        consumer_tasks=tuple(tasks),
        grpo_group_size=group,
        enums=enums,
        generation=generation,
        written=written,
        row_of={sid: i for i, sid in enumerate(ids)},
        columns=columns,
        field_kinds=dict(kinds),
        tags=tags,
        claimed=claimed,
    )
