"""``TQDataPlaneClient``: the data-plane contract over TransferQueue 0.1.11 (SimpleStorage) on Ray.

Why this module exists: TransferQueue gives a cluster-wide, columnar key/value store, but it is
silent where the contract (``shared/docs/data-plane-contract.md`` §4, §6, §7) demands loud
errors: a get with unknown keys returns fewer rows, a misspelled field returns no column, a
dtype change is only logged by the controller, duplicate keys are rejected after the write, a
dead controller hangs every call forever and a dead storage unit for minutes.  This adapter
keeps a cluster-wide partition registry inside the library's own controller and checks every
call against it and against the controller's metadata before and after the wire call, runs the
library's async API on one event-loop thread it owns (so every call is bounded with
``asyncio.wait_for`` and the caller's ``torch.set_num_threads`` survives), and densifies the
jagged columns the library returns for dense puts.

This is the **only** module of nemo_dp that imports ``transfer_queue``, and it does so lazily
(inside functions), never at module import.  The library's ports are unauthenticated and its
checkpoints are pickles: trusted networks and trusted paths only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import json
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from nemo_dp.data_plane.adapters._validation import duplicates as _duplicates
from nemo_dp.data_plane.adapters.transfer_queue_env import configure_engine_env
from nemo_dp.utils.checkpoint_io import (
    read_manifest,
    validate_json_metadata,
    write_checkpoint_atomically,
    write_manifest,
)
from nemo_dp.data_plane.interfaces import (
    DataPlaneClient,
    DataPlaneConfig,
    DataPlaneUnavailableError,
    KVBatchMeta,
)
from nemo_dp.data_plane.schema import INPUT_LENGTHS, RESERVED_PREFIX, TAG_INPUT_LENGTHS

if TYPE_CHECKING:  # pragma: no cover - typing only
    from types import ModuleType

__all__ = [
    "TQDataPlaneClient",
    "REGISTRY_PARTITION",
    "CONTROLLER_NAME",
    "CONTROLLER_NAMESPACE",
    "STORAGE_UNIT_NAME_PREFIX",
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_FORMAT_VERSION",
    "tq_controller_exists",
]

_LOG = logging.getLogger(__name__)

#: Reserved library partition holding one registry record per live nemo_dp partition.
REGISTRY_PARTITION = "__nemo_dp_registry__"
#: Name and Ray namespace of the library's controller actor (TransferQueue 0.1.11).
CONTROLLER_NAME = "TransferQueueController"
CONTROLLER_NAMESPACE = "transfer_queue"
#: Storage units are named ``<prefix><rank>`` in the bootstrapping job's namespace.
STORAGE_UNIT_NAME_PREFIX = "TransferQueueStorageUnit#"
CHECKPOINT_FORMAT = "nemo_dp.tq_data_plane"
CHECKPOINT_FORMAT_VERSION = 1
_CHECKPOINT_SUBDIR = "tq"
# File names the library's own save_checkpoint/load_checkpoint use inside its directory.
_TQ_CONTROLLER_FILE = "controller_state.pkl"
_TQ_METADATA_FILE = "metadata.json"

_RECORD_PREFIX = "partition:"
_FIELD_PREFIX = "field:"
_KIND_TENSOR = "tensor"
_KIND_OBJECT = "object"
_MAX_LISTED = 20

# At most one open client per process: the library keeps one client per process.
_OPEN_LOCK = threading.Lock()
_OPEN_CLIENT: TQDataPlaneClient | None = None

_T = TypeVar("_T")


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------


def _tq() -> ModuleType:
    """Import the library (lazily: its knobs are read at import, see transfer_queue_env)."""
    import transfer_queue

    return transfer_queue


def _tq_interface() -> ModuleType:
    import transfer_queue.interface

    return transfer_queue.interface


def tq_controller_exists() -> bool:
    """Whether the named TransferQueue controller actor exists in the connected Ray cluster.

    Returns:
        True if ``ray.get_actor("TransferQueueController", namespace="transfer_queue")`` resolves.
    """
    import ray

    try:
        ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE)
    except ValueError:
        return False
    return True


def _listed(items: Iterable[str]) -> str:
    ordered = sorted(items)
    head = ordered[:_MAX_LISTED]
    more = len(ordered) - len(head)
    return f"{head}" + (f" (+{more} more)" if more else "")


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__} ({value!r})")
    if not value:
        raise ValueError(f"{what} must be a non-empty string")
    return value


def _check_partition_id(partition_id: Any) -> str:
    _check_name(partition_id, "partition_id")
    if partition_id.startswith(RESERVED_PREFIX):
        raise ValueError(
            f"partition_id {partition_id!r} is reserved: ids starting with {RESERVED_PREFIX!r} "
            "belong to nemo_dp's own bookkeeping"
        )
    return partition_id


def _check_names(values: Any, what: str) -> list[str]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be a sequence of str, got {type(values).__name__}")
    out = [_check_name(v, f"{what} entry") for v in values]
    return out


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


def _leaf_kind(value: Any) -> str | None:
    """``"tensor"`` / ``"object"`` for a storable leaf; ``None`` for an unsupported one."""
    if isinstance(value, torch.Tensor):
        return _KIND_TENSOR
    if isinstance(value, (NonTensorStack, NonTensorData)):
        return _KIND_OBJECT
    return None


def _dtype_name(value: Any) -> str | None:
    return str(value.dtype) if isinstance(value, torch.Tensor) else None


def _densify(value: Any) -> Any:
    """Turn a nested column whose rows all share one shape into a dense tensor.

    The library packs every non-scalar column into a jagged nested tensor whose ``values()``
    are already contiguous rows; when all rows have one length the dense tensor is a view of
    that buffer (no copy).  Ragged columns, dense tensors and object columns pass through.
    """
    if not isinstance(value, torch.Tensor) or not value.is_nested:
        return value
    if value.layout == torch.jagged and getattr(value, "_ragged_idx", 1) == 1 and value.lengths() is None:
        offsets = value.offsets()
        n = offsets.numel() - 1
        if n <= 0:
            return value
        lengths = offsets.diff()
        first = int(lengths[0])
        if bool((lengths == first).all()):
            values = value.values()
            start = int(offsets[0])
            rows = values[start : start + n * first]
            return rows.reshape(n, first, *values.shape[1:])
        return value
    rows = value.unbind()
    if rows and all(r.shape == rows[0].shape for r in rows):
        return torch.stack(rows)
    return value


def _coerce_config(cfg: Any) -> DataPlaneConfig:
    if isinstance(cfg, DataPlaneConfig):
        return cfg
    if isinstance(cfg, Mapping):
        from omegaconf import DictConfig, OmegaConf

        container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
        merged = OmegaConf.merge(OmegaConf.structured(DataPlaneConfig), container)
        out = OmegaConf.to_object(merged)
        assert isinstance(out, DataPlaneConfig)
        return out
    raise TypeError(
        f"TQDataPlaneClient needs a DataPlaneConfig (or a mapping of it), got {type(cfg).__name__}"
    )


@dataclass
class _Record:
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
    def from_tag(cls, tag: Mapping[str, Any]) -> _Record:
        return cls(
            partition_id=str(tag["partition_id"]),
            incarnation=str(tag["incarnation"]),
            fields=list(tag["fields"]),
            tasks=list(tag["tasks"]),
            num_samples=int(tag["num_samples"]),
            group_size=None if tag["group_size"] is None else int(tag["group_size"]),
            enums={str(k): list(v) for k, v in dict(tag["enums"]).items()},
        )


def _record_key(partition_id: str) -> str:
    return f"{_RECORD_PREFIX}{partition_id}"


def _field_key(incarnation: str, field_name: str) -> str:
    return f"{_FIELD_PREFIX}{incarnation}:{field_name}"


def _parse_registry(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, _Record]:
    """Registry partition listing (key -> tag) -> live records with their field types."""
    records: dict[str, _Record] = {}
    for key, tag in entries.items():
        if key.startswith(_RECORD_PREFIX) and tag:
            rec = _Record.from_tag(tag)
            records[rec.partition_id] = rec
    by_incarnation = {rec.incarnation: rec for rec in records.values()}
    for key, tag in entries.items():
        if key.startswith(_FIELD_PREFIX) and tag:
            rec = by_incarnation.get(str(tag["incarnation"]))
            if rec is not None:
                rec.field_types[str(tag["field"])] = (str(tag["kind"]), tag["dtype"])
    return records


def _stale_registry_keys(entries: Mapping[str, Mapping[str, Any]], partition_id: str) -> list[str]:
    """Registry keys that belong to ``partition_id`` (record and per-field entries)."""
    return [
        key
        for key, tag in entries.items()
        if key == _record_key(partition_id)
        or (key.startswith(_FIELD_PREFIX) and tag and tag["partition_id"] == partition_id)
    ]


class _LoopThread:
    """One asyncio event loop on a daemon thread; the only thread that awaits the library."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Awaitable[_T], timeout: float) -> concurrent.futures.Future[_T]:
        async def bounded() -> _T:
            return await asyncio.wait_for(coro, timeout)

        return asyncio.run_coroutine_threadsafe(bounded(), self.loop)

    def stop(self, join_timeout: float = 5.0) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(join_timeout)
        if self._thread.is_alive():
            _LOG.warning("TransferQueue adapter loop thread did not stop within %.1fs", join_timeout)
            return
        self.loop.close()


