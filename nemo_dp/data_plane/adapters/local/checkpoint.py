"""Checkpoints of the process-local data plane in the ``typed_checkpoint`` format: exact and pickle-free.

Versions 1 and 2 kept their tensors in ``tensors.pt`` (a pickle) and are refused unread.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

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
)
from nemo_dp.data_plane.typed_checkpoint import (
    PartitionHeader, column_entry, column_from_entry, decode_values, encode_values, expect, field_kinds,
    is_int, jagged_entry, new_manifest,
)
from nemo_dp.data_plane.typed_checkpoint import read_checkpoint as read_typed_checkpoint

LOCAL_CHECKPOINT_FORMAT = "nemo_dp.local_data_plane"
LOCAL_CHECKPOINT_VERSION = 3
_OLD_FILES = {1: ("tensors.pt",), 2: ("tensors.pt",)}


def _column_record(
    col: Column, key: str, ids: list[str], sel: Selection, tensors: dict[str, torch.Tensor], pid: str, what: str
) -> dict[str, Any]:
    """The manifest record of one stored column's live rows (its tensors added to ``tensors``)."""
    if isinstance(col, (ObjectColumn, PackedColumn)):
        rows = col.values if isinstance(col, ObjectColumn) else col.entries
        values = encode_values(tensors, f"{key}.v", [rows[pos] for pos in sel.positions], ids, pid, what)
        if isinstance(col, ObjectColumn):
            return {"kind": OBJECT_KIND, "values": values}
        return {"kind": PACKED_KIND, "dim_to_pack": col.dim_to_pack, "values": values}
    if isinstance(col, DictColumn):
        subs = {
            sub: {**_column_record(c, f"{key}.d{i}", ids, sel, tensors, pid, f"{what}[{sub!r}]"), "field_kind": c.kind}
            for i, (sub, c) in enumerate(col.columns.items())
        }
        return {"kind": DICT_KIND, "columns": subs}
    everything = sel.run == (0, col.num_rows) or (not ids and col.num_rows == 0)
    if isinstance(col, DenseColumn):
        return {"kind": "tensor", **column_entry(tensors, key, col.data if everything else col.take(sel))}  # type: ignore[dict-item]
    values, offsets = (col.values, col.offsets) if everything else col.take_parts(sel)
    return {"kind": "tensor", **jagged_entry(tensors, key, values, offsets)}


