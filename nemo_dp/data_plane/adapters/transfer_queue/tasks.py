"""The task-mediated half of the TransferQueue client: partitions, claims, consumption.

Why this module exists: registering a partition, claiming ready rows for a consumer task and
checking consumption all go through the cluster-wide registry and the controller's per-task
cursors; keeping them in :class:`TQTaskMixin` leaves the client module with construction, the
bounded-call machinery and the direct-by-key reads and writes.
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from tensordict import TensorDict

from nemo_dp.data_plane.adapters._validation import check_claim_request
from nemo_dp.data_plane.adapters._validation import duplicates as _duplicates
from nemo_dp.data_plane.adapters.transfer_queue.registry import (
    Record,
    delete_registry,
    parse_registry,
    record_key,
    stale_registry_keys,
    write_registry,
)
from nemo_dp.data_plane.adapters.transfer_queue.validation import (
    check_name,
    check_names,
    check_partition_id,
)
from nemo_dp.data_plane.interfaces import KVBatchMeta
from nemo_dp.data_plane.schema import TAG_INPUT_LENGTHS


class TQTaskMixin:
    """``register_partition``, ``claim_meta``, ``get_data``, ``check_consumption_status``.

    Host contract (the client): ``_check_open()``, ``_ctl`` / ``_data`` (bounded library calls),
    ``_registry_entries``, ``_require_record``, ``get_samples``, ``_lock``, ``_used``, ``_cfg``
    and ``_client`` (the library client).
    """

    _used: bool
    _cfg: Any
    _client: Any
    _lock: Any

    def register_partition(
        self,
        partition_id: str,
        fields: Sequence[str],
        num_samples: int,
        consumer_tasks: Sequence[str],
        grpo_group_size: int | None = None,
        enums: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """Declare a partition cluster-wide.

        Raises:
            ValueError: Live id (``"already registered"``), duplicate fields/tasks
                (``"must be unique"``), ``num_samples <= 0``, bad group size or enums.
            TypeError: Non-string names.
        """
        self._check_open()
        with self._lock:
            self._used = True
            check_partition_id(partition_id)
            entries = self._registry_entries("register_partition", partition_id)
            records = parse_registry(entries)
            if partition_id in records:
                raise ValueError(
                    f"partition {partition_id!r} is already registered; drop it with "
                    "clear_samples(None, partition_id) before registering it again"
                )
            field_list = check_names(fields, "fields")
            if dups := _duplicates(field_list):
                raise ValueError(f"fields must be unique; duplicated: {dups}")
            task_list = check_names(consumer_tasks, "consumer_tasks")
            if dups := _duplicates(task_list):
                raise ValueError(f"consumer_tasks must be unique; duplicated: {dups}")
            if isinstance(num_samples, bool) or not isinstance(num_samples, int):
                raise TypeError(f"num_samples must be an int, got {num_samples!r}")
            if num_samples <= 0:
                raise ValueError(f"num_samples must be > 0, got {num_samples}")
            if grpo_group_size is not None:
                if isinstance(grpo_group_size, bool) or not isinstance(grpo_group_size, int):
                    raise TypeError(f"grpo_group_size must be an int, got {grpo_group_size!r}")
                if grpo_group_size < 1 or num_samples % grpo_group_size != 0:
                    raise ValueError(
                        f"grpo_group_size must be >= 1 and divide num_samples={num_samples}, "
                        f"got {grpo_group_size}"
                    )
            enum_map: dict[str, list[str]] = {}
            for name, vocab in (enums or {}).items():
                if name not in field_list:
                    raise ValueError(f"enums key {name!r} is not a declared field of {partition_id!r}")
                words = check_names(vocab, f"enums[{name!r}]")
                if dups := _duplicates(words):
                    raise ValueError(f"enums[{name!r}] vocabulary must be unique; duplicated: {dups}")
                enum_map[name] = words

            record = Record(
                partition_id=partition_id,
                incarnation=uuid.uuid4().hex,
                fields=field_list,
                tasks=task_list,
                num_samples=num_samples,
                group_size=grpo_group_size,
                enums=enum_map,
            )
            stale = stale_registry_keys(entries, partition_id)
            client = self._client

            async def _register() -> None:
                # A library partition left behind by an interrupted drop must not leak old rows
                # into the new incarnation.
                if partition_id in await client.async_get_partition_list():
                    await client.async_clear_partition(partition_id)
                await delete_registry(client, stale)
                await write_registry(client, {record_key(partition_id): record.to_tag()})

            self._data(_register, "register_partition", partition_id)

    def claim_meta(
        self,
        partition_id: str,
        task_name: str,
        required_fields: Sequence[str],
        batch_size: int,
        dp_rank: int | None = None,
        blocking: bool = True,
        timeout_s: float = 60.0,
    ) -> KVBatchMeta:
        """Claim ``batch_size`` ready rows for ``task_name``.

        Raises:
            KeyError: Unknown partition or task (``"task"``).
            ValueError: Empty/undeclared ``required_fields``, ``batch_size < 1``,
                ``timeout_s <= 0``.
            TimeoutError: A blocking claim was not satisfied within ``timeout_s``.
        """
        self._check_open()
        with self._lock:
            self._used = True
            check_partition_id(partition_id)
            rec = self._require_record(partition_id, "claim_meta")
            check_name(task_name, "task_name")
            if task_name not in rec.tasks:
                raise KeyError(
                    f"unknown consumer task {task_name!r} for partition {partition_id!r}; "
                    f"registered tasks: {rec.tasks}"
                )
            fields = check_claim_request(partition_id, rec.fields, required_fields, batch_size, timeout_s)

        client = self._client
        poll_s = float(self._cfg.claim_meta_poll_interval_s)
        deadline = time.monotonic() + float(timeout_s)

        async def _claim() -> tuple[list[str], list[dict[str, Any]]] | None:
            meta = await client.async_get_meta(
                data_fields=list(fields),
                batch_size=batch_size,
                partition_id=partition_id,
                mode="fetch",
                task_name=task_name,
            )
            if meta.size == 0:
                return None
            keys = await client.async_kv_retrieve_keys(
                global_indexes=list(meta.global_indexes), partition_id=partition_id
            )
            return list(keys), [dict(t) for t in meta.custom_meta]

        while True:
            self._check_open()
            with self._lock:
                got = self._ctl(_claim, "claim_meta", partition_id)
            if got is not None:
                ids, stored = got
                break
            if not blocking:
                return KVBatchMeta(
                    partition_id=partition_id,
                    task_name=task_name,
                    sample_ids=[],
                    fields=list(fields),
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"claim_meta: fewer than {batch_size} samples of partition {partition_id!r} "
                    f"became ready for task {task_name!r} within timeout_s={timeout_s:g}"
                )
            time.sleep(min(poll_s, remaining))

        tags = copy.deepcopy(stored) if any(stored) else None
        lengths = None
        if tags is not None and all(TAG_INPUT_LENGTHS in t for t in tags):
            lengths = [int(t[TAG_INPUT_LENGTHS]) for t in tags]
        return KVBatchMeta(
            partition_id=partition_id,
            task_name=task_name,
            sample_ids=ids,
            fields=list(fields),
            sequence_lengths=lengths,
            tags=tags,
        )

    def get_data(self, meta: KVBatchMeta, select_fields: Sequence[str] | None = None) -> TensorDict:
        """Fetch ``meta``'s rows (fields from ``select_fields``, else ``meta.fields``).

        Raises:
            ValueError: No field can be resolved (``select_fields``/``fields``).
            KeyError: As ``get_samples``.
        """
        self._check_open()
        if not isinstance(meta, KVBatchMeta):
            raise TypeError(f"get_data needs a KVBatchMeta, got {type(meta).__name__}")
        if select_fields is not None and len(list(select_fields)) > 0:
            fields = list(select_fields)
        elif meta.fields:
            fields = list(meta.fields)
        else:
            with self._lock:
                self._used = True
                check_partition_id(meta.partition_id)
                self._require_record(meta.partition_id, "get_data")
            raise ValueError(
                "get_data: neither select_fields nor meta.fields names a field to fetch "
                "(fetching all fields silently is forbidden)"
            )
        return self.get_samples(meta.sample_ids, meta.partition_id, fields)

    def check_consumption_status(self, partition_id: str, task_names: Sequence[str]) -> bool:
        """True iff every listed task claimed every sample currently in the partition.

        Raises:
            KeyError: Unknown partition, or unregistered task (``"task"``).
            ValueError: Empty ``task_names``.
        """
        self._check_open()
        with self._lock:
            self._used = True
            check_partition_id(partition_id)
            rec = self._require_record(partition_id, "check_consumption_status")
            tasks = check_names(task_names, "task_names")
            if not tasks:
                raise ValueError("task_names must name at least one task")
            unknown = [t for t in tasks if t not in rec.tasks]
            if unknown:
                raise KeyError(
                    f"unknown consumer task(s) {unknown} for partition {partition_id!r}; "
                    f"registered tasks: {rec.tasks}"
                )
            client = self._client

            async def _status() -> bool:
                results = await asyncio.gather(
                    *(client.async_get_consumption_status(t, partition_id) for t in tasks)
                )
                for _, status in results:
                    if status is None or status.numel() == 0 or not bool((status == 1).all()):
                        return False
                return True

            return self._ctl(_status, "check_consumption_status", partition_id)