# ---------------------------------------------------------------------------------------------
# the adapter
# ---------------------------------------------------------------------------------------------


class TQDataPlaneClient(DataPlaneClient):
    """The data-plane contract over TransferQueue (SimpleStorage) on Ray (contract §6).

    Args:
        cfg: The TransferQueue ``data_plane`` config (dataclass, mapping or ``DictConfig``).
        bootstrap: ``True`` (the driver) starts the library's controller and storage units;
            ``False`` (workers, rollout actors) attaches to the running ones and never creates.
        checkpointing: Assert that the backend supports checkpoints (always true for
            ``simple``).

    Raises:
        RuntimeError: Ray is not initialised; a knob is missing after the library was imported;
            another client is open in this process; the controller already exists (bootstrap) or
            does not exist (attach); the cluster has too few CPUs for the controller plus
            ``num_storage_units`` storage units; start-up exceeded ``timeouts.startup_s``.
        ValueError: ``checkpointing=True`` on a backend without checkpoint support.
    """

    def __init__(
        self, cfg: DataPlaneConfig, *, bootstrap: bool = True, checkpointing: bool = False
    ) -> None:
        global _OPEN_CLIENT
        self._cfg = _coerce_config(cfg)
        self._bootstrap = bool(bootstrap)
        self._closed = True  # until construction succeeds
        self._used = False
        self._lock = threading.RLock()
        self._loop: _LoopThread | None = None
        self._client: Any = None
        self._backend_config: Any = None
        t = self._cfg.timeouts
        self._controller_s = float(t.controller_s)
        self._data_s = float(t.controller_s + t.storage_max_attempts * t.storage_s + t.storage_probe_s)
        self._startup_s = float(t.startup_s)

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
        # Knobs first: the library reads them once, at import (contract §9.5).
        configure_engine_env(self._cfg)

        with _OPEN_LOCK:
            if _OPEN_CLIENT is not None:
                raise RuntimeError(
                    "a TQDataPlaneClient is already open in this process (the TransferQueue "
                    "library keeps one client per process); close it first"
                )
            tq = _tq()
            if self._bootstrap:
                self._start_system(ray, tq)
            else:
                self._attach(ray)
            self._client = _tq_interface()._TQ_CLIENT
            if self._client is None:  # pragma: no cover - the library contract guarantees it
                raise RuntimeError("TransferQueue did not create its client")
            self._loop = _LoopThread(name="nemo-dp-tq-loop")
            self._closed = False
            _OPEN_CLIENT = self

    # --- construction helpers -------------------------------------------------------------------

    def _start_system(self, ray: Any, tq: ModuleType) -> None:
        n_units = int(self._cfg.simple.num_storage_units)
        if tq_controller_exists():
            raise RuntimeError(
                f"a TransferQueue controller ({CONTROLLER_NAME!r} in Ray namespace "
                f"{CONTROLLER_NAMESPACE!r}) already exists in this Ray cluster; refusing to "
                "attach silently to a system with possibly different settings (e.g. a previous "
                "multirun job did not close its data plane). Close the old bootstrap client "
                "or restart Ray."
            )
        total_cpus = float(ray.cluster_resources().get("CPU", 0.0))
        if total_cpus < 1 + n_units:
            raise RuntimeError(
                f"the Ray cluster has {total_cpus:g} logical CPUs, but the TransferQueue controller "
                f"and data_plane.simple.num_storage_units={n_units} storage units reserve "
                f"{1 + n_units}: the library's start-up would deadlock waiting for CPUs. Lower "
                "num_storage_units or start Ray with more logical CPUs."
            )
        conf = {
            "controller": {"polling_mode": True},
            "backend": {
                "storage_backend": "SimpleStorage",
                "SimpleStorage": {
                    "total_storage_size": int(self._cfg.simple.storage_capacity),
                    "num_data_storage_units": n_units,
                },
            },
        }
        outcome: dict[str, Any] = {}

        def _init() -> None:
            try:
                outcome["conf"] = tq.init(conf)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                outcome["error"] = exc

        worker = threading.Thread(target=_init, name="nemo-dp-tq-bootstrap", daemon=True)
        worker.start()
        worker.join(self._startup_s)
        if worker.is_alive() or "error" in outcome:
            timed_out = worker.is_alive()
            self._remove_system_actors(ray, n_units)
            worker.join(self._controller_s)
            self._reset_library(tq, kill=True)
            if timed_out:
                raise RuntimeError(
                    f"TransferQueue bootstrap did not finish within data_plane.timeouts.startup_s="
                    f"{self._startup_s:g}s; its controller and storage actors were removed"
                )
            raise RuntimeError(f"TransferQueue bootstrap failed: {outcome['error']}") from outcome[
                "error"
            ]
        from omegaconf import OmegaConf

        backend_config = copy.deepcopy(outcome["conf"])
        OmegaConf.set_readonly(backend_config, True)
        self._backend_config = backend_config

    def _attach(self, ray: Any) -> None:
        missing = (
            f"no TransferQueue controller ({CONTROLLER_NAME!r} in Ray namespace "
            f"{CONTROLLER_NAMESPACE!r}) is running in this Ray cluster; build the driver client "
            "with bootstrap=True first"
        )
        if not tq_controller_exists():
            raise RuntimeError(missing)
        interface = _tq_interface()
        outcome: dict[str, Any] = {}

        def _connect() -> None:
            # The library's private attach path: unlike init() it never creates a new system.
            try:
                outcome["ok"] = interface._init_from_existing()
                if outcome["ok"]:
                    handle = interface._TQ_CONTROLLER
                    outcome["conf"] = ray.get(handle.get_config.remote())
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                outcome["error"] = exc

        worker = threading.Thread(target=_connect, name="nemo-dp-tq-attach", daemon=True)
        worker.start()
        worker.join(self._startup_s)
        if worker.is_alive():
            raise RuntimeError(
                f"attaching to the TransferQueue controller did not finish within "
                f"data_plane.timeouts.startup_s={self._startup_s:g}s"
            )
        if "error" in outcome:
            self._reset_library(_tq(), kill=False)
            raise RuntimeError(f"attaching to TransferQueue failed: {outcome['error']}") from outcome[
                "error"
            ]
        if not outcome["ok"]:
            self._reset_library(_tq(), kill=False)
            raise RuntimeError(missing)
        from omegaconf import OmegaConf

        backend_config = copy.deepcopy(outcome["conf"])
        OmegaConf.set_readonly(backend_config, True)
        self._backend_config = backend_config

    def _remove_system_actors(self, ray: Any, n_units: int) -> None:
        names: list[tuple[str, str | None]] = [(CONTROLLER_NAME, CONTROLLER_NAMESPACE)]
        names += [(f"{STORAGE_UNIT_NAME_PREFIX}{i}", None) for i in range(n_units)]
        for name, namespace in names:
            try:
                handle = ray.get_actor(name, namespace=namespace)
            except ValueError:
                continue
            try:
                ray.kill(handle)
            except Exception as exc:  # noqa: BLE001 - best effort clean-up
                _LOG.warning("could not kill %s: %s", name, exc)

    @staticmethod
    def _reset_library(tq: ModuleType, *, kill: bool) -> None:
        """Drop the library's process-level client/controller handles.

        ``kill=True`` goes through ``tq.close()`` (which also kills the actors this process
        created); ``kill=False`` only closes this process's client: the library's own close
        would ``ray.kill`` the shared controller even from an attached process.
        """
        interface = _tq_interface()
        if kill:
            try:
                tq.close()
            except Exception as exc:  # noqa: BLE001 - logged, close never raises
                _LOG.warning("TransferQueue close failed: %s", exc)
            return
        client = interface._TQ_CLIENT
        interface._TQ_CLIENT = None
        interface._TQ_CONTROLLER = None
        if client is not None:
            try:
                client.close()
            except Exception as exc:  # noqa: BLE001 - logged, close never raises
                _LOG.warning("TransferQueue client close failed: %s", exc)

    # --- properties -------------------------------------------------------------------------

    @property
    def backend_config(self) -> Any:
        """The library's merged configuration in force (read-only ``DictConfig``)."""
        return self._backend_config

    @property
    def is_bootstrap(self) -> bool:
        """Whether this client started (and on close tears down) the library's actors."""
        return self._bootstrap

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has run."""
        return self._closed

    # --- bounded calls ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("TransferQueue data-plane client is closed.")

    def _run(
        self,
        make: Callable[[], Awaitable[_T]],
        *,
        op: str,
        partition_id: str,
        bound: float,
    ) -> _T:
        """Run one library coroutine on the adapter's loop, bounded by ``bound`` seconds.

        Raises:
            DataPlaneUnavailableError: The bound expired, or a storage unit did not answer.
        """
        loop = self._loop
        if loop is None or self._closed:
            raise RuntimeError("TransferQueue data-plane client is closed.")
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
                raise DataPlaneUnavailableError(
                    f"TransferQueue {op} on partition {partition_id!r}: a storage unit did not "
                    f"answer within the configured bound ({bound:g}s): {timeout}"
                ) from exc
            raise

    def _ctl(self, make: Callable[[], Awaitable[_T]], op: str, partition_id: str) -> _T:
        return self._run(make, op=op, partition_id=partition_id, bound=self._controller_s)

    def _data(self, make: Callable[[], Awaitable[_T]], op: str, partition_id: str) -> _T:
        return self._run(make, op=op, partition_id=partition_id, bound=self._data_s)

    # --- registry ---------------------------------------------------------------------------

    def _registry_entries(self, op: str, partition_id: str) -> dict[str, dict[str, Any]]:
        client = self._client

        async def _list() -> dict[str, dict[str, Any]]:
            info = await client.async_kv_list(REGISTRY_PARTITION)
            return dict(info[REGISTRY_PARTITION]) if REGISTRY_PARTITION in info else {}

        return self._ctl(_list, op, partition_id)

    def _records(self, op: str, partition_id: str) -> dict[str, _Record]:
        return _parse_registry(self._registry_entries(op, partition_id))

    def _require_record(self, partition_id: str, op: str) -> _Record:
        rec = self._records(op, partition_id).get(partition_id)
        if rec is None:
            raise KeyError(
                f"unknown data-plane partition {partition_id!r} (not registered, or already "
                "dropped with clear_samples(None, ...))"
            )
        return rec

    async def _a_write_registry(self, entries: Mapping[str, dict[str, Any]]) -> None:
        keys = list(entries)
        meta = await self._client.async_kv_retrieve_meta(
            keys=keys, partition_id=REGISTRY_PARTITION, create=True
        )
        if meta.size != len(keys):
            raise RuntimeError(
                f"TransferQueue registry write resolved {meta.size} of {len(keys)} keys"
            )
        meta.custom_meta = [copy.deepcopy(entries[k]) for k in keys]
        await self._client.async_set_custom_meta(meta)

    async def _a_delete_registry(self, keys: list[str]) -> None:
        if not keys:
            return
        meta = await self._client.async_kv_retrieve_meta(
            keys=keys, partition_id=REGISTRY_PARTITION, create=False
        )
        if meta.size:
            await self._client.async_clear_samples(meta)

    async def _a_live_keys(self, partition_id: str) -> set[str]:
        info = await self._client.async_kv_list(partition_id)
        return set(info[partition_id]) if partition_id in info else set()

    def _missing_ids_error(self, partition_id: str, ids: Sequence[str], op: str) -> KeyError:
        live = self._ctl(lambda: self._a_live_keys(partition_id), op, partition_id)
        missing = [i for i in ids if i not in live]
        return KeyError(
            f"unknown sample ids in partition {partition_id!r} (never written or cleared): "
            f"{_listed(missing)}"
        )

    # --- task-mediated half -----------------------------------------------------------------

    def register_partition(
        self,
        partition_id: str,
        fields: Sequence[str],
        num_samples: int,
        consumer_tasks: Sequence[str],
        grpo_group_size: int | None = None,
        enums: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """Declare a partition cluster-wide (contract §4.2).

        Raises:
            ValueError: Live id (``"already registered"``), duplicate fields/tasks
                (``"must be unique"``), ``num_samples <= 0``, bad group size or enums.
            TypeError: Non-string names.
        """
        self._check_open()
        with self._lock:
            self._used = True
            _check_partition_id(partition_id)
            entries = self._registry_entries("register_partition", partition_id)
            records = _parse_registry(entries)
            if partition_id in records:
                raise ValueError(
                    f"partition {partition_id!r} is already registered; drop it with "
                    "clear_samples(None, partition_id) before registering it again"
                )
            field_list = _check_names(fields, "fields")
            if dups := _duplicates(field_list):
                raise ValueError(f"fields must be unique; duplicated: {dups}")
            task_list = _check_names(consumer_tasks, "consumer_tasks")
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
                words = _check_names(vocab, f"enums[{name!r}]")
                if dups := _duplicates(words):
                    raise ValueError(f"enums[{name!r}] vocabulary must be unique; duplicated: {dups}")
                enum_map[name] = words

            record = _Record(
                partition_id=partition_id,
                incarnation=uuid.uuid4().hex,
                fields=field_list,
                tasks=task_list,
                num_samples=num_samples,
                group_size=grpo_group_size,
                enums=enum_map,
            )
            stale = _stale_registry_keys(entries, partition_id)
            client = self._client

            async def _register() -> None:
                # A library partition left behind by an interrupted drop must not leak old rows
                # into the new incarnation.
                if partition_id in await client.async_get_partition_list():
                    await client.async_clear_partition(partition_id)
                await self._a_delete_registry(stale)
                await self._a_write_registry({_record_key(partition_id): record.to_tag()})

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
        """Claim ``batch_size`` ready rows for ``task_name`` (contract §4.2).

        Raises:
            KeyError: Unknown partition or task (``"task"``).
            ValueError: Empty/undeclared ``required_fields``, ``batch_size < 1``,
                ``timeout_s <= 0``.
            TimeoutError: A blocking claim was not satisfied within ``timeout_s``.
        """
        self._check_open()
        with self._lock:
            self._used = True
            _check_partition_id(partition_id)
            rec = self._require_record(partition_id, "claim_meta")
            _check_name(task_name, "task_name")
            if task_name not in rec.tasks:
                raise KeyError(
                    f"unknown consumer task {task_name!r} for partition {partition_id!r}; "
                    f"registered tasks: {rec.tasks}"
                )
            fields = _check_names(required_fields, "required_fields")
            if not fields:
                raise ValueError("required_fields must name at least one field")
            undeclared = [f for f in fields if f not in rec.fields]
            if undeclared:
                raise ValueError(
                    f"required_fields {undeclared} are not declared fields of partition "
                    f"{partition_id!r} (declared: {rec.fields})"
                )
            if isinstance(batch_size, bool) or not isinstance(batch_size, int):
                raise TypeError(f"batch_size must be an int, got {batch_size!r}")
            if batch_size < 1:
                raise ValueError(f"batch_size must be >= 1, got {batch_size}")
            if not timeout_s > 0:
                raise ValueError(f"timeout_s must be > 0, got {timeout_s}")

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
                _check_partition_id(meta.partition_id)
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
            _check_partition_id(partition_id)
            rec = self._require_record(partition_id, "check_consumption_status")
            tasks = _check_names(task_names, "task_names")
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

    # --- direct-by-key half -----------------------------------------------------------------

    def put_samples(
        self,
        sample_ids: Sequence[str],
        partition_id: str,
        fields: TensorDict | None = None,
        tags: Sequence[dict] | None = None,
    ) -> KVBatchMeta:
        """Write (upsert) rows; everything is validated before anything is written.

        Raises:
            KeyError: Unknown partition.
            ValueError: Neither fields nor tags, duplicate ids, length mismatch, undeclared
                field, enum value outside its vocabulary.
            TypeError: Non-JSON tags, dtype/kind change of a stored field, a ``NonTensorData``
                (``"non-tensor"``) or nested ``TensorDict`` leaf.
        """
        self._check_open()
        with self._lock:
            self._used = True
            _check_partition_id(partition_id)
            rec = self._require_record(partition_id, "put_samples")
            ids = _check_names(sample_ids, "sample_ids")
            if fields is None and tags is None:
                raise ValueError("put_samples needs fields or tags (got neither)")
            if dups := _duplicates(ids):
                raise ValueError(f"duplicate sample ids in one put to {partition_id!r}: {_listed(dups)}")
            n = len(ids)
            names: list[str] = []
            leaves: dict[str, Any] = {}
            if fields is not None:
                if not isinstance(fields, TensorDictBase):
                    raise TypeError(f"fields must be a TensorDict, got {type(fields).__name__}")
                if fields.batch_dims != 1 or fields.batch_size[0] != n:
                    raise ValueError(
                        f"fields batch_size {tuple(fields.batch_size)} does not match "
                        f"{n} sample ids (expected ({n},))"
                    )
                names = list(fields.keys())
                leaves = {k: fields.get(k) for k in names}
            tag_list: list[dict[str, Any]] | None = None
            if tags is not None:
                tag_list = list(tags)
                if len(tag_list) != n:
                    raise ValueError(f"tags has {len(tag_list)} entries for {n} sample ids")
                checked: list[dict[str, Any]] = []
                for i, t in enumerate(tag_list):
                    if not isinstance(t, Mapping):
                        raise TypeError(f"tags[{i}] must be a dict, got {type(t).__name__}")
                    try:
                        # A detached JSON-normalised copy; non-str keys and objects are rejected.
                        checked.append(validate_json_metadata(t))
                    except (TypeError, ValueError) as exc:
                        raise TypeError(f"tags[{i}] is not JSON-compatible: {exc}") from exc
                tag_list = checked
            if fields is not None and not names and tag_list is None:
                raise ValueError("put_samples needs fields or tags (fields has no columns)")
            undeclared = [k for k in names if k not in rec.fields]
            if undeclared:
                raise ValueError(
                    f"fields {undeclared} are not declared for partition {partition_id!r} "
                    f"(declared: {rec.fields})"
                )
            # Leaf types first (all TypeErrors): a whole-column object must be named as such
            # even when the field already holds tensors.
            for k in names:
                v = leaves[k]
                if isinstance(v, NonTensorData):
                    raise TypeError(
                        f"field {k!r} is a NonTensorData (one non-tensor object for the whole "
                        "column); the wire would drop it - use a per-row NonTensorStack "
                        "(pack_jagged_fields builds one)"
                    )
                if _leaf_kind(v) is None:
                    if isinstance(v, TensorDictBase):
                        raise TypeError(
                            f"field {k!r} is a nested TensorDict; only tensors and per-row "
                            "NonTensorStack columns are fields"
                        )
                    raise TypeError(f"field {k!r} has unsupported type {type(v).__name__}")
            new_types: dict[str, tuple[str, str | None]] = {}
            for k in names:
                kind = _leaf_kind(leaves[k])
                assert kind is not None
                dtype = _dtype_name(leaves[k])
                stored = rec.field_types.get(k)
                if stored is None:
                    new_types[k] = (kind, dtype)
                elif stored != (kind, dtype):
                    raise TypeError(
                        f"field {k!r} of partition {partition_id!r} is stored as "
                        f"{stored[0]}/{stored[1]}, this put has {kind}/{dtype}; a field's dtype "
                        "cannot change"
                    )
            wire: dict[str, Any] = {}
            for k in names:
                v = leaves[k]
                if isinstance(v, NonTensorStack):
                    if k in rec.enums:
                        vocab = rec.enums[k]
                        for value in v.tolist():
                            if value not in vocab:
                                raise ValueError(
                                    f"field {k!r} value {value!r} is not in its declared enum "
                                    f"vocabulary {vocab}"
                                )
                    wire[k] = v
                    continue
                if k in rec.enums:
                    raise ValueError(
                        f"field {k!r} takes values from its enum vocabulary {rec.enums[k]}, "
                        f"got a tensor column ({v.dtype})"
                    )
                v = v.detach()
                if v.device.type != "cpu":
                    v = v.cpu()
                wire[k] = v

            receipt = KVBatchMeta(
                partition_id=partition_id,
                task_name=None,
                sample_ids=list(ids),
                fields=list(names) if names else None,
                sequence_lengths=self._receipt_lengths(wire, tag_list),
                tags=copy.deepcopy(tag_list) if tag_list is not None else None,
            )
            if n == 0:
                return receipt

            client = self._client
            type_entries = {
                _field_key(rec.incarnation, k): {
                    "partition_id": partition_id,
                    "incarnation": rec.incarnation,
                    "field": k,
                    "kind": kind,
                    "dtype": dtype,
                }
                for k, (kind, dtype) in new_types.items()
            }

            async def _prepare() -> Any:
                if type_entries:
                    await self._a_write_registry(type_entries)
                return await client.async_kv_retrieve_meta(
                    keys=ids, partition_id=partition_id, create=True
                )

            meta = self._ctl(_prepare, "put_samples", partition_id)
            if meta.size != n:
                raise RuntimeError(
                    f"TransferQueue resolved {meta.size} of {n} ids for a put to {partition_id!r}"
                )
            # An empty list makes the library skip its tag RPC: a put without tags must not
            # re-send (and so possibly revert) tags another process wrote meanwhile.
            meta.custom_meta = copy.deepcopy(tag_list) if tag_list is not None else []

            if wire:
                td = TensorDict(wire, batch_size=[n])
                self._data(lambda: client.async_put(td, meta), "put_samples", partition_id)
            else:
                self._ctl(lambda: client.async_set_custom_meta(meta), "put_samples", partition_id)
            return receipt

    @staticmethod
    def _receipt_lengths(
        wire: Mapping[str, Any], tags: list[dict[str, Any]] | None
    ) -> list[int] | None:
        col = wire.get(INPUT_LENGTHS)
        if (
            isinstance(col, torch.Tensor)
            and not col.is_nested
            and col.dim() == 1
            and not col.is_floating_point()
            and not col.is_complex()
            and col.dtype != torch.bool
        ):
            return [int(x) for x in col.tolist()]
        if tags and all(TAG_INPUT_LENGTHS in t for t in tags):
            return [int(t[TAG_INPUT_LENGTHS]) for t in tags]
        return None

    def get_samples(
        self, sample_ids: Sequence[str], partition_id: str, select_fields: Sequence[str]
    ) -> TensorDict:
        """Read exactly the requested rows and fields, in the requested order.

        Raises:
            KeyError: Unknown partition, unknown/cleared ids (listed), unproduced fields.
            ValueError: Empty ``select_fields`` or duplicate ids.
        """
        self._check_open()
        with self._lock:
            self._used = True
            _check_partition_id(partition_id)
            try:
                if select_fields is None:
                    raise ValueError("get_samples needs a non-empty select_fields")
                fields = _check_names(select_fields, "select_fields")
                if not fields:
                    raise ValueError("get_samples needs a non-empty select_fields")
                if dups := _duplicates(fields):
                    raise ValueError(f"select_fields must be unique; duplicated: {dups}")
                ids = _check_names(sample_ids, "sample_ids")
                if dups := _duplicates(ids):
                    raise ValueError(f"duplicate sample ids in one get: {_listed(dups)}")
            except (TypeError, ValueError):
                # R3: an unknown partition outranks argument errors.
                self._require_record(partition_id, "get_samples")
                raise
            if not ids:
                self._require_record(partition_id, "get_samples")
                return TensorDict({}, batch_size=(0,))

            client = self._client
            n = len(ids)
            meta = self._ctl(
                lambda: client.async_kv_retrieve_meta(keys=ids, partition_id=partition_id, create=False),
                "get_samples",
                partition_id,
            )
            if meta.size != n:
                self._require_record(partition_id, "get_samples")
                raise self._missing_ids_error(partition_id, ids, "get_samples")
            produced = set(meta.field_names)
            unproduced = [f for f in fields if f not in produced]
            if unproduced:
                self._require_record(partition_id, "get_samples")
                raise KeyError(
                    f"fields {unproduced} of partition {partition_id!r} are not produced for every "
                    "requested id (never written, or misspelled)"
                )
            meta = meta.select_fields(fields)
            raw = self._data(lambda: client.async_get_data(meta), "get_samples", partition_id)
            if raw.batch_size[0] != n or set(raw.keys()) != set(fields):
                raise RuntimeError(
                    f"TransferQueue returned {raw.batch_size[0]} rows with fields "
                    f"{sorted(raw.keys())} for {n} ids and fields {sorted(fields)} of "
                    f"{partition_id!r}"
                )
            return TensorDict({f: _densify(raw.get(f)) for f in fields}, batch_size=[n])

    def list_sample_ids(self, partition_id: str) -> list[str]:
        """Sorted live ids of a partition; ``[]`` for an unknown or empty one."""
        self._check_open()
        with self._lock:
            self._used = True
            _check_partition_id(partition_id)
            return sorted(
                self._ctl(lambda: self._a_live_keys(partition_id), "list_sample_ids", partition_id)
            )

    def clear_samples(self, sample_ids: Sequence[str] | None, partition_id: str) -> None:
        """Drop rows, or (``None``) the whole partition including its registry record.

        Raises:
            KeyError: Unknown partition, or unknown ids (listed; nothing cleared).
            ValueError: Duplicate ids.
        """
        self._check_open()
        with self._lock:
            self._used = True
            _check_partition_id(partition_id)
            entries = self._registry_entries("clear_samples", partition_id)
            if partition_id not in _parse_registry(entries):
                raise KeyError(
                    f"unknown data-plane partition {partition_id!r} (not registered, or already "
                    "dropped with clear_samples(None, ...))"
                )
            client = self._client
            if sample_ids is None:
                stale = _stale_registry_keys(entries, partition_id)

                async def _drop() -> None:
                    if partition_id in await client.async_get_partition_list():
                        await client.async_clear_partition(partition_id)
                    await self._a_delete_registry(stale)

                self._data(_drop, "clear_samples", partition_id)
                return
            ids = _check_names(sample_ids, "sample_ids")
            if dups := _duplicates(ids):
                raise ValueError(f"duplicate sample ids in one clear: {_listed(dups)}")
            if not ids:
                return
            meta = self._ctl(
                lambda: client.async_kv_retrieve_meta(keys=ids, partition_id=partition_id, create=False),
                "clear_samples",
                partition_id,
            )
            if meta.size != len(ids):
                raise self._missing_ids_error(partition_id, ids, "clear_samples")
            self._data(lambda: client.async_clear_samples(meta), "clear_samples", partition_id)

    # --- checkpoints ------------------------------------------------------------------------

    def _require_checkpoint_owner(self, op: str) -> None:
        if not self._bootstrap:
            raise RuntimeError(
                f"{op} is only available on the bootstrapping TransferQueue client (the driver); "
                "this client attached with bootstrap=False"
            )

    def save_checkpoint(
        self, checkpoint_dir: str | PathLike, *, metadata: Mapping | None = None
    ) -> None:
        """Atomically save the whole TransferQueue state plus user ``metadata`` (contract §7).

        Raises:
            RuntimeError: Closed, or not the bootstrapping client.
            TypeError | ValueError: ``metadata`` is not JSON-serialisable (nothing written).
        """
        self._check_open()
        self._require_checkpoint_owner("save_checkpoint")
        user_meta = validate_json_metadata(metadata)
        client = self._client

        def _write(tmp_dir: Path) -> None:
            tq_dir = tmp_dir / _CHECKPOINT_SUBDIR
            tq_dir.mkdir()

            async def _save() -> None:
                await client.async_save_controller_checkpoint(str(tq_dir / _TQ_CONTROLLER_FILE))
                await client.async_save_storage_checkpoint(str(tq_dir))

            self._data(_save, "save_checkpoint", "")
            # Same layout as the library's own save_checkpoint, so either loader reads it.
            with open(tq_dir / _TQ_METADATA_FILE, "w", encoding="utf-8") as fh:
                json.dump({"storage_saved": True, "user_metadata": {}}, fh)
            write_manifest(
                tmp_dir,
                {
                    "format": CHECKPOINT_FORMAT,
                    "format_version": CHECKPOINT_FORMAT_VERSION,
                    "backend": self._cfg.backend,
                    "metadata": user_meta,
                },
            )

        with self._lock:
            write_checkpoint_atomically(checkpoint_dir, _write)

    def load_checkpoint(self, checkpoint_dir: str | PathLike) -> dict:
        """Restore a checkpoint into this clean bootstrapping client; return the user metadata.

        Raises:
            RuntimeError: Closed, not the bootstrapping client, or not a clean data-plane client
                (a data operation or a load already ran, or the cluster registry is not empty).
            FileNotFoundError: Missing directory, manifest or library files.
            ValueError: Unknown format/version or corrupt content (naming the file).
        """
        self._check_open()
        self._require_checkpoint_owner("load_checkpoint")
        with self._lock:
            if self._used:
                raise RuntimeError(
                    "load_checkpoint needs a clean data-plane client: a data operation or a load "
                    "already ran on this client"
                )
            self._used = True
            entries = self._registry_entries("load_checkpoint", "")
            if _parse_registry(entries):
                raise RuntimeError(
                    "load_checkpoint needs a clean data-plane client: the cluster-wide registry "
                    f"already holds partitions {sorted(_parse_registry(entries))}"
                )
            manifest = read_manifest(
                checkpoint_dir,
                expected_format=CHECKPOINT_FORMAT,
                supported_versions=(CHECKPOINT_FORMAT_VERSION,),
            )
            root = Path(checkpoint_dir).resolve()
            manifest_path = root / "manifest.json"
            if manifest.get("backend") != self._cfg.backend:
                raise ValueError(
                    f"checkpoint manifest {str(manifest_path)!r} is for backend "
                    f"{manifest.get('backend')!r}, this client runs {self._cfg.backend!r}"
                )
            user_meta = manifest.get("metadata")
            if not isinstance(user_meta, dict):
                raise ValueError(
                    f"checkpoint manifest {str(manifest_path)!r} is corrupt: 'metadata' must be "
                    f"a JSON object, got {type(user_meta).__name__}"
                )
            tq_dir = root / _CHECKPOINT_SUBDIR
            controller_file = tq_dir / _TQ_CONTROLLER_FILE
            for required in (tq_dir, controller_file):
                if not required.exists():
                    raise FileNotFoundError(f"TransferQueue checkpoint file {str(required)!r} is missing")
            client = self._client

            async def _load() -> None:
                await client.async_load_storage_checkpoint(str(tq_dir))
                await client.async_load_controller_checkpoint(str(controller_file))

            try:
                self._data(_load, "load_checkpoint", "")
            except (FileNotFoundError, DataPlaneUnavailableError):
                raise
            except (RuntimeError, ValueError) as exc:
                raise ValueError(
                    f"TransferQueue checkpoint under {str(tq_dir)!r} could not be restored: {exc}"
                ) from exc
            return copy.deepcopy(user_meta)

    # --- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close this client (idempotent); the bootstrapping client also tears the system down.

        Backend errors are logged, not raised.  The bootstrapping close returns once the named
        controller no longer resolves (bounded by ``timeouts.controller_s``).
        """
        global _OPEN_CLIENT
        with _OPEN_LOCK:
            if self._closed:
                return
            self._closed = True
            with self._lock:
                if self._loop is not None:
                    self._loop.stop()
                    self._loop = None
                try:
                    self._reset_library(_tq(), kill=self._bootstrap)
                finally:
                    self._client = None
                    if _OPEN_CLIENT is self:
                        _OPEN_CLIENT = None
            if self._bootstrap:
                self._wait_controller_gone()

    def _wait_controller_gone(self) -> None:
        deadline = time.monotonic() + self._controller_s
        try:
            while tq_controller_exists():
                if time.monotonic() > deadline:
                    _LOG.warning(
                        "TransferQueue controller %r still resolvable %.1fs after close",
                        CONTROLLER_NAME,
                        self._controller_s,
                    )
                    return
                time.sleep(0.05)
        except Exception as exc:  # noqa: BLE001 - e.g. Ray already shut down; close never raises
            _LOG.warning("could not confirm the TransferQueue controller is gone: %s", exc)
