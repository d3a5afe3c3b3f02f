"""The metadata the Ray object-store data plane's actor holds: the partition book plus where each row's cells live.

Every method validates completely before it changes anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_dp.data_plane.adapters._book import PartitionBook, PartitionRecord
from nemo_dp.data_plane.adapters._validation import (
    check_enum_put,
    check_undeclared,
    kind_changed,
    unknown_ids,
    unproduced_fields,
)

#: The kind of a non-tensor column (tensor columns have their dtype name as kind).
OBJECT = "object"


@dataclass(frozen=True)
class InlinePayload:
    """A small put's ``{key: column payload}`` carried by the actor call and kept here in place of an object ref."""

    payload: Any


@dataclass(frozen=True)
class TensorColumnSpec:
    """A put's tensor column as the client sends it.

    ``ref`` is the put's object (``{key: column payload}``, ``None`` for zero rows) or an
    :class:`InlinePayload`; ``key`` is this column's key in it.
    """

    dtype: str
    layout: str
    ref: Any
    key: str


@dataclass
class Chunk:
    """One column of one put, living in Ray's object store (or here, for a small put)."""

    ref: Any
    key: str
    layout: str
    dtype: str
    live: int  # live (row, field) cells that point into this chunk


@dataclass
class PartitionState(PartitionRecord):
    """The book's record plus where each row's cells live.

    Attributes:
        rows: sid -> field -> chunk id, or ``None`` for an object value; insertion order is the claim order.
        cells: sid -> field -> (chunk id, position) of its tensor cells.
        values: sid -> field -> object value.
    """

    rows: dict[str, dict[str, int | None]] = field(default_factory=dict)
    cells: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    values: dict[str, dict[str, Any]] = field(default_factory=dict)

    def row_ids(self) -> dict[str, dict[str, int | None]]:
        return self.rows

    def ready_rows(self, required: Sequence[str]) -> Iterable[str]:
        return (sid for sid, row in self.rows.items() if all(f in row for f in required))

    def drop_row(self, sample_id: str) -> None:
        """Forget a row's cells and values (the store releases its chunks first)."""
        del self.rows[sample_id]
        self.cells.pop(sample_id, None)
        self.values.pop(sample_id, None)


