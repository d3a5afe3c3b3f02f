"""The partition book (partitions, rows, per-task claims, tags) of the Local client and the ray_store actor.

Pure Python, no locking and no storage: each adapter's :class:`PartitionRecord` subclass says where a
row's bytes live; the book does registration, lookups, claims, consumption and clears.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from nemo_dp.data_plane.adapters._validation import (
    Registration,
    already_registered,
    check_claim_request,
    check_clear_ids,
    check_consumption_tasks,
    check_name,
    check_partition_id,
    check_registration,
    check_task,
    unknown_ids,
    unknown_partition,
)


@dataclass
class PartitionRecord:
    """One registered partition: schema, ``field_kinds`` (dtype name or object kind), tags of tagged rows,
    task -> claimed ids.  Subclasses keep the rows (:meth:`row_ids`, :meth:`ready_rows`, :meth:`drop_row`).
    """

    partition_id: str
    fields: tuple[str, ...]
    num_samples: int
    consumer_tasks: tuple[str, ...]
    grpo_group_size: int | None
    enums: dict[str, tuple[str, ...]]
    field_kinds: dict[str, str] = field(default_factory=dict)
    tags: dict[str, dict[str, Any]] = field(default_factory=dict)
    claimed: dict[str, set[str]] = field(default_factory=dict)

    def row_ids(self) -> Collection[str]:
        """The live ids in stored (claim) order; membership tests are O(1)."""
        raise NotImplementedError

    def ready_rows(self, required: Sequence[str]) -> Iterable[str]:
        """The live ids holding every ``required`` field, in stored order."""
        raise NotImplementedError

    def drop_row(self, sample_id: str) -> None:
        """Forget a live row's data (tags and claims are the book's)."""
        raise NotImplementedError

    def header(self, ids: list[str]) -> dict[str, Any]:
        """The ``typed_checkpoint.PartitionHeader`` fields of this partition with its live ``ids`` in stored order."""
        return dict(
            partition_id=self.partition_id,
            fields=list(self.fields),
            consumer_tasks=list(self.consumer_tasks),
            num_samples=self.num_samples,
            grpo_group_size=self.grpo_group_size,
            enums={k: list(v) for k, v in self.enums.items()},
            sample_ids=ids,
            tags=self.tags,
            claimed={t: [sid for sid in ids if sid in self.claimed[t]] for t in self.consumer_tasks},
        )

    def tags_of(self, ids: Sequence[str]) -> list[dict[str, Any]] | None:
        """Deep copies of the rows' tags (``{}`` for a row without), or ``None`` if none has any."""
        if not any(sid in self.tags for sid in ids):
            return None
        return [copy.deepcopy(self.tags.get(sid, {})) for sid in ids]


R = TypeVar("R", bound=PartitionRecord)


class PartitionBook(Generic[R]):
    """The live partitions of one data plane, keyed by id."""

    def __init__(self) -> None:
        self.partitions: dict[str, R] = {}

    def exists(self, partition_id: Any) -> bool:
        return isinstance(partition_id, str) and partition_id in self.partitions

    def live(self, partition_id: Any) -> R:
        """The registered partition ``partition_id`` (else ``KeyError``)."""
        check_name(partition_id, "partition_id")
        part = self.partitions.get(partition_id)
        if part is None:
            raise unknown_partition(partition_id)
        return part

    def list_ids(self, partition_id: Any) -> list[str]:
        """Sorted live ids; ``[]`` for an unknown partition."""
        check_name(partition_id, "partition_id")
        part = self.partitions.get(partition_id)
        return sorted(part.row_ids()) if part is not None else []

    def check_new(self, partition_id: Any, *registration: Any) -> Registration:
        """``check_registration(partition_id, *registration)``, also refusing a reserved or live id."""
        check_partition_id(partition_id)
        if partition_id in self.partitions:
            raise already_registered(partition_id)
        return check_registration(partition_id, *registration)

    def add(self, record_type: type[R], reg: Registration, **extra: Any) -> R:
        """Register and return a new ``record_type`` record for ``reg``; ``extra`` are the record's own fields."""
        part = record_type(
            partition_id=reg.partition_id,
            fields=tuple(reg.fields),
            num_samples=reg.num_samples,
            consumer_tasks=tuple(reg.tasks),
            grpo_group_size=reg.grpo_group_size,
            enums=reg.enums,
            claimed={t: set() for t in reg.tasks},
            **extra,
        )
        self.partitions[part.partition_id] = part
        return part

    def drop(self, partition_id: str) -> R:
        """Forget a live partition with its registration; returns its record."""
        part = self.live(partition_id)
        del self.partitions[partition_id]
        return part

    def check_claim(
        self, partition_id: Any, task_name: Any, required_fields: Any, batch_size: Any, timeout_s: Any
    ) -> tuple[R, list[str]]:
        """Check a claim; returns the partition and the required fields."""
        part = self.live(partition_id)
        check_task(part.partition_id, part.consumer_tasks, task_name)
        required = check_claim_request(
            part.partition_id, part.fields, required_fields, batch_size, timeout_s
        )
        return part, required

    @staticmethod
    def take(part: R, task_name: str, required: Sequence[str], batch_size: int) -> list[str]:
        """Claim ``batch_size`` ready unclaimed rows for ``task_name``, oldest first; ``[]`` when fewer are ready."""
        claimed = part.claimed[task_name]
        ready: list[str] = []
        for sid in part.ready_rows(required):
            if sid not in claimed:
                ready.append(sid)
                if len(ready) == batch_size:
                    claimed.update(ready)
                    return ready
        return []

    def consumed(self, partition_id: Any, task_names: Any) -> bool:
        """True iff every listed task claimed every row currently in the (non-empty) partition."""
        part = self.live(partition_id)
        tasks = check_consumption_tasks(part.partition_id, part.consumer_tasks, task_names)
        rows = part.row_ids()
        if not rows:
            return False
        return all(part.claimed[t].issuperset(rows) for t in tasks)

    def check_clear(self, partition_id: Any, sample_ids: Any) -> tuple[R, list[str]]:
        """Check an explicit clear (``KeyError`` listing ids that are not live); nothing changes."""
        part = self.live(partition_id)
        ids = check_clear_ids(sample_ids)
        rows = part.row_ids()
        if missing := [sid for sid in ids if sid not in rows]:
            raise unknown_ids(part.partition_id, missing)
        return part, ids

    @staticmethod
    def forget_rows(part: R, ids: Iterable[str]) -> None:
        """Drop checked live rows with their tags and claims."""
        for sid in ids:
            part.drop_row(sid)
            part.tags.pop(sid, None)
            for claimed in part.claimed.values():
                claimed.discard(sid)

