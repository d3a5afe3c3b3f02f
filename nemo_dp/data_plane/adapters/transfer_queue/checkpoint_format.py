"""The on-disk format of TransferQueue data-plane checkpoints (version 2): JSON + safetensors.

A checkpoint directory holds exactly ``manifest.json`` and ``tensors.safetensors``; reading it
never executes code.  The manifest carries the format, version, backend, user ``metadata`` and
one record per partition, read through the adapter: ``partition_id``, ``fields``,
``consumer_tasks``, ``num_samples``, ``grpo_group_size``, ``enums``, ``field_types`` (field ->
``[kind, dtype]`` of every field written), ``sample_ids`` (in the controller's order), ``tags``
(one JSON object or ``null`` per id), ``claimed`` (task -> ids) and ``groups``: rows that hold
the same fields, each ``{"ids", "columns"}`` with a column entry per field (``dense`` /
``jagged`` into the tensor table, ``rows``: one table key per row, or ``object``: one node of
``nemo_dp.data_plane.value_codec`` per row).  This module builds and validates those records
and touches neither the library nor a client.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from nemo_dp.data_plane.adapters._validation import CorruptCheckpointError as _Corrupt
from nemo_dp.data_plane.adapters._validation import expect as _expect, str_list as _names, is_int as _is_int
from nemo_dp.data_plane.schema import RESERVED_PREFIX
from nemo_dp.data_plane.tensor_table import (
    TENSORS_FILE,
    CorruptTableError,
    column_entry,
    column_from_entry,
)
from nemo_dp.data_plane.value_codec import (
    CorruptValueError,
    UnencodableValueError,
    ValueEncoder,
    decode_value,
)
from nemo_dp.utils.checkpoint_io import MANIFEST_NAME

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_FORMAT_VERSION",
    "CHECKPOINT_FILES",
    "PartitionState",
    "encode_partition",
    "decode_partition",
    "refuse_foreign_files",
    "old_format_error",
]

CHECKPOINT_FORMAT = "nemo_dp.tq_data_plane"
CHECKPOINT_FORMAT_VERSION = 2
#: The only files a checkpoint of this format holds.
CHECKPOINT_FILES: tuple[str, ...] = (MANIFEST_NAME, TENSORS_FILE)
KIND_OBJECT = "object"


class PartitionState:
    """One partition as read through the adapter (or rebuilt from a checkpoint).

    Attributes:
        record: The registry fields (``partition_id``, ``fields``, ``consumer_tasks``,
            ``num_samples``, ``grpo_group_size``, ``enums``, ``field_types``).
        sample_ids: Live ids in the controller's order.
        tags: Id -> tag dict (``None``: no tag).
        claimed: Task -> ids claimed by it.
        groups: ``[(ids, {field: column})]``: a column is a tensor (dense or jagged), a list of
            per-row tensors, or a list of per-row objects (object fields).
    """

    def __init__(
        self,
        record: dict[str, Any],
        sample_ids: list[str],
        tags: dict[str, dict[str, Any] | None],
        claimed: dict[str, list[str]],
        groups: list[tuple[list[str], dict[str, Any]]],
    ) -> None:
        self.record = record
        self.sample_ids = sample_ids
        self.tags = tags
        self.claimed = claimed
        self.groups = groups


# ---------------------------------------------------------------------------------------------
# save
# ---------------------------------------------------------------------------------------------


def encode_partition(state: PartitionState, index: int, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The manifest record of one partition; its tensors go into ``tensors``.

    Args:
        state: The partition.
        index: Its position in the checkpoint (keys of its tensors).
        tensors: The checkpoint's tensor table (filled here).

    Returns:
        The JSON record.

    Raises:
        UnencodableValueError: An object value cannot be stored exactly (names partition,
            field and sample id).
    """
    pid = state.record["partition_id"]
    groups = []
    for g_index, (ids, columns) in enumerate(state.groups):
        entries: dict[str, Any] = {}
        for c_index, (name, column) in enumerate(columns.items()):
            key = f"p{index}.g{g_index}.c{c_index}"
            if state.record["field_types"].get(name, [None])[0] == KIND_OBJECT:
                encoder = ValueEncoder(tensors, f"{key}.v")
                values = []
                for sid, value in zip(ids, column, strict=True):
                    try:
                        values.append(encoder.encode(value))
                    except UnencodableValueError as exc:
                        raise UnencodableValueError(
                            f"save_checkpoint: partition {pid!r} field {name!r} of sample id "
                            f"{sid!r} cannot be saved: {exc}"
                        ) from exc
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
    rec = state.record
    return {
        "partition_id": pid,
        "fields": list(rec["fields"]),
        "consumer_tasks": list(rec["consumer_tasks"]),
        "num_samples": rec["num_samples"],
        "grpo_group_size": rec["grpo_group_size"],
        "enums": {k: list(v) for k, v in rec["enums"].items()},
        "field_types": {k: list(v) for k, v in rec["field_types"].items()},
        "sample_ids": list(state.sample_ids),
        "tags": [state.tags.get(sid) for sid in state.sample_ids],
        "claimed": {t: list(v) for t, v in state.claimed.items()},
        "groups": groups,
    }


