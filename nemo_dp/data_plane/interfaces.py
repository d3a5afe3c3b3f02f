"""The data-plane contract: ``KVBatchMeta``, the ``DataPlaneClient`` ABC and the config schemas.

Importable without Ray, TransferQueue, torch or tensordict (config-only processes import it).
"""

from __future__ import annotations

import abc
import copy
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from typing import TYPE_CHECKING, Any, Union

from omegaconf import MISSING

from nemo_dp.utils.config_checks import fail

if TYPE_CHECKING:  # pragma: no cover - typing only
    from tensordict import TensorDict

__all__ = [
    "DataPlaneUnavailableError",
    "PartitionLimitError",
    "KVBatchMeta",
    "DataPlaneClient",
    "ObservabilityConfig",
    "SimpleStorageConfig",
    "TimeoutsConfig",
    "DataPlaneConfig",
    "LocalDataPlaneConfig",
    "DisabledDataPlaneConfig",
    "DataPlaneRuntimeConfig",
    "register_data_plane_configs",
]


class DataPlaneUnavailableError(TimeoutError):
    """The backend did not answer within its bound; the message names operation, partition and bound.

    Rows touched by the failed call are undefined: treat the step as failed.
    """


class PartitionLimitError(RuntimeError):
    """``register_partition`` found the store at its bound of live partitions; nothing was registered."""


def _to_python_scalar(value: Any) -> Any:
    """Turn a tensor/ndarray element into a plain Python scalar; leave other values alone."""
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (str, bytes)):
        return item()
    return value


def _check_index(index: int, size: int, what: str) -> int:
    i = int(index)
    if i < 0 or i >= size:
        raise IndexError(f"KVBatchMeta.{what}: index {index} out of range for size {size}")
    return i


