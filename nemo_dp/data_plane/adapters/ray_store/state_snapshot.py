""":class:`StoreState` as plain checkpoint records and back (``StoreState.snapshot`` / ``restore``)."""

from __future__ import annotations

import copy
from typing import Any

from nemo_dp.data_plane.adapters.ray_store.state import OBJECT, StoreState


def snapshot_state(store: StoreState) -> dict[str, Any]:
    """``{"partitions": [record, ...], "chunks": {id: (ref, key, layout, dtype)}}`` (payloads not fetched)."""
    records = []
    used: dict[int, tuple[Any, str, str, str]] = {}
    for part in store.partitions.values():
        for cells in part.cells.values():
            for cid, _ in cells.values():
                ch = store.chunks[cid]
                used[cid] = (ch.ref, ch.key, ch.layout, ch.dtype)
        records.append(
            {
                **part.header(list(part.rows)),
                "tags": copy.deepcopy(part.tags),
                "field_kinds": dict(part.field_kinds),
                "row_fields": {sid: list(row) for sid, row in part.rows.items()},
                "cells": {sid: dict(c) for sid, c in part.cells.items()},
                "values": copy.deepcopy(part.values),
            }
        )
    return {"partitions": records, "chunks": used}


def restore_state(store: StoreState, partitions: list[dict[str, Any]]) -> None:
    """Rebuild a clean store (else ``RuntimeError``) from loaded records, all or nothing.

    A record holds the schema keys of ``register``, ``field_kinds``, ``sample_ids``, ``row_fields``
    (sid -> its fields), ``columns`` (field -> ``(TensorColumnSpec, ids)`` or ``("object", {sid:
    value})``), ``tags`` and ``claimed``.
    """
    if store.partitions:
        raise RuntimeError(
            "load_checkpoint needs a clean data-plane client: the store already holds "
            f"partitions {sorted(store.partitions)}"
        )
    built = type(store)()
    _fill(built, partitions)
    store.partitions, store.chunks, store._next_chunk = built.partitions, built.chunks, built._next_chunk


def _fill(store: StoreState, partitions: list[dict[str, Any]]) -> None:
    for rec in partitions:
        keys = ("partition_id", "fields", "num_samples", "consumer_tasks", "grpo_group_size", "enums")
        store.register(*(rec[k] for k in keys))
        part = store.partitions[rec["partition_id"]]
        part.field_kinds = dict(rec["field_kinds"])
        for sid in rec["sample_ids"]:
            part.rows[sid] = {}
            part.cells[sid] = {}
        for sid, names in rec["row_fields"].items():
            for name in names:
                part.rows[sid][name] = None
        for name, (spec, ids) in rec["columns"].items():
            if spec == OBJECT:
                for sid, value in ids.items():
                    part.values.setdefault(sid, {})[name] = value
                continue
            cid = store.add_chunk(spec, len(ids))
            for pos, sid in enumerate(ids):
                part.cells[sid][name] = (cid, pos)
                part.rows[sid][name] = cid
        part.tags = dict(rec["tags"])
        for task, ids in rec["claimed"].items():
            part.claimed[task] = set(ids)
