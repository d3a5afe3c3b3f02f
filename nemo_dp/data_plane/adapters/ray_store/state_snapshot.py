"""Snapshots and restores of the Ray object-store backend's metadata (the checkpoint half).

Why this module exists: a checkpoint needs the whole :class:`StoreState` as plain records (and
a restore rebuilds one from them, all or nothing); keeping that here leaves ``state`` with the
live operations.  ``StoreState.snapshot`` / ``StoreState.restore`` delegate to these functions,
so the metadata actor still reaches them as state operations.
"""

from __future__ import annotations

import copy
from typing import Any

from nemo_dp.data_plane.adapters.ray_store.state import OBJECT, Chunk, StoreState

__all__ = ["restore_state", "snapshot_state"]


def snapshot_state(store: StoreState) -> dict[str, Any]:
    """Everything a checkpoint needs, with chunk refs (the client fetches the payloads).

    Returns:
        ``{"partitions": [...], "chunks": {id: (ref, key, layout, dtype)}}``; every partition
        record holds its schema, field kinds, ordered ids, per-row cells / object values /
        tags, and the claimed ids per task.
    """
    records = []
    used: dict[int, tuple[Any, str, str, str]] = {}
    for part in store.partitions.values():
        for cells in part.cells.values():
            for cid, _ in cells.values():
                ch = store.chunks[cid]
                used[cid] = (ch.ref, ch.key, ch.layout, ch.dtype)
        records.append(
            {
                "partition_id": part.partition_id,
                "fields": list(part.fields),
                "num_samples": part.num_samples,
                "consumer_tasks": list(part.consumer_tasks),
                "grpo_group_size": part.grpo_group_size,
                "enums": {k: list(v) for k, v in part.enums.items()},
                "field_kinds": dict(part.field_kinds),
                "sample_ids": list(part.rows),
                "row_fields": {sid: list(row) for sid, row in part.rows.items()},
                "cells": {sid: dict(c) for sid, c in part.cells.items()},
                "values": copy.deepcopy(part.values),
                "tags": copy.deepcopy(part.tags),
                "claimed": {t: [s for s in part.rows if s in c] for t, c in part.claimed.items()},
            }
        )
    return {"partitions": records, "chunks": used}

def restore_state(store: StoreState, partitions: list[dict[str, Any]]) -> None:
    """Rebuild the state of a clean store from a loaded checkpoint.

    Args:
        partitions: One record per partition: the schema keys of :meth:`register`,
            ``field_kinds``, ``sample_ids``, ``row_fields`` (sid -> fields it holds),
            ``columns`` (field -> ``(TensorColumnSpec, ids)`` with one row per id in that
            order, or ``("object", {sid: value})``), ``tags`` and ``claimed``.

    Raises:
        RuntimeError: The store is not empty.
    """
    if store.partitions:
        raise RuntimeError(
            "load_checkpoint needs a clean data-plane client: the store already holds "
            f"partitions {sorted(store.partitions)}"
        )
    built = type(store)()
    _fill(built, partitions)  # all or nothing: a bad record leaves this store empty
    store.partitions, store.chunks, store._next_chunk = (
        built.partitions,
        built.chunks,
        built._next_chunk,
    )

def _fill(store: StoreState, partitions: list[dict[str, Any]]) -> None:
    for rec in partitions:
        store.register(
            rec["partition_id"],
            rec["fields"],
            rec["num_samples"],
            rec["consumer_tasks"],
            rec["grpo_group_size"],
            rec["enums"],
        )
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
            cid = store._next_chunk
            store._next_chunk += 1
            store.chunks[cid] = Chunk(spec.ref, spec.key, spec.layout, spec.dtype, len(ids))
            for pos, sid in enumerate(ids):
                part.cells[sid][name] = (cid, pos)
                part.rows[sid][name] = cid
        part.tags = dict(rec["tags"])
        for task, ids in rec["claimed"].items():
            part.claimed[task] = set(ids)