@dataclass
class KVBatchMeta:
    """A small picklable handle to rows in the data plane, sent between processes instead of tensors.

    Attributes:
        task_name: Consumer/stage tag; ``None`` on raw put receipts.
        fields: Fields written by the put that minted the meta, or the fields to fetch.
        sequence_lengths: Per-row valid lengths (drive sharding and pad targets).
        extra_info: Batch-level bag; never per-row data.
        tags: Per-row JSON-compatible sidecar dicts.
    """

    partition_id: str
    task_name: str | None
    sample_ids: list[str]
    fields: list[str] | None = None
    sequence_lengths: list[int] | None = None
    extra_info: dict[str, Any] = field(default_factory=dict)
    tags: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        n = len(self.sample_ids)
        if self.tags is not None and len(self.tags) != n:
            raise ValueError(f"KVBatchMeta: tags ({len(self.tags)}) must align 1:1 with sample_ids ({n})")
        if self.sequence_lengths is not None and len(self.sequence_lengths) != n:
            raise ValueError(
                f"KVBatchMeta: sequence_lengths ({len(self.sequence_lengths)}) must align 1:1 with sample_ids ({n})"
            )

    # No __len__/__bool__ on purpose: an empty meta is truthy.
    @property
    def size(self) -> int:
        return len(self.sample_ids)

    def stamp_tags(self, scalars: Mapping[str, Any]) -> None:
        """Write per-row values (name -> ``size`` values) into ``tags`` in place, creating tags when absent.

        Raises:
            ValueError: A value sequence does not have ``size`` entries.
        """
        n = self.size
        checked: list[tuple[str, list[Any]]] = []
        for name, values in scalars.items():
            seq = list(values)
            if len(seq) != n:
                raise ValueError(f"stamp_tags: {name} has {len(seq)} values, expected {n}")
            checked.append((name, [_to_python_scalar(v) for v in seq]))
        if self.tags is None:
            self.tags = [{} for _ in range(n)]
        for name, seq in checked:
            for i, v in enumerate(seq):
                self.tags[i][name] = v

    def _project(self, indices: list[int]) -> KVBatchMeta:
        return KVBatchMeta(
            partition_id=self.partition_id,
            task_name=self.task_name,
            sample_ids=[self.sample_ids[i] for i in indices],
            fields=list(self.fields) if self.fields is not None else None,
            sequence_lengths=(
                [self.sequence_lengths[i] for i in indices]
                if self.sequence_lengths is not None
                else None
            ),
            extra_info=dict(self.extra_info),
            tags=[copy.deepcopy(self.tags[i]) for i in indices] if self.tags is not None else None,
        )

    def subset(self, indices: Sequence[int]) -> KVBatchMeta:
        """Rows at ``indices`` in the given order (duplicates allowed); ``IndexError`` outside ``[0, size)``."""
        idx = [_check_index(i, self.size, "subset") for i in indices]
        return self._project(idx)

    def slice(self, start: int, stop: int) -> KVBatchMeta:
        """Rows ``start:stop``; ``IndexError`` unless ``0 <= start <= stop <= size``."""
        if not (0 <= start <= stop <= self.size):
            raise IndexError(
                f"KVBatchMeta.slice: need 0 <= start <= stop <= size, got start={start}, stop={stop}, size={self.size}"
            )
        return self._project(list(range(start, stop)))

    def concat(self, *others: KVBatchMeta) -> KVBatchMeta:
        """Concatenate rows (``self`` first); ``task_name`` and ``extra_info`` from ``self``.

        Raises:
            ValueError: A partition id differs.
        """
        metas = (self, *others)
        for m in others:
            if m.partition_id != self.partition_id:
                raise ValueError(
                    f"KVBatchMeta.concat: partition_ids must match ({self.partition_id!r} vs {m.partition_id!r})"
                )
        ids = [sid for m in metas for sid in m.sample_ids]
        lengths = (
            [int(x) for m in metas for x in m.sequence_lengths]  # type: ignore[union-attr]
            if all(m.sequence_lengths is not None for m in metas)
            else None
        )
        tags = (
            [copy.deepcopy(t) for m in metas for t in m.tags]  # type: ignore[union-attr]
            if all(m.tags is not None for m in metas)
            else None
        )
        union = list(dict.fromkeys(f for m in metas for f in m.fields or []))
        return KVBatchMeta(
            partition_id=self.partition_id,
            task_name=self.task_name,
            sample_ids=ids,
            fields=union or None,
            sequence_lengths=lengths,
            extra_info=dict(self.extra_info),
            tags=tags,
        )

    def drop(self, indices: Sequence[int]) -> KVBatchMeta | None:
        """Complement of ``subset`` (set semantics); ``None`` if every row is dropped; ``IndexError`` as ``subset``."""
        dropped = {_check_index(i, self.size, "drop") for i in indices}
        keep = [i for i in range(self.size) if i not in dropped]
        if not keep and self.size > 0:
            return None
        return self._project(keep)

    def with_fields(self, field_names: Sequence[str]) -> KVBatchMeta:
        """Copy whose ``fields`` is the order-preserving dedup of current + ``field_names``."""
        out = self._project(list(range(self.size)))
        out.fields = list(dict.fromkeys([*(self.fields or []), *field_names]))
        return out


