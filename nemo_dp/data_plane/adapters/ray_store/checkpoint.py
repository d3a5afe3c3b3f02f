"""Checkpoints of the cluster-wide Ray object-store data plane, written by the bootstrapping client.

The ``typed_checkpoint`` format; version 1 kept its tensors in ``tensors.pt`` (a pickle) and is refused unread.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from os import PathLike
from typing import Any

import torch

from nemo_dp.data_plane.adapters.ray_store.columns import Segment, dtype_from_name, encode_column, gather_field
from nemo_dp.data_plane.adapters.ray_store.state import OBJECT, TensorColumnSpec
from nemo_dp.data_plane.typed_checkpoint import (
    PartitionHeader, column_entry, column_from_entry, decode_values, encode_values, expect, field_kinds, new_manifest,
    read_checkpoint, str_list, write_checkpoint,
)
from nemo_dp.utils.checkpoint_io import validate_json_metadata

CHECKPOINT_FORMAT = "nemo_dp.ray_store_data_plane"
CHECKPOINT_VERSION = 2
_OLD_FILES = {1: ("tensors.pt",)}


def build_snapshot(
    snap: Mapping[str, Any], payloads: Mapping[int, Any], user_metadata: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The ``(manifest, tensors)`` of a checkpoint of ``snap`` (``StoreState.snapshot()``); nothing written.

    A partition record is the shared header plus ``field_kinds`` and ``columns``: field ->
    ``{"kind": "tensor", "ids", ...}`` (a column entry of the table, one row per id) or
    ``{"kind": "object", "ids", "values"}``.  ``TypeError`` for a value the typed codec cannot represent.
    """
    chunks = snap["chunks"]
    tensors: dict[str, torch.Tensor] = {}
    records: list[dict[str, Any]] = []
    for p_index, rec in enumerate(snap["partitions"]):
        pid, ids = rec["partition_id"], rec["sample_ids"]
        columns: dict[str, Any] = {}
        for c_index, (name, kind) in enumerate(rec["field_kinds"].items()):
            holders = [sid for sid in ids if name in rec["row_fields"][sid]]
            key = f"p{p_index}.c{c_index}"
            if kind == OBJECT:
                values = [rec["values"][sid][name] for sid in holders]
                nodes = encode_values(tensors, f"{key}.v", values, holders, pid, f"field {name!r}")
                columns[name] = {"kind": "object", "ids": holders, "values": nodes}
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
            columns[name] = {"kind": "tensor", "ids": holders, **column_entry(tensors, key, data)}  # type: ignore[dict-item]
        header = PartitionHeader(**{f.name: rec[f.name] for f in dataclasses.fields(PartitionHeader)})
        records.append(
            {**header.to_record(tensors, f"p{p_index}.tags"), "field_kinds": dict(rec["field_kinds"]), "columns": columns}
        )
    return new_manifest(CHECKPOINT_FORMAT, CHECKPOINT_VERSION, user_metadata, records), tensors


def _restore_record(rec: Any, where: str, tensors: dict[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate one partition record; return it for ``StoreState.restore`` and its tensor columns."""
    h = PartitionHeader.from_record(rec, where, tensors)
    kinds = field_kinds(rec, h.fields, where)
    columns = rec.get("columns")
    expect(isinstance(columns, dict) and set(columns) <= set(kinds), where, "columns must have field_kinds")
    row_fields: dict[str, list[str]] = {sid: [] for sid in h.sample_ids}
    tensor_cols: dict[str, Any] = {}
    object_cols: dict[str, Any] = {}
    for name, col in columns.items():
        cwhere = f"{where} column {name!r}"
        expect(isinstance(col, dict), cwhere, "must be an object")
        holders = str_list(col.get("ids"), cwhere, "ids")
        expect(set(holders) <= set(row_fields), cwhere, "names ids that are not rows")
        for sid in holders:
            row_fields[sid].append(name)
        if col.get("kind") == "object":
            expect(kinds[name] == OBJECT, cwhere, f"kind 'object', the field holds {kinds[name]!r}")
            values = decode_values(col.get("values"), holders, tensors, cwhere, "values")
            object_cols[name] = (OBJECT, dict(zip(holders, values)))
        else:
            expect(col.get("kind") == "tensor", cwhere, f"unknown kind {col.get('kind')!r}")
            tensor_cols[name] = (column_from_entry(col, tensors, len(holders), cwhere, kinds[name]), holders)
    return {**vars(h), "field_kinds": kinds, "row_fields": row_fields, "columns": object_cols}, tensor_cols


class RayStoreCheckpointMixin:
    """``save_checkpoint`` / ``load_checkpoint`` of ``RayStoreClient`` (uses its ``_call`` and ``_chunk_payloads``)."""

    def save_checkpoint(self, checkpoint_dir: str | PathLike, *, metadata: Mapping | None = None) -> None:
        """Atomically save every partition plus user ``metadata``.

        Raises:
            RuntimeError: Closed, or not the bootstrapping client.
            TypeError | ValueError: Non-JSON ``metadata``, or a stored value that cannot be encoded (nothing written).
        """
        self._check_open()  # type: ignore[attr-defined]
        self._require_owner("save_checkpoint")  # type: ignore[attr-defined]
        user_metadata = validate_json_metadata(metadata)
        snap = self._call("snapshot", "")  # type: ignore[attr-defined]
        payloads = self._chunk_payloads(snap["chunks"], "", "save_checkpoint")  # type: ignore[attr-defined]
        write_checkpoint(checkpoint_dir, *build_snapshot(snap, payloads, user_metadata))

    def load_checkpoint(self, checkpoint_dir: str | PathLike) -> dict:
        """Restore a checkpoint into this clean bootstrapping client; return the user metadata.

        Raises:
            RuntimeError: Closed, not the bootstrapping client, or not clean (also: the store holds partitions).
            FileNotFoundError | ValueError: As ``typed_checkpoint.read_checkpoint``, or an unrestorable record.
        """
        import ray

        self._check_open()  # type: ignore[attr-defined]
        self._require_owner("load_checkpoint")  # type: ignore[attr-defined]
        self._begin_load()  # type: ignore[attr-defined]
        if not self._call("is_empty", ""):  # type: ignore[attr-defined]
            raise RuntimeError(
                "load_checkpoint needs a clean data-plane client: the cluster-wide store "
                "already holds partitions"
            )
        ck = read_checkpoint(checkpoint_dir, CHECKPOINT_FORMAT, CHECKPOINT_VERSION, _OLD_FILES)
        loaded = [_restore_record(rec, f"{ck.where} partitions[{i}]", ck.tensors) for i, rec in enumerate(ck.partitions)]
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
        return ck.metadata
