"""The task-mediated half of the TransferQueue client: registration, claims and consumption
through the cluster-wide registry and the controller's per-task cursors."""

from __future__ import annotations

import asyncio
import copy
import uuid
from typing import Any

from nemo_dp.data_plane.adapters._validation import (
    already_registered,
    check_claim_request,
    check_consumption_tasks,
    check_partition_id,
    check_registration,
    check_task,
)
from nemo_dp.data_plane.adapters.transfer_queue.registry import (
    Record,
    drop_partition,
    parse_registry,
    record_key,
    stale_registry_keys,
    write_registry,
)
from nemo_dp.data_plane.interfaces import KVBatchMeta


class TQTaskMixin:
    """Hooks of ``register_partition``, ``claim_meta``, ``check_consumption_status`` for ``TQDataPlaneClient``."""

    _cfg: Any
    _client: Any
    _lock: Any

    def _register(self, partition_id: Any, fields: Any, n: Any, tasks: Any, group_size: Any, enums: Any) -> None:
        """Register in the cluster-wide registry, dropping what a previous incarnation left."""
        with self._operation():
            check_partition_id(partition_id)
            entries = self._registry_entries("register_partition", partition_id)
            records = parse_registry(entries)
            if partition_id in records:
                raise already_registered(partition_id)
            reg = check_registration(partition_id, fields, n, tasks, group_size, enums)
            record = Record(
                partition_id=partition_id,
                incarnation=uuid.uuid4().hex,
                fields=reg.fields,
                tasks=reg.tasks,
                num_samples=reg.num_samples,
                group_size=reg.grpo_group_size,
                enums={k: list(v) for k, v in reg.enums.items()},
            )
            stale = stale_registry_keys(entries, partition_id)
            client = self._client

            async def _register() -> None:
                # A library partition left behind by an interrupted drop must not leak old rows
                # into the new incarnation.
                await drop_partition(client, partition_id, stale)
                await write_registry(client, {record_key(partition_id): record.to_tag()})

            self._data(_register, "register_partition", partition_id)

    def _claim(
        self, partition_id: Any, task_name: Any, fields: Any, n: Any, blocking: bool, timeout_s: Any
    ) -> KVBatchMeta:
        """Check the claim under the lock, then poll the controller's task cursor (lock per try)."""
        with self._operation():
            check_partition_id(partition_id)
            rec = self._require_record(partition_id, "claim_meta")
            check_task(partition_id, rec.tasks, task_name)
            fields = check_claim_request(partition_id, rec.fields, fields, n, timeout_s)

        client = self._client

        async def _claim() -> tuple[list[str], list[dict[str, Any]]] | None:
            meta = await client.async_get_meta(
                data_fields=list(fields), batch_size=n, partition_id=partition_id, mode="fetch", task_name=task_name
            )
            if meta.size == 0:
                return None
            indexes = list(meta.global_indexes)
            keys = await client.async_kv_retrieve_keys(global_indexes=indexes, partition_id=partition_id)
            return list(keys), [dict(t) for t in meta.custom_meta]

        def _attempt() -> tuple[list[str], list[dict[str, Any]] | None]:
            self._check_open()
            with self._lock:
                got = self._ctl(_claim, "claim_meta", partition_id)
            if got is None:
                return [], None
            ids, stored = got
            return ids, copy.deepcopy(stored) if any(stored) else None

        return self._poll_claim(_attempt, partition_id, task_name, fields, n, blocking, timeout_s)

    def _require_known(self, partition_id: str) -> None:
        with self._lock:
            check_partition_id(partition_id)
            self._require_record(partition_id, "get_data")

    def _consumed(self, partition_id: Any, task_names: Any) -> bool:
        """Whether the controller's consumption status is complete for every task."""
        with self._operation():
            check_partition_id(partition_id)
            rec = self._require_record(partition_id, "check_consumption_status")
            tasks = check_consumption_tasks(partition_id, rec.tasks, task_names)
            client = self._client

            async def _status() -> bool:
                results = await asyncio.gather(*(client.async_get_consumption_status(t, partition_id) for t in tasks))
                return all(s is not None and s.numel() > 0 and bool((s == 1).all()) for _, s in results)

            return self._ctl(_status, "check_consumption_status", partition_id)