# ---------------------------------------------------------------------------------------------
# load (pure: validates everything before any store is touched)
# ---------------------------------------------------------------------------------------------


def _column(entry: Any, tensors: dict[str, torch.Tensor], n: int, kind: str, dtype: Any, where: str) -> Any:
    _expect(isinstance(entry, dict), where, "a column entry must be an object")
    layout = entry.get("layout")
    if kind == KIND_OBJECT:
        _expect(layout == KIND_OBJECT, where, f"layout {layout!r} for an object field")
        values = entry.get("values")
        _expect(isinstance(values, list) and len(values) == n, where, f"must hold {n} values")
        try:
            return [decode_value(node, tensors, where) for node in values]
        except CorruptValueError as exc:
            raise _Corrupt(str(exc)) from None
    _expect(entry.get("dtype") == dtype, where, f"dtype {entry.get('dtype')!r}, the field is stored as {dtype!r}")
    if layout == "rows":
        keys = entry.get("keys")
        ok = isinstance(keys, list) and len(keys) == n and all(isinstance(k, str) and k in tensors for k in keys)
        _expect(ok, where, f"must name {n} row tensors present in the tensor file")
        rows = [tensors[k] for k in keys]
        _expect(all(str(r.dtype) == dtype for r in rows), where, "a row tensor has another dtype")
        return rows
    try:
        return column_from_entry(entry, tensors, n, where)
    except CorruptTableError as exc:
        raise _Corrupt(str(exc)) from None


