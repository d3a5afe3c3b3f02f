"""The cluster-wide partition registry: one reserved library partition (:data:`REGISTRY_PARTITION`)
holding a tagged entry per live partition (its :class:`Record`) and per typed field of it."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Reserved library partition holding one registry record per live nemo_dp partition.
REGISTRY_PARTITION = "__nemo_dp_registry__"
RECORD_PREFIX = "partition:"
FIELD_PREFIX = "field:"


@dataclass
class Record:
    """One partition's registry entry (cluster-wide, stored as a tag in the registry partition)."""

    partition_id: str
    incarnation: str
    fields: list[str]
    tasks: list[str]
    num_samples: int
    group_size: int | None
    enums: dict[str, list[str]]
    # field -> (kind, dtype name or None); filled from the per-field entries of this incarnation
    field_types: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    def to_tag(self) -> dict[str, Any]:
        return {
            "partition_id": self.partition_id,
            "incarnation": self.incarnation,
            "fields": list(self.fields),
            "tasks": list(self.tasks),
            "num_samples": self.num_samples,
            "group_size": self.group_size,
            "enums": {k: list(v) for k, v in self.enums.items()},
        }

    @classmethod
    def from_tag(cls, tag: Mapping[str, Any]) -> Record:
        return cls(
            partition_id=str(tag["partition_id"]),
            incarnation=str(tag["incarnation"]),
            fields=list(tag["fields"]),
            tasks=list(tag["tasks"]),
            num_samples=int(tag["num_samples"]),
            group_size=None if tag["group_size"] is None else int(tag["group_size"]),
            enums={str(k): list(v) for k, v in dict(tag["enums"]).items()},
        )


def record_key(partition_id: str) -> str:
    return f"{RECORD_PREFIX}{partition_id}"


def field_key(incarnation: str, field_name: str) -> str:
    return f"{FIELD_PREFIX}{incarnation}:{field_name}"


def type_entries(partition_id: str, incarnation: str, types: Mapping[str, tuple[str, str | None]]) -> dict[str, Any]:
    """Registry entries recording the ``(kind, dtype)`` of fields of one partition incarnation."""
    return {
        field_key(incarnation, name): {
            "partition_id": partition_id, "incarnation": incarnation, "field": name, "kind": kind, "dtype": dtype,
        }
        for name, (kind, dtype) in types.items()
    }  # fmt: skip


def parse_registry(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, Record]:
    """Registry partition listing (key -> tag) -> live records with their field types."""
    records: dict[str, Record] = {}
    for key, tag in entries.items():
        if key.startswith(RECORD_PREFIX) and tag:
            rec = Record.from_tag(tag)
            records[rec.partition_id] = rec
    by_incarnation = {rec.incarnation: rec for rec in records.values()}
    for key, tag in entries.items():
        if key.startswith(FIELD_PREFIX) and tag:
            rec = by_incarnation.get(str(tag["incarnation"]))
            if rec is not None:
                rec.field_types[str(tag["field"])] = (str(tag["kind"]), tag["dtype"])
    return records


def stale_registry_keys(entries: Mapping[str, Mapping[str, Any]], partition_id: str) -> list[str]:
    """Registry keys that belong to ``partition_id`` (record and per-field entries)."""
    return [
        key
        for key, tag in entries.items()
        if key == record_key(partition_id)
        or (key.startswith(FIELD_PREFIX) and tag and tag["partition_id"] == partition_id)
    ]


async def write_registry(client: Any, entries: Mapping[str, dict[str, Any]]) -> None:
    """Upsert registry entries (key -> tag) in the reserved registry partition."""
    keys = list(entries)
    meta = await client.async_kv_retrieve_meta(keys=keys, partition_id=REGISTRY_PARTITION, create=True)
    if meta.size != len(keys):
        raise RuntimeError(f"TransferQueue registry write resolved {meta.size} of {len(keys)} keys")
    meta.custom_meta = [copy.deepcopy(entries[k]) for k in keys]
    await client.async_set_custom_meta(meta)


async def delete_registry(client: Any, keys: list[str]) -> None:
    """Drop registry entries by key (absent keys are ignored)."""
    if not keys:
        return
    meta = await client.async_kv_retrieve_meta(keys=keys, partition_id=REGISTRY_PARTITION, create=False)
    if meta.size:
        await client.async_clear_samples(meta)


async def drop_partition(client: Any, partition_id: str, stale: list[str]) -> None:
    """Clear the library partition if it exists, then delete the ``stale`` registry entries."""
    if partition_id in await client.async_get_partition_list():
        await client.async_clear_partition(partition_id)
    await delete_registry(client, stale)


async def live_keys(client: Any, partition_id: str) -> set[str]:
    """Keys currently stored in a library partition (empty for an unknown one)."""
    info = await client.async_kv_list(partition_id)
    return set(info[partition_id]) if partition_id in info else set()