class DataPlaneClient(abc.ABC):
    """Synchronous per-sample key/value store shared by producers and consumers.

    After ``close()`` every method but ``close`` raises ``RuntimeError`` mentioning "closed" (not
    repeated below).  Calls that raise ``ValueError``, ``KeyError`` or ``TypeError`` change nothing.
    """

    # --- task-mediated half -------------------------------------------------------------------
    @abc.abstractmethod
    def register_partition(
        self, partition_id: str, fields: Sequence[str], num_samples: int, consumer_tasks: Sequence[str],
        grpo_group_size: int | None = None, enums: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """Declare a partition (schema, ``num_samples`` rows, consumer tasks) for every process.

        Raises:
            PartitionLimitError: The backend bounds live partitions and is full.
            TypeError: A name, ``num_samples`` or ``grpo_group_size`` of the wrong type.
            ValueError: Empty/reserved id, duplicate fields/tasks ("must be unique"), ``num_samples <= 0``, a group size
                that does not divide it, bad ``enums``, or the id is live ("already registered").
        """

    @abc.abstractmethod
    def claim_meta(
        self, partition_id: str, task_name: str, required_fields: Sequence[str], batch_size: int,
        dp_rank: int | None = None, blocking: bool = True, timeout_s: float = 60.0,
    ) -> KVBatchMeta:
        """Claim ``batch_size`` ready rows for ``task_name``, oldest first, never twice; ``dp_rank`` is ignored.

        Raises:
            RuntimeError: Closed (also while waiting).
            KeyError: Unknown partition (also if dropped while waiting) or task.
            ValueError: Empty/undeclared ``required_fields``, ``batch_size < 1``, ``timeout_s <= 0``.
            TimeoutError: ``blocking`` and fewer than ``batch_size`` rows ready in time.
        """

    @abc.abstractmethod
    def get_data(self, meta: KVBatchMeta, select_fields: Sequence[str] | None = None) -> TensorDict:
        """Fetch ``meta``'s rows (fields from ``select_fields``, else ``meta.fields``).

        Raises:
            TypeError: ``meta`` is not a ``KVBatchMeta``.
            KeyError: Unknown partition; otherwise as ``get_samples``.
            ValueError: No field can be resolved (``select_fields``/``fields``).
        """

    @abc.abstractmethod
    def check_consumption_status(self, partition_id: str, task_names: Sequence[str]) -> bool:
        """True iff every listed task claimed every row currently in the partition.

        Raises:
            KeyError: Unknown partition or task.
            ValueError: Empty ``task_names``.
        """

    # --- direct-by-key half -------------------------------------------------------------------
    @abc.abstractmethod
    def put_samples(
        self, sample_ids: Sequence[str], partition_id: str, fields: TensorDict | None = None,
        tags: Sequence[dict] | None = None,
    ) -> KVBatchMeta:
        """Write rows, validated completely before anything is written; return the receipt.

        Raises:
            KeyError: Unknown partition.
            TypeError: Bad id types, tags not JSON-compatible, dtype/kind change of a stored field, a nested
                ``TensorDict`` leaf, or a leaf the backend cannot store.
            ValueError: Neither fields nor tags, duplicate ids, batch/tags length mismatch, undeclared fields, or a
                value outside a field's ``enums``.
        """

    @abc.abstractmethod
    def get_samples(self, sample_ids: Sequence[str], partition_id: str, select_fields: Sequence[str]) -> TensorDict:
        """Read exactly the requested rows and fields, in the requested order (fresh copies).

        Raises:
            KeyError: Unknown partition, unknown/cleared ids (listed), unproduced fields.
            ValueError: Empty ``select_fields`` or duplicate ids.
            DataPlaneUnavailableError: The backend is unreachable (a ``TimeoutError``).
        """

    @abc.abstractmethod
    def list_sample_ids(self, partition_id: str) -> list[str]:
        """Sorted live ids of a partition; ``[]`` for an unknown or empty one. Moves no cursor."""

    @abc.abstractmethod
    def clear_samples(self, sample_ids: Sequence[str] | None, partition_id: str) -> None:
        """Drop rows (explicit ids; ``[]`` is a no-op) or (``None``) the whole partition and its registration.

        Raises:
            KeyError: Unknown partition, or an explicit id that is not live (listed; nothing cleared).
            ValueError: Duplicate explicit ids.
        """

    # --- lifetime -----------------------------------------------------------------------------
    @abc.abstractmethod
    def save_checkpoint(self, checkpoint_dir: str | PathLike, *, metadata: Mapping | None = None) -> None:
        """Atomically persist the complete data-plane state plus user ``metadata``."""

    @abc.abstractmethod
    def load_checkpoint(self, checkpoint_dir: str | PathLike) -> dict:
        """Restore a checkpoint into a clean client; return the user metadata."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release resources; idempotent."""


def _physical_cores() -> int:
    try:
        import psutil

        return int(psutil.cpu_count(logical=False) or os.cpu_count() or 1)
    except Exception:  # pragma: no cover - psutil is a hard dependency; stay defensive
        return os.cpu_count() or 1


def coerce_nodes(cfg: Any, **schemas: type) -> None:
    """Turn nested config nodes that arrive as plain mappings (configs built by hand) into ``schemas``."""
    for name, schema in schemas.items():
        value = getattr(cfg, name)
        if isinstance(value, Mapping):
            setattr(cfg, name, schema(**value))


@dataclass
class ObservabilityConfig:
    """``data_plane.observability``: wrap the client in ``MetricsDataPlaneClient``."""

    enabled: bool = False
    log_events: bool = False


@dataclass
class SimpleStorageConfig:
    """``data_plane.simple``: TransferQueue SimpleStorage sizing."""

    storage_capacity: int = 1_000_000
    num_storage_units: int = MISSING  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.storage_capacity < 1:
            fail("data_plane.simple.storage_capacity", f"must be >= 1, got {self.storage_capacity}")
        if isinstance(self.num_storage_units, int) and self.num_storage_units < 1:
            fail("data_plane.simple.num_storage_units", f"must be >= 1, got {self.num_storage_units}")


@dataclass
class TimeoutsConfig:
    """``data_plane.timeouts``: bounds that turn backend hangs into errors."""

    controller_s: float = 15.0
    storage_s: float = 10.0
    storage_max_attempts: int = 1
    storage_probe_s: float = 5.0
    startup_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("controller_s", "storage_s", "storage_probe_s", "startup_s"):
            value = getattr(self, name)
            if not value > 0:
                fail(f"data_plane.timeouts.{name}", f"must be > 0, got {value}")
        if self.storage_max_attempts < 1:
            fail("data_plane.timeouts.storage_max_attempts", f"must be >= 1, got {self.storage_max_attempts}")


@dataclass
class DataPlaneConfig:
    """``data_plane`` for the TransferQueue backend (``impl: transfer_queue``)."""

    enabled: bool = True
    impl: str = "transfer_queue"
    backend: str = "simple"
    claim_meta_poll_interval_s: float = 0.5
    num_threads: int = 2
    simple: SimpleStorageConfig = field(default_factory=SimpleStorageConfig)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)

    def __post_init__(self) -> None:
        if self.impl != "transfer_queue":
            fail("data_plane.impl", f"must be 'transfer_queue' for this schema, got {self.impl!r}")
        if self.backend != "simple":
            fail("data_plane.backend", f"unsupported backend {self.backend!r}; legal values: ['simple']")
        if not self.claim_meta_poll_interval_s > 0:
            fail("data_plane.claim_meta_poll_interval_s", f"must be > 0, got {self.claim_meta_poll_interval_s}")
        cores = _physical_cores()
        if not 1 <= self.num_threads <= max(cores, 1):
            fail("data_plane.num_threads", f"must be in [1, {cores}] (physical cores), got {self.num_threads}")
        coerce_nodes(self, simple=SimpleStorageConfig, timeouts=TimeoutsConfig, observability=ObservabilityConfig)