def decode_partition(rec: Any, tensors: dict[str, torch.Tensor], where: str) -> PartitionState:
    """Validate one manifest record and rebuild its partition.

    Args:
        rec: The record read from the manifest.
        tensors: The loaded tensor table.
        where: Location for error messages (the manifest and the record's index).

    Returns:
        The partition state.

    Raises:
        ValueError: Anything malformed or inconsistent (names the file and what).
    """
    _expect(isinstance(rec, dict), where, "must be an object")
    pid = rec.get("partition_id")
    ok = isinstance(pid, str) and bool(pid) and not pid.startswith(RESERVED_PREFIX)
    _expect(ok, where, "bad partition_id")
    where = f"{where} (partition {pid!r})"
    fields = _names(rec.get("fields"), where, "fields")
    tasks = _names(rec.get("consumer_tasks"), where, "consumer_tasks")
    num_samples = rec.get("num_samples")
    _expect(_is_int(num_samples) and num_samples >= 1, where, "bad num_samples")
    group = rec.get("grpo_group_size")
    _expect(group is None or (_is_int(group) and group >= 1), where, "bad grpo_group_size")
    enums = rec.get("enums")
    _expect(isinstance(enums, dict) and set(enums) <= set(fields), where, "enums must name declared fields")
    enums = {k: _names(v, where, f"enums[{k!r}]") for k, v in enums.items()}
    types = rec.get("field_types")
    ok = isinstance(types, dict) and set(types) <= set(fields) and all(
        isinstance(v, list) and len(v) == 2 and v[0] in ("tensor", KIND_OBJECT)
        and (v[1] is None if v[0] == KIND_OBJECT else isinstance(v[1], str))
        for v in types.values()
    )
    _expect(ok, where, "bad field_types")
    ids = _names(rec.get("sample_ids"), where, "sample_ids")
    id_set = set(ids)
    tags_rec = rec.get("tags")
    _expect(isinstance(tags_rec, list) and len(tags_rec) == len(ids), where, "tags must align with sample_ids")
    _expect(all(t is None or isinstance(t, dict) for t in tags_rec), where, "a tag must be an object or null")
    claimed = rec.get("claimed")
    _expect(isinstance(claimed, dict) and set(claimed) <= set(tasks), where, "claimed must name consumer tasks")
    claimed = {t: _names(v, where, f"claimed[{t!r}]") for t, v in claimed.items()}
    for t, got in claimed.items():
        _expect(set(got) <= id_set, where, f"claimed[{t!r}] names ids that are not rows")
    groups_rec = rec.get("groups")
    _expect(isinstance(groups_rec, list), where, "groups must be a list")
    seen: set[str] = set()
    groups: list[tuple[list[str], dict[str, Any]]] = []
    for g_index, grp in enumerate(groups_rec):
        gwhere = f"{where} groups[{g_index}]"
        _expect(isinstance(grp, dict), gwhere, "must be an object")
        gids = _names(grp.get("ids"), gwhere, "ids")
        _expect(bool(gids) and set(gids) <= id_set and not (set(gids) & seen), gwhere, "ids must be new rows")
        seen |= set(gids)
        cols = grp.get("columns")
        _expect(isinstance(cols, dict) and bool(cols) and set(cols) <= set(types), gwhere, "columns must name written fields")
        groups.append(
            (
                gids,
                {
                    name: _column(entry, tensors, len(gids), types[name][0], types[name][1], f"{gwhere} field {name!r}")
                    for name, entry in cols.items()
                },
            )
        )
    record = {
        "partition_id": pid,
        "fields": fields,
        "consumer_tasks": tasks,
        "num_samples": num_samples,
        "grpo_group_size": group,
        "enums": enums,
        "field_types": {k: (v[0], v[1]) for k, v in types.items()},
    }
    return PartitionState(record, ids, dict(zip(ids, tags_rec)), claimed, groups)


def refuse_foreign_files(root: Path) -> None:
    """Refuse a checkpoint directory holding any file this format does not write.

    Nothing but :data:`CHECKPOINT_FILES` is ever read; any other file (for example one of
    TransferQueue's own checkpoint pickles, which run code when unpickled) is refused unread.

    Args:
        root: The checkpoint directory.

    Raises:
        ValueError: Naming the first unexpected file or directory.
    """
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
            f"TransferQueue data-plane checkpoint {str(root)!r} holds {str(path)!r}, which "
            f"is not part of its format (format_version {CHECKPOINT_FORMAT_VERSION} holds "
            f"only {list(CHECKPOINT_FILES)}); refusing to load it. The file was not "
            "read: a pickle (such as TransferQueue's own controller_state.pkl or "
            "su_*.pkl) can run code when loaded"
        )


def old_format_error(manifest_path: Path, version: Any) -> ValueError:
    """The refusal of a checkpoint written in an older format that held the library's pickles.

    Args:
        manifest_path: Its ``manifest.json``.
        version: Its ``format_version``.

    Returns:
        The error to raise.
    """
    return ValueError(
        f"checkpoint manifest {str(manifest_path)!r} has format_version {version!r} of "
        f"{CHECKPOINT_FORMAT!r}: that older format stored TransferQueue's own pickle files "
        "(controller_state.pkl, su_*.pkl), which can run code when loaded, so it is refused "
        f"and none of its files is read; this version reads format_version "
        f"{CHECKPOINT_FORMAT_VERSION} (JSON + safetensors). Start a fresh run or resume from a "
        "checkpoint written by this version"
    )