def snapshot(
    partitions: Iterable[Partition], next_generation: int, user_metadata: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The ``(manifest, tensors)`` of a checkpoint of ``partitions``, for ``write_checkpoint`` (nothing written).

    A partition record is the shared header plus ``generation``, ``written``, ``field_kinds`` and
    ``columns``: a ``"tensor"`` column entry of the table; ``"object"`` one typed value node per
    row; ``"packed"`` its ``dim_to_pack`` and one tensor node (or ``null``) per row; ``"dict"`` one
    such record per key with its ``field_kind``.  ``TypeError`` for a value that cannot be encoded exactly.
    """
    tensors: dict[str, torch.Tensor] = {}
    records: list[dict[str, Any]] = []
    for p_index, part in enumerate(partitions):
        pid = part.partition_id
        ids = list(part.row_of)
        sel = Selection.of([part.row_of[sid] for sid in ids])
        header = PartitionHeader(**part.header(ids))
        columns = {
            name: _column_record(col, f"p{p_index}.c{c_index}", ids, sel, tensors, pid, f"field {name!r}")
            for c_index, (name, col) in enumerate(part.columns.items())
        }
        records.append(
            {
                **header.to_record(tensors, f"p{p_index}.tags"),
                "generation": part.generation,
                "written": part.written,
                "field_kinds": dict(part.field_kinds),
                "columns": columns,
            }
        )
    manifest = new_manifest(
        LOCAL_CHECKPOINT_FORMAT, LOCAL_CHECKPOINT_VERSION, user_metadata, records, next_generation=next_generation
    )
    return manifest, tensors


def read_checkpoint(checkpoint_dir: Any, max_partitions: int) -> tuple[dict[str, Partition], int, dict[str, Any]]:
    """``(partitions by id, next_generation, a copy of the user metadata)`` of a Local checkpoint.

    Raises:
        FileNotFoundError: Missing directory (naming a surviving ``.old-*``) or manifest.
        ValueError: Unknown format/version, an older format or a file the format does not hold
            (refused unread), corrupt content (naming the file), or more than ``max_partitions``.
    """
    ck = read_typed_checkpoint(checkpoint_dir, LOCAL_CHECKPOINT_FORMAT, LOCAL_CHECKPOINT_VERSION, _OLD_FILES)
    where = ck.where
    next_generation = ck.manifest.get("next_generation")
    expect(is_int(next_generation) and next_generation >= 1, where, "bad next_generation")
    if len(ck.partitions) > max_partitions:
        raise ValueError(
            f"{where} holds {len(ck.partitions)} partitions, above this client's partition limit "
            f"(max_partitions={max_partitions})"
        )
    partitions: dict[str, Partition] = {}
    for r_index, rec in enumerate(ck.partitions):
        part = _restore_partition(rec, f"{where} partitions[{r_index}]", ck.tensors)
        ok = part.generation < next_generation
        expect(ok, where, f"generation of {part.partition_id!r} is not below next_generation")
        partitions[part.partition_id] = part
    gens = [p.generation for p in partitions.values()]
    expect(len(set(gens)) == len(gens), where, "partition generations are not unique")
    return partitions, next_generation, ck.metadata


def _restore_column(col: Any, where: str, kind_name: str, ids: list[str], tensors: dict[str, torch.Tensor]) -> Column:
    """Rebuild one column record whose field kind is ``kind_name``."""
    expect(isinstance(col, dict), where, "must be an object")
    kind = col.get("kind")
    if kind in (OBJECT_KIND, PACKED_KIND):
        expect(kind_name == kind, where, f"kind {kind!r}, the field holds {kind_name!r}")
        values = decode_values(col.get("values"), ids, tensors, where, "values")
        if kind == OBJECT_KIND:
            return ObjectColumn(values)
        dim = col.get("dim_to_pack")
        expect(is_int(dim), where, "needs an int dim_to_pack")
        expect(all(v is None or type(v) is torch.Tensor for v in values), where, "entries must be tensors or null")
        return PackedColumn(values, dim)
    if kind == DICT_KIND:
        expect(kind_name == DICT_KIND, where, f"kind {kind!r}, the field holds {kind_name!r}")
        subs = col.get("columns")
        ok = isinstance(subs, dict) and bool(subs) and all(isinstance(k, str) and k for k in subs)
        expect(ok, where, "must hold a non-empty object of sub-columns")
        out: dict[str, Column] = {}
        for sub, rec in subs.items():
            sub_kind = rec.get("field_kind") if isinstance(rec, dict) else None
            expect(isinstance(sub_kind, str), where, f"sub-column {sub!r} needs a field_kind")
            out[sub] = _restore_column(rec, f"{where}[{sub!r}]", sub_kind, ids, tensors)
        return DictColumn(out)
    expect(kind == "tensor", where, f"unknown kind {kind!r}")
    data = column_from_entry(col, tensors, len(ids), where, kind_name)
    return JaggedColumn(data.values(), data.offsets()) if data.is_nested else DenseColumn(data.contiguous())


def _restore_partition(rec: Any, where: str, tensors: dict[str, torch.Tensor]) -> Partition:
    h = PartitionHeader.from_record(rec, where, tensors)
    generation = rec.get("generation")
    expect(is_int(generation) and generation >= 1, where, "bad generation")
    written = rec.get("written")
    expect(isinstance(written, bool), where, "bad written flag")
    expect(written or not h.sample_ids, where, "rows present in an unwritten partition")
    kinds = field_kinds(rec, h.fields, where)
    columns = rec.get("columns")
    expect(isinstance(columns, dict) and set(columns) <= set(kinds), where, "columns must have field_kinds")
    return Partition(
        partition_id=h.partition_id,
        fields=tuple(h.fields),
        num_samples=h.num_samples,
        consumer_tasks=tuple(h.consumer_tasks),
        grpo_group_size=h.grpo_group_size,
        enums={k: tuple(v) for k, v in h.enums.items()},
        generation=generation,
        written=written,
        row_of={sid: i for i, sid in enumerate(h.sample_ids)},
        columns={
            name: _restore_column(col, f"{where} column {name!r}", kinds[name], h.sample_ids, tensors)
            for name, col in columns.items()
        },
        field_kinds=kinds,
        tags=h.tags,
        claimed={t: set(ids) for t, ids in h.claimed.items()},
    )
