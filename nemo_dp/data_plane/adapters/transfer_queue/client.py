"""``TQDataPlaneClient``: the data-plane calls over TransferQueue 0.1.11 (SimpleStorage) on Ray.

TransferQueue is silent where the contract demands loud errors, so every call is checked against the
partition ``registry`` and the controller's metadata, and every library coroutine is bounded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tensordict import TensorDict

from nemo_dp.data_plane.adapters._base import BaseDataPlaneClient, coerce_dataclass_config
from nemo_dp.data_plane.adapters._validation import (
    OBJECT_LEAF,
    check_clear_ids,
    check_enum_put,
    check_partition_id,
    check_put_args,
    check_undeclared,
    closed_error,
    kind_changed,
    put_receipt,
    unknown_ids,
    unknown_partition,
    unproduced_fields,
    wire_leaf_kind,
)
from nemo_dp.data_plane.adapters.transfer_queue.checkpoint import TQCheckpointMixin
from nemo_dp.data_plane.adapters.transfer_queue.lifetime import (
    OPEN_LOCK,
    LoopThread,
    attach,
    library_interface,
    load_library,
    open_client,
    reset_library,
    set_open_client,
    start_system,
    wait_controller_gone,
)
from nemo_dp.data_plane.adapters.transfer_queue.registry import (
    REGISTRY_PARTITION,
    Record,
    drop_partition,
    live_keys,
    parse_registry,
    stale_registry_keys,
    type_entries,
    write_registry,
)
from nemo_dp.data_plane.adapters.transfer_queue.row_wire import decode_column, encode_put
from nemo_dp.data_plane.adapters.transfer_queue.tasks import TQTaskMixin
from nemo_dp.data_plane.adapters.transfer_queue_env import configure_engine_env
from nemo_dp.data_plane.interfaces import DataPlaneConfig, DataPlaneUnavailableError, KVBatchMeta
from nemo_dp.data_plane.schema import INPUT_LENGTHS

__all__ = ["TQDataPlaneClient"]

_T = TypeVar("_T")


def _find_in_chain(exc: BaseException, name: str) -> BaseException | None:
    """First exception in ``exc``'s cause/context chain whose class is called ``name``."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if type(cur).__name__ == name:
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


