"""The partition records of TransferQueue data-plane checkpoints (``typed_checkpoint`` plus ``backend``).

Version 1 held TransferQueue's own pickles and is refused unread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nemo_dp.data_plane.typed_checkpoint import (
    PartitionHeader, column_entry, column_from_entry, decode_values, encode_values, expect, str_list,
)

CHECKPOINT_FORMAT = "nemo_dp.tq_data_plane"
CHECKPOINT_FORMAT_VERSION = 2
OLD_FILES = {1: ("tq/controller_state.pkl", "tq/simple_storage/su_*.pkl")}
KIND_OBJECT = "object"


@dataclass
class PartitionState:
    """One partition as read through the adapter: header (ids in the controller's order), field -> ``(kind,
    dtype)``, and ``groups`` ``[(ids, {field: column})]`` of a tensor, per-row tensors or per-row objects.
    """

    header: PartitionHeader
    field_types: dict[str, tuple[str, str | None]]
    groups: list[tuple[list[str], dict[str, Any]]]


def encode_partition(state: PartitionState, index: int, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The manifest record of the ``index``-th partition; its tensors go into ``tensors``.

    The shared header (plain JSON tags) plus ``field_types`` (field -> ``[kind, dtype]``) and
    ``groups`` of rows holding the same fields, each ``{"ids", "columns"}`` with an entry per field
    (``dense`` / ``jagged``, ``rows``: one table key per row, or ``object``: one value node per row).

    Raises:
        UnencodableValueError: An object value cannot be stored exactly.
    """
    pid = state.header.partition_id
    groups = []
    for g_index, (ids, columns) in enumerate(state.groups):
        entries: dict[str, Any] = {}
        for c_index, (name, column) in enumerate(columns.items()):
            key = f"p{index}.g{g_index}.c{c_index}"
            if state.field_types.get(name, (None,))[0] == KIND_OBJECT:
                values = encode_values(tensors, f"{key}.v", column, ids, pid, f"field {name!r}")
                entries[name] = {"layout": KIND_OBJECT, "values": values}
                continue
            entry = column_entry(tensors, key, column) if isinstance(column, torch.Tensor) else None
            if entry is None:
                rows = list(column.unbind()) if isinstance(column, torch.Tensor) else list(column)
                for r_index, row in enumerate(rows):
                    tensors[f"{key}.r{r_index}"] = row.contiguous()
                entry = {
                    "layout": "rows",
                    "keys": [f"{key}.r{r_index}" for r_index in range(len(rows))],
                    "dtype": str(rows[0].dtype),
                }
            entries[name] = entry
        groups.append({"ids": list(ids), "columns": entries})
    return {
        **state.header.to_record(None, ""),
        "field_types": {k: list(v) for k, v in state.field_types.items()},
        "groups": groups,
    }


def _column(entry: Any, tensors: dict[str, torch.Tensor], ids: list[str], kind: str, dtype: Any, where: str) -> Any:
    expect(isinstance(entry, dict), where, "a column entry must be an object")
    layout = entry.get("layout")
    if kind == KIND_OBJECT:
        expect(layout == KIND_OBJECT, where, f"layout {layout!r} for an object field")
        return decode_values(entry.get("values"), ids, tensors, where, "values")
    if layout != "rows":
        return column_from_entry(entry, tensors, len(ids), where, dtype)
    expect(entry.get("dtype") == dtype, where, f"dtype {entry.get('dtype')!r}, the field is stored as {dtype!r}")
    keys = entry.get("keys")
    ok = isinstance(keys, list) and len(keys) == len(ids) and all(isinstance(k, str) and k in tensors for k in keys)
    expect(ok, where, f"must name {len(ids)} row tensors present in the tensor file")
    rows = [tensors[k] for k in keys]
    expect(all(str(r.dtype) == dtype for r in rows), where, "a row tensor has another dtype")
    return rows


def decode_partition(rec: Any, tensors: dict[str, torch.Tensor], where: str) -> PartitionState:
    """Validate one manifest record and rebuild its partition (``ValueError`` naming ``where`` and what)."""
    header = PartitionHeader.from_record(rec, where, None, every_task=False)
    types = rec.get("field_types")
    ok = isinstance(types, dict) and set(types) <= set(header.fields) and all(
        isinstance(v, list) and len(v) == 2 and v[0] in ("tensor", KIND_OBJECT)
        and (v[1] is None if v[0] == KIND_OBJECT else isinstance(v[1], str))
        for v in types.values()
    )  # fmt: skip
    expect(ok, where, "bad field_types")
    groups_rec = rec.get("groups")
    expect(isinstance(groups_rec, list), where, "groups must be a list")
    seen: set[str] = set()
    groups: list[tuple[list[str], dict[str, Any]]] = []
    for g_index, grp in enumerate(groups_rec):
        gwhere = f"{where} groups[{g_index}]"
        expect(isinstance(grp, dict), gwhere, "must be an object")
        gids = str_list(grp.get("ids"), gwhere, "ids")
        expect(bool(gids) and set(gids) <= set(header.sample_ids) and not (set(gids) & seen), gwhere, "ids must be new rows")
        seen |= set(gids)
        cols = grp.get("columns")
        ok = isinstance(cols, dict) and bool(cols) and set(cols) <= set(types)
        expect(ok, gwhere, "columns must name written fields")
        columns = {
            name: _column(entry, tensors, gids, types[name][0], types[name][1], f"{gwhere} field {name!r}")
            for name, entry in cols.items()
        }
        groups.append((gids, columns))
    return PartitionState(header, {k: (v[0], v[1]) for k, v in types.items()}, groups)