@dataclass
class LocalDataPlaneConfig:
    """``data_plane`` for the process-local store (``impl: local``)."""

    enabled: bool = True
    impl: str = "local"
    max_partitions: int = 2
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)

    def __post_init__(self) -> None:
        if self.impl != "local":
            fail("data_plane.impl", f"must be 'local' for this schema, got {self.impl!r}")
        if self.max_partitions < 1:
            fail("data_plane.max_partitions", f"must be >= 1, got {self.max_partitions}")
        coerce_nodes(self, observability=ObservabilityConfig)


@dataclass
class DisabledDataPlaneConfig:
    """``data_plane`` when disabled: the legacy trainers, no store at all."""

    enabled: bool = False

    def __post_init__(self) -> None:
        if self.enabled:
            fail("data_plane.enabled", "must be false for data_plane=disabled")


DataPlaneRuntimeConfig = Union[DataPlaneConfig, LocalDataPlaneConfig]


def register_data_plane_configs() -> None:
    """Store one ``data_plane_<option>_schema`` per backend in Hydra's ConfigStore at root level.

    Each YAML group file lists ``- /data_plane_<option>_schema@_here_`` first in its defaults; root
    level (not group ``data_plane``) keeps the schemas out of ``--help`` and tab completion.
    """
    from hydra.core.config_store import ConfigStore

    from nemo_dp.data_plane.registry import BACKENDS

    cs = ConfigStore.instance()
    for spec in BACKENDS.values():
        cs.store(name=f"data_plane_{spec.option}_schema", node=spec.schema)