class StoreState:
    """Cluster-wide metadata of the data plane.

    A put's tensor columns live in one object-store object (one column of it is a *chunk*); the
    state keeps each chunk's ref while a live row uses it.  Object columns are kept here directly.
    """

    def __init__(self) -> None:
        self.book: PartitionBook[PartitionState] = PartitionBook()
        self.chunks: dict[int, Chunk] = {}
        self._next_chunk = 0

    @property
    def partitions(self) -> dict[str, PartitionState]:
        return self.book.partitions

    @partitions.setter
    def partitions(self, value: dict[str, PartitionState]) -> None:
        self.book.partitions = value

    def exists(self, partition_id: Any) -> bool:
        return self.book.exists(partition_id)

    def is_empty(self) -> bool:
        return not self.partitions

    def register(
        self, partition_id: Any, fields: Any, n: Any, tasks: Any, group: Any = None, enums: Any = None
    ) -> None:
        reg = self.book.check_new(partition_id, fields, n, tasks, group, enums)
        self.book.add(PartitionState, reg)

    def put(
        self, partition_id: str, sample_ids: list[str], columns: Mapping[str, Any], tags: list[dict[str, Any]] | None
    ) -> None:
        """Upsert rows: register the put's chunks and object values, replace tags if given (else keep).

        The client checked ids and tags; this checks declared fields, kinds and enum vocabularies.
        ``columns`` maps field -> :class:`TensorColumnSpec` or a list of per-row objects.

        Raises:
            KeyError | ValueError | TypeError: Unknown partition; undeclared field or enum value; changed kind.
        """
        part = self.book.live(partition_id)
        check_undeclared(partition_id, list(columns), part.fields)
        kinds: dict[str, str] = {}
        for name, col in columns.items():
            kind = col.dtype if isinstance(col, TensorColumnSpec) else OBJECT
            stored = part.field_kinds.get(name)
            if stored is not None and stored != kind:
                raise kind_changed(partition_id, name, stored, kind)
            if name in part.enums:
                check_enum_put(name, part.enums[name], col if kind == OBJECT else None, kind)
            kinds[name] = kind
        n = len(sample_ids)
        if n == 0:
            return
        chunk_of = {name: self.add_chunk(col, 0) for name, col in columns.items() if isinstance(col, TensorColumnSpec)}
        part.field_kinds.update(kinds)
        for i, sid in enumerate(sample_ids):
            row = part.rows.get(sid)
            if row is None:
                row = part.rows[sid] = {}
                part.cells[sid] = {}
            cells = part.cells[sid]
            for name, col in columns.items():
                old = cells.pop(name, None)
                if old is not None:
                    self._release(old[0])
                cid = chunk_of.get(name)
                if cid is None:
                    part.values.setdefault(sid, {})[name] = col[i]
                    row[name] = None
                else:
                    part.values.get(sid, {}).pop(name, None)
                    cells[name] = (cid, i)
                    self.chunks[cid].live += 1
                    row[name] = cid
            if tags is not None:
                part.tags[sid] = tags[i]
        for cid in chunk_of.values():
            if self.chunks[cid].live == 0:  # pragma: no cover - n > 0 always fills it
                del self.chunks[cid]

    def add_chunk(self, spec: TensorColumnSpec, live: int) -> int:
        """Keep a new chunk for ``spec`` with ``live`` cells; returns its id."""
        cid = self._next_chunk
        self._next_chunk += 1
        self.chunks[cid] = Chunk(spec.ref, spec.key, spec.layout, spec.dtype, live)
        return cid

    def _release(self, cid: int) -> None:
        chunk = self.chunks[cid]
        chunk.live -= 1
        if chunk.live == 0:
            del self.chunks[cid]  # drops the ref: the object store may free the column

    def locate(
        self, partition_id: str, sample_ids: list[str], fields: list[str]
    ) -> tuple[dict[str, Any], dict[int, tuple[Any, str, str, str]]]:
        """``(plan, chunks)`` of a read of distinct ``sample_ids`` (output order) and ``fields``; else ``KeyError``.

        ``plan[field]`` is ``("object", values)`` or ``("tensor", dtype, [(chunk id, positions), ...])``
        (one entry per run of output rows in one chunk); ``chunks[id]`` is ``(ref, key, layout, dtype)``.
        """
        part = self.book.live(partition_id)
        rows = part.rows
        if missing := [sid for sid in sample_ids if sid not in rows]:
            raise unknown_ids(partition_id, missing)
        unproduced = [f for f in fields if any(f not in rows[sid] for sid in sample_ids)]
        if unproduced:
            raise unproduced_fields(partition_id, unproduced, part.field_kinds)
        plan: dict[str, Any] = {}
        used: dict[int, tuple[Any, str, str, str]] = {}
        for f in fields:
            if part.field_kinds[f] == OBJECT:
                plan[f] = (OBJECT, [part.values[sid][f] for sid in sample_ids])
                continue
            segments: list[tuple[int, list[int]]] = []
            last = -1
            for sid in sample_ids:
                cid, pos = part.cells[sid][f]
                if cid == last:
                    segments[-1][1].append(pos)
                else:
                    segments.append((cid, [pos]))
                    last = cid
                    if cid not in used:
                        ch = self.chunks[cid]
                        used[cid] = (ch.ref, ch.key, ch.layout, ch.dtype)
            plan[f] = ("tensor", part.field_kinds[f], segments)
        return plan, used

    def list_ids(self, partition_id: Any) -> list[str]:
        return self.book.list_ids(partition_id)

    def claim(
        self, partition_id: str, task_name: str, required_fields: Sequence[str], batch_size: int, timeout_s: Any = 1.0
    ) -> tuple[list[str], list[dict[str, Any]] | None]:
        """``(ids, tags)`` of ``batch_size`` ready rows claimed oldest first, ``([], None)`` when fewer are ready.

        ``timeout_s`` is only validated here (the client polls).
        """
        part, required = self.book.check_claim(
            partition_id, task_name, required_fields, batch_size, timeout_s
        )
        ready = self.book.take(part, task_name, required, batch_size)
        return ready, part.tags_of(ready) if ready else None

    def consumed(self, partition_id: str, task_names: Sequence[str]) -> bool:
        return self.book.consumed(partition_id, task_names)

    def clear(self, partition_id: str, sample_ids: list[str] | None) -> None:
        """Drop rows (an emptied partition stays registered), or (``None``) the partition with its registration."""
        if sample_ids is None:
            for cells in self.book.drop(partition_id).cells.values():
                for cid, _ in cells.values():
                    self._release(cid)
            return
        part, ids = self.book.check_clear(partition_id, sample_ids)
        for sid in ids:
            for cid, _ in part.cells[sid].values():
                self._release(cid)
        self.book.forget_rows(part, ids)

    def snapshot(self) -> dict[str, Any]:
        """Everything a checkpoint needs, with chunk refs (see ``state_snapshot``)."""
        from nemo_dp.data_plane.adapters.ray_store.state_snapshot import snapshot_state

        return snapshot_state(self)

    def restore(self, partitions: list[dict[str, Any]]) -> None:
        """Rebuild a clean store from loaded records, all or nothing (see ``state_snapshot``)."""
        from nemo_dp.data_plane.adapters.ray_store.state_snapshot import restore_state

        restore_state(self, partitions)