class TQDataPlaneClient(TQTaskMixin, TQCheckpointMixin, BaseDataPlaneClient):
    """The data-plane contract over TransferQueue (SimpleStorage) on Ray.

    The library's async API runs on one event-loop thread the client owns, so every call is
    bounded and the caller's ``torch.set_num_threads`` survives.

    Args:
        bootstrap: ``True`` (the driver) starts the library's controller and storage units;
            ``False`` attaches to the running ones and never creates.
        checkpointing: Assert that the backend supports checkpoints.

    Raises:
        RuntimeError: Ray is not initialised; a knob is missing after the library was imported;
            another client is open in this process; the controller already exists (bootstrap) or
            does not (attach); too few Ray CPUs; start-up exceeded ``timeouts.startup_s``.
        ValueError: ``checkpointing=True`` on a backend without checkpoint support.
    """

    BACKEND = "TransferQueue"

    def __init__(self, cfg: DataPlaneConfig, *, bootstrap: bool = True, checkpointing: bool = False) -> None:
        self._cfg = coerce_dataclass_config(cfg, DataPlaneConfig, "TQDataPlaneClient")
        self._init_lifetime(bootstrap, closed=True)  # open once construction succeeds
        self._lock = threading.RLock()
        self._loop: LoopThread | None = None
        self._client: Any = None
        self._backend_config: Any = None
        t = self._cfg.timeouts
        self._controller_s = float(t.controller_s)
        self._data_s = float(t.controller_s + t.storage_max_attempts * t.storage_s + t.storage_probe_s)
        # Set once the library gave up on a storage unit: later data calls fail at once.
        self._storage_gone: str | None = None
        self._startup_s = float(t.startup_s)
        self._poll_s = float(self._cfg.claim_meta_poll_interval_s)

        if checkpointing and self._cfg.backend != "simple":
            raise ValueError(
                f"data_plane.backend={self._cfg.backend!r} does not support checkpoints "
                "(checkpointing=True needs backend 'simple')"
            )

        import ray

        if not ray.is_initialized():
            raise RuntimeError(
                "TQDataPlaneClient needs a running Ray: call "
                "nemo_dp.distributed.ray_init.init_ray(...) (or ray.init) first"
            )
        # Knobs first: the library reads them once, at import.
        configure_engine_env(self._cfg)

        with OPEN_LOCK:
            if open_client() is not None:
                raise RuntimeError(
                    "a TQDataPlaneClient is already open in this process (the TransferQueue "
                    "library keeps one client per process); close it first"
                )
            if self._bootstrap:
                self._backend_config = start_system(
                    self._cfg, startup_s=self._startup_s, controller_s=self._controller_s
                )
            else:
                self._backend_config = attach(startup_s=self._startup_s)
            self._client = library_interface()._TQ_CLIENT
            if self._client is None:  # pragma: no cover - the library contract guarantees it
                raise RuntimeError("TransferQueue did not create its client")
            self._loop = LoopThread(name="nemo-dp-tq-loop")
            self._closed = False
            set_open_client(self)

    @property
    def backend_config(self) -> Any:
        """The library's merged configuration in force (read-only ``DictConfig``)."""
        return self._backend_config

    def _run(self, make: Callable[[], Awaitable[_T]], *, op: str, partition_id: str, bound: float) -> _T:
        """Run one library coroutine on the adapter's loop (``DataPlaneUnavailableError`` past ``bound`` seconds)."""
        loop = self._loop
        if loop is None or self._closed:
            raise closed_error(self.BACKEND)
        future = loop.submit(make(), bound)
        try:
            # The loop enforces the bound; the margin only guards against a wedged loop thread.
            return future.result(bound + 5.0)
        except (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError) as exc:
            future.cancel()
            raise DataPlaneUnavailableError(
                f"TransferQueue {op} on partition {partition_id!r} got no answer within {bound:g}s "
                "(controller or storage unit unreachable; treat the step as failed)"
            ) from exc
        except Exception as exc:
            if isinstance(exc, DataPlaneUnavailableError):
                raise
            timeout = _find_in_chain(exc, "StorageUnitTimeout")
            if timeout is not None:
                message = (
                    f"TransferQueue {op} on partition {partition_id!r}: a storage unit did not "
                    f"answer within the configured bound ({bound:g}s): {timeout}"
                )
                self._storage_gone = self._storage_gone or message
                raise DataPlaneUnavailableError(message) from exc
            raise

    def _ctl(self, make: Callable[[], Awaitable[_T]], op: str, partition_id: str) -> _T:
        return self._run(make, op=op, partition_id=partition_id, bound=self._controller_s)

    def _data(self, make: Callable[[], Awaitable[_T]], op: str, partition_id: str) -> _T:
        """A put / get / clear, bounded by the data-call bound; fails at once once a storage unit is gone."""
        if self._storage_gone is not None:
            raise DataPlaneUnavailableError(
                f"TransferQueue {op} on partition {partition_id!r}: not attempted, an earlier call "
                f"of this process found a storage unit gone ({self._storage_gone}); treat the step "
                "as failed"
            )
        return self._run(make, op=op, partition_id=partition_id, bound=self._data_s)

    def _registry_entries(self, op: str, partition_id: str) -> dict[str, dict[str, Any]]:
        client = self._client

        async def _list() -> dict[str, dict[str, Any]]:
            info = await client.async_kv_list(REGISTRY_PARTITION)
            return dict(info[REGISTRY_PARTITION]) if REGISTRY_PARTITION in info else {}

        return self._ctl(_list, op, partition_id)

    def _require_record(self, partition_id: str, op: str) -> Record:
        rec = parse_registry(self._registry_entries(op, partition_id)).get(partition_id)
        if rec is None:
            raise unknown_partition(partition_id)
        return rec

    def _existing_meta(self, ids: list[str], partition_id: str, op: str, *, recheck: bool) -> Any:
        """The library's metadata of live ``ids``; ``KeyError`` for unknown ones (``recheck``: the partition first)."""
        client = self._client
        meta = self._ctl(
            lambda: client.async_kv_retrieve_meta(keys=ids, partition_id=partition_id, create=False), op, partition_id
        )
        if meta.size != len(ids):
            if recheck:
                self._require_record(partition_id, op)
            live = self._ctl(lambda: live_keys(client, partition_id), op, partition_id)
            raise unknown_ids(partition_id, [i for i in ids if i not in live])
        return meta

    def _put(self, sample_ids: Any, partition_id: Any, fields: Any, tags: Any) -> KVBatchMeta:
        """Write (upsert) rows: check everything against the registry record, record new field types, then put."""
        with self._operation():
            check_partition_id(partition_id)
            rec = self._require_record(partition_id, "put_samples")
            args = check_put_args(partition_id, sample_ids, fields, tags)
            ids, names, tag_list, n = args.ids, args.names, args.tags, len(args.ids)
            leaves = {k: fields.get(k) for k in names}
            check_undeclared(partition_id, names, rec.fields)
            # Leaf types first (all TypeErrors): a whole-column object is named as such even when
            # the field already holds tensors.
            kinds = {k: wire_leaf_kind(k, leaves[k], n) for k in names}
            new_types: dict[str, tuple[str, str | None]] = {}
            for k in names:
                dtype = None if kinds[k] == OBJECT_LEAF else str(leaves[k].dtype)
                stored = rec.field_types.get(k)
                if stored is None:
                    new_types[k] = (kinds[k], dtype)
                elif stored != (kinds[k], dtype):
                    raise kind_changed(partition_id, k, f"{stored[0]}/{stored[1]}", f"{kinds[k]}/{dtype}")
            wire: dict[str, Any] = {}
            for k in names:
                v = leaves[k]
                if k in rec.enums:
                    values = v.tolist() if kinds[k] == OBJECT_LEAF else None
                    check_enum_put(k, rec.enums[k], values, "" if values is not None else str(v.dtype))
                wire[k] = v if kinds[k] == OBJECT_LEAF else v.detach().cpu()
            receipt = put_receipt(partition_id, ids, list(names) or None, wire.get(INPUT_LENGTHS), tag_list)
            if n == 0:
                return receipt

            client = self._client
            entries = type_entries(partition_id, rec.incarnation, new_types)

            async def _prepare() -> Any:
                if entries:
                    await write_registry(client, entries)
                return await client.async_kv_retrieve_meta(keys=ids, partition_id=partition_id, create=True)

            meta = self._ctl(_prepare, "put_samples", partition_id)
            if meta.size != n:
                raise RuntimeError(f"TransferQueue resolved {meta.size} of {n} ids for a put to {partition_id!r}")
            # An empty list makes the library skip its tag RPC: a put without tags must not
            # re-send (and so possibly revert) tags another process wrote meanwhile.
            meta.custom_meta = copy.deepcopy(tag_list) if tag_list is not None else []

            if wire:
                encoded = encode_put(wire, n)
                td = TensorDict(encoded.wire, batch_size=[n])
                self._data(
                    lambda: client.async_put(td, meta, data_parser=encoded.parser),
                    "put_samples",
                    partition_id,
                )
            else:
                self._ctl(lambda: client.async_set_custom_meta(meta), "put_samples", partition_id)
            return receipt

    def _get(self, sample_ids: Any, partition_id: Any, select_fields: Any) -> TensorDict:
        with self._operation():
            check_partition_id(partition_id)
            ids, fields = self._read_args(
                sample_ids, select_fields, lambda: self._require_record(partition_id, "get_samples")
            )
            if not ids:
                return TensorDict({}, batch_size=(0,))

            client = self._client
            n = len(ids)
            meta = self._existing_meta(ids, partition_id, "get_samples", recheck=True)
            produced = set(meta.field_names)
            unproduced = [f for f in fields if f not in produced]
            if unproduced:
                self._require_record(partition_id, "get_samples")
                raise unproduced_fields(partition_id, unproduced)
            meta = meta.select_fields(fields)
            raw = self._data(lambda: client.async_get_data(meta), "get_samples", partition_id)
            if raw.batch_size[0] != n or set(raw.keys()) != set(fields):
                raise RuntimeError(
                    f"TransferQueue returned {raw.batch_size[0]} rows with fields "
                    f"{sorted(raw.keys())} for {n} ids and fields {sorted(fields)} of "
                    f"{partition_id!r}"
                )
            return TensorDict({f: decode_column(raw.get(f), f) for f in fields}, batch_size=[n])

    def _list_ids(self, partition_id: Any) -> list[str]:
        with self._operation():
            check_partition_id(partition_id)
            return sorted(
                self._ctl(lambda: live_keys(self._client, partition_id), "list_sample_ids", partition_id)
            )

    def _clear(self, sample_ids: Any, partition_id: Any) -> None:
        """Drop rows, or (``None``) the library partition and its registry record."""
        with self._operation():
            check_partition_id(partition_id)
            entries = self._registry_entries("clear_samples", partition_id)
            if partition_id not in parse_registry(entries):
                raise unknown_partition(partition_id)
            client = self._client
            if sample_ids is None:
                stale = stale_registry_keys(entries, partition_id)
                self._data(lambda: drop_partition(client, partition_id, stale), "clear_samples", partition_id)
                return
            ids = check_clear_ids(sample_ids)
            if not ids:
                return
            meta = self._existing_meta(ids, partition_id, "clear_samples", recheck=False)
            self._data(lambda: client.async_clear_samples(meta), "clear_samples", partition_id)

    def close(self) -> None:
        """Close this client (idempotent; backend errors are logged); the bootstrapping client also tears the
        system down and returns once the controller no longer resolves (bounded by ``timeouts.controller_s``).
        """
        with OPEN_LOCK:
            if self._closed:
                return
            self._closed = True
            with self._lock:
                if self._loop is not None:
                    self._loop.stop()
                    self._loop = None
                try:
                    reset_library(load_library(), kill=self._bootstrap)
                finally:
                    self._client = None
                    if open_client() is self:
                        set_open_client(None)
            if self._bootstrap:
                wait_controller_gone(self._controller_s)
