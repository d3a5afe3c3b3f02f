"""Process-local data-plane adapter: a bounded store of complete batches inside one process.

Why it exists: colocated SFT (a data loader living in the same process as the policy worker
that consumes its batches) needs the data-plane interface without Ray or TransferQueue.  This
adapter keeps at most ``max_partitions`` complete batches in memory, each written by exactly one
put, and hands them out by id or through per-task claims.  Its checkpoints are exact and
pickle-free (``local_checkpoint``: a typed JSON manifest plus a weights-only tensor file); its
storage structures live in ``local_store``.

Storage and copies (why the data paths look the way they do):

* A put stores exactly one copy per column: dense tensors as one detached contiguous CPU clone,
  jagged (``torch.jagged``) tensors as a compact ``values``/``offsets`` pair, non-tensor columns
  as a deep-copied Python list.  Stored tensors are never mutated afterwards, so reads can
  gather from them without holding the lock.
* A get returns fresh tensors (never views of the store): a whole stored column in stored order
  or any contiguous run of rows is one ``clone`` of a slice; any other selection is one
  ``index_select`` gather.  Callers may therefore modify what they get without corrupting the
  store.  Non-tensor columns come back as one ``NonTensorData`` per column holding a deep copy
  of the selected rows as a list (read them with ``materialize_local``, re-exported here from
  ``codec`` as in the reference API).
* A partition left without rows by an explicit ``clear_samples(ids, pid)`` is dropped, exactly
  as by ``clear_samples(None, pid)``: it can never take another put, so keeping it would only
  hold a ``max_partitions`` slot.

Helpers: ``is_local_batch_meta`` (does a meta come from this adapter?),
``local_batch_to_tensordict`` (turn a loader batch into the TensorDict a put expects) and
``materialize_local`` (turn a read into trainer columns).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from nemo_dp.data_plane.adapters._validation import duplicates as _duplicates
from nemo_dp.data_plane.adapters.local_checkpoint import (
    LOCAL_CHECKPOINT_FORMAT,
    LOCAL_CHECKPOINT_VERSION,
    TENSORS_FILE,
    read_checkpoint,
    snapshot,
    write_snapshot,
)
from nemo_dp.data_plane.adapters.local_store import (
    OBJECT_KIND,
    Column,
    DenseColumn,
    ObjectColumn,
    Partition,
    Selection,
    store_tensor,
)
from nemo_dp.data_plane.batch_columns import is_local_batch_meta, local_batch_to_tensordict
from nemo_dp.data_plane.codec import materialize_local
from nemo_dp.data_plane.interfaces import (
    DataPlaneClient,
    KVBatchMeta,
    LocalDataPlaneConfig,
    PartitionLimitError,
)
from nemo_dp.data_plane.schema import INPUT_LENGTHS, LOCAL_PARTITION_GENERATION, RESERVED_PREFIX
from nemo_dp.utils.checkpoint_io import validate_json_metadata, write_checkpoint_atomically

__all__ = [
    "LocalDataPlaneClient",
    "build_local_client",
    "is_local_batch_meta",
    "local_batch_to_tensordict",
    "materialize_local",
    "LOCAL_CHECKPOINT_FORMAT",
    "LOCAL_CHECKPOINT_VERSION",
    "TENSORS_FILE",
]

_CLOSED_MESSAGE = "Local data-plane client is closed."
_MAX_LISTED_IDS = 20


# ---------------------------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------------------------


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__} ({value!r})")
    if not value:
        raise ValueError(f"{what} must be a non-empty str")
    return value


def _check_names(values: Any, what: str) -> list[str]:
    """A sequence of names (not a bare str); each a non-empty str."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{what} must be a sequence of str, got {type(values).__name__}")
    out = list(values)
    # fast path in C for the common case (large id lists); the loop below names the culprit
    if set(map(type, out)) <= {str} and "" not in out:
        return out
    return [_check_name(v, f"{what} entry") for v in out]


def _listed(ids: Sequence[str]) -> str:
    ids = sorted(ids)
    shown = ", ".join(repr(i) for i in ids[:_MAX_LISTED_IDS])
    more = len(ids) - _MAX_LISTED_IDS
    return f"[{shown}{f', ... ({more} more)' if more > 0 else ''}]"


def _check_positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{what} must be >= 1, got {value}")
    return value


def _check_tag_value(value: Any, where: str) -> None:
    if value is None or isinstance(value, (str, bool, int, float)):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_tag_value(item, f"{where}[{i}]")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: tag key {key!r} is not a str")
            _check_tag_value(item, f"{where}[{key!r}]")
        return
    raise TypeError(f"{where}: {type(value).__name__} value {value!r} is not JSON-compatible")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_integer_dtype(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def _lengths_from_tags(tags: Sequence[Mapping[str, Any]] | None) -> list[int] | None:
    if not tags or any(INPUT_LENGTHS not in t for t in tags):
        return None
    values = [t[INPUT_LENGTHS] for t in tags]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        return None
    return [int(v) for v in values]


@dataclass
class _PendingPut:
    """A fully validated put, ready to be committed."""

    row_of: dict[str, int]
    columns: dict[str, Column]
    tags: list[dict[str, Any]] | None


def _classify_leaf(name: str, leaf: Any, n: int) -> tuple[str, Any]:
    """Return ``(kind, payload)`` for a put leaf; payload is the tensor or the list of objects."""
    if isinstance(leaf, NonTensorStack):
        values = leaf.tolist()
        if len(values) != n:
            raise ValueError(f"field {name!r}: non-tensor column has {len(values)} rows, expected {n}")
        return OBJECT_KIND, values
    if isinstance(leaf, NonTensorData):
        data = leaf.data
        if isinstance(data, np.ndarray) and data.ndim >= 1:
            values = list(data)
        elif isinstance(data, (list, tuple)):
            values = list(data)
        else:
            raise TypeError(
                f"field {name!r}: a NonTensorData column must hold a list, tuple or 1-D array "
                f"of {n} values, got {type(data).__name__}"
            )
        if len(values) != n:
            raise ValueError(
                f"field {name!r}: NonTensorData column holds {len(values)} values, expected {n}"
            )
        return OBJECT_KIND, values
    if isinstance(leaf, TensorDictBase):
        raise TypeError(f"field {name!r}: nested TensorDict leaves are not supported; flatten them")
    if isinstance(leaf, torch.Tensor):
        return str(leaf.dtype), leaf
    raise TypeError(f"field {name!r}: unsupported leaf type {type(leaf).__name__}")


# ---------------------------------------------------------------------------------------------
# the client
# ---------------------------------------------------------------------------------------------


class LocalDataPlaneClient(DataPlaneClient):
    """In-process data plane holding at most ``max_partitions`` complete batches (contract §5).

    Thread-safe: every state change happens under one lock; blocking claims wait on a
    condition variable notified by puts, clears and ``close``.

    Args:
        cfg: The Local data-plane config (``max_partitions`` bounds live partitions).

    Raises:
        TypeError: ``cfg`` is not a ``LocalDataPlaneConfig``.
    """

    def __init__(self, cfg: LocalDataPlaneConfig) -> None:
        if not isinstance(cfg, LocalDataPlaneConfig):
            raise TypeError(
                f"LocalDataPlaneClient needs a LocalDataPlaneConfig, got {type(cfg).__name__}"
            )
        self._cfg = cfg
        self._max_partitions = cfg.max_partitions
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._partitions: dict[str, Partition] = {}
        self._generation = 0  # generation of the most recent registration
        self._closed = False
        self._used = False

    # --- internal checks (call with the lock held) --------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(_CLOSED_MESSAGE)

    def _begin_data_op(self) -> None:
        self._check_open()
        self._used = True

    def _live(self, partition_id: Any) -> Partition:
        _check_name(partition_id, "partition_id")
        part = self._partitions.get(partition_id)
        if part is None:
            raise KeyError(f"unknown partition {partition_id!r} (not registered or already dropped)")
        return part

    @staticmethod
    def _check_task(part: Partition, task_name: Any) -> str:
        _check_name(task_name, "task_name")
        if task_name not in part.claimed:
            raise KeyError(
                f"unknown task {task_name!r} for partition {part.partition_id!r}; "
                f"registered tasks: {list(part.consumer_tasks)}"
            )
        return task_name

    def _meta_extra(self, part: Partition) -> dict[str, Any]:
        return {LOCAL_PARTITION_GENERATION: part.generation}

    # --- task-mediated half -------------------------------------------------------------------
    def register_partition(
        self,
        partition_id: str,
        fields: Sequence[str],
        num_samples: int,
        consumer_tasks: Sequence[str],
        grpo_group_size: int | None = None,
        enums: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """Declare a partition (schema, exactly ``num_samples`` rows, consumer tasks).

        Raises:
            RuntimeError: Closed.
            PartitionLimitError: ``max_partitions`` partitions are live (a ``RuntimeError``).
            TypeError: A name, ``num_samples`` or ``grpo_group_size`` of the wrong type.
            ValueError: Empty/reserved id, duplicate fields/tasks ("must be unique"),
                ``num_samples <= 0``, bad group size, bad ``enums``, or the id is live
                ("already registered").
        """
        with self._lock:
            self._begin_data_op()
            _check_name(partition_id, "partition_id")
            if partition_id.startswith(RESERVED_PREFIX):
                raise ValueError(
                    f"partition_id {partition_id!r} uses the reserved prefix {RESERVED_PREFIX!r}"
                )
            field_names = _check_names(fields, "fields")
            task_names = _check_names(consumer_tasks, "consumer_tasks")
            _check_positive_int(num_samples, "num_samples")
            if dup := _duplicates(field_names):
                raise ValueError(f"fields must be unique; duplicated: {dup}")
            if dup := _duplicates(task_names):
                raise ValueError(f"consumer_tasks must be unique; duplicated: {dup}")
            if grpo_group_size is not None:
                _check_positive_int(grpo_group_size, "grpo_group_size")
                if num_samples % grpo_group_size != 0:
                    raise ValueError(
                        f"grpo_group_size {grpo_group_size} does not divide num_samples {num_samples}"
                    )
            vocab = self._check_enums(enums, field_names)
            if partition_id in self._partitions:
                raise ValueError(f"partition {partition_id!r} is already registered")
            if len(self._partitions) >= self._max_partitions:
                raise PartitionLimitError(
                    f"Local data plane partition limit reached ({self._max_partitions} live "
                    f"partitions: {sorted(self._partitions)}); cannot register {partition_id!r}. "
                    "Clear an active or prefetched partition first (clear_samples(None, pid)) "
                    "or raise data_plane.max_partitions."
                )
            self._generation += 1
            self._partitions[partition_id] = Partition(
                partition_id=partition_id,
                fields=tuple(field_names),
                num_samples=num_samples,
                consumer_tasks=tuple(task_names),
                grpo_group_size=grpo_group_size,
                enums=vocab,
                generation=self._generation,
                claimed={t: set() for t in task_names},
            )

    @staticmethod
    def _check_enums(
        enums: Mapping[str, Sequence[str]] | None, field_names: Sequence[str]
    ) -> dict[str, tuple[str, ...]]:
        if enums is None:
            return {}
        if not isinstance(enums, Mapping):
            raise TypeError(
                f"enums must be a mapping field -> vocabulary, got {type(enums).__name__}"
            )
        out: dict[str, tuple[str, ...]] = {}
        for name, words in enums.items():
            _check_name(name, "enums key")
            if name not in field_names:
                raise ValueError(f"enums key {name!r} is not a declared field ({list(field_names)})")
            if isinstance(words, (str, bytes)) or not isinstance(words, Sequence):
                raise TypeError(
                    f"enums[{name!r}] must be a sequence of str, got {type(words).__name__}"
                )
            for w in words:
                if not isinstance(w, str):
                    raise TypeError(f"enums[{name!r}] entry {w!r} is not a str")
            if dup := _duplicates(list(words)):
                raise ValueError(f"enums[{name!r}] vocabulary has duplicates: {dup}")
            out[name] = tuple(words)
        return out

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
        """Claim ``batch_size`` ready rows for ``task_name``, oldest (stored order) first.

        ``dp_rank`` is reserved and ignored.

        Raises:
            RuntimeError: Closed (also while waiting).
            KeyError: Unknown partition (also if dropped while waiting) or task.
            ValueError: Empty/undeclared ``required_fields``, ``batch_size < 1``,
                ``timeout_s <= 0``.
            TimeoutError: ``blocking`` and fewer than ``batch_size`` rows ready in time.
        """
        with self._lock:
            self._begin_data_op()
            part = self._live(partition_id)
            self._check_task(part, task_name)
            required = _check_names(required_fields, "required_fields")
            if not required:
                raise ValueError("claim_meta: required_fields must not be empty")
            if undeclared := [f for f in required if f not in part.fields]:
                raise ValueError(
                    f"claim_meta: required_fields {undeclared} are not declared in partition "
                    f"{partition_id!r}"
                )
            _check_positive_int(batch_size, "batch_size")
            if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
                raise TypeError(f"timeout_s must be a number, got {type(timeout_s).__name__}")
            if not timeout_s > 0:
                raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
            deadline = time.monotonic() + float(timeout_s)
            while True:
                ready = self._ready_ids(part, task_name, required)
                if len(ready) >= batch_size:
                    return self._claim(part, task_name, required, ready[:batch_size])
                if not blocking:
                    return KVBatchMeta(
                        partition_id,
                        task_name,
                        [],
                        fields=list(required),
                        extra_info=self._meta_extra(part),
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"claim_meta: partition {partition_id!r}, task {task_name!r}: only "
                        f"{len(ready)} of {batch_size} rows ready after timeout_s={timeout_s}"
                    )
                self._changed.wait(remaining)
                self._check_open()
                if self._partitions.get(partition_id) is not part:
                    raise KeyError(
                        f"partition {partition_id!r} was dropped while claim_meta was waiting"
                    )

    @staticmethod
    def _ready_ids(part: Partition, task_name: str, required: Sequence[str]) -> list[str]:
        if any(f not in part.columns for f in required):
            return []
        claimed = part.claimed[task_name]
        return [sid for sid in part.row_of if sid not in claimed]

    def _claim(
        self, part: Partition, task_name: str, required: Sequence[str], ids: list[str]
    ) -> KVBatchMeta:
        part.claimed[task_name].update(ids)
        tags: list[dict[str, Any]] | None = None
        if any(sid in part.tags for sid in ids):
            tags = [copy.deepcopy(part.tags.get(sid, {})) for sid in ids]
        lengths = _lengths_from_tags(tags)
        if lengths is None:
            col = part.columns.get(INPUT_LENGTHS)
            if (
                isinstance(col, DenseColumn)
                and col.data.dim() == 1
                and _is_integer_dtype(col.data.dtype)
            ):
                stored = col.data.tolist()
                lengths = [int(stored[part.row_of[sid]]) for sid in ids]
        return KVBatchMeta(
            part.partition_id,
            task_name,
            list(ids),
            fields=list(required),
            sequence_lengths=lengths,
            extra_info=self._meta_extra(part),
            tags=tags,
        )

    def get_data(self, meta: KVBatchMeta, select_fields: Sequence[str] | None = None) -> TensorDict:
        """Fetch ``meta``'s rows after checking its generation against the live partition.

        Raises:
            RuntimeError: Closed.
            TypeError: ``meta`` is not a ``KVBatchMeta``.
            KeyError: Unknown partition, unknown ids or unproduced fields.
            ValueError: Stale generation ("Stale local metadata"), no resolvable fields, or
                the ``get_samples`` argument errors.
        """
        with self._lock:
            self._begin_data_op()
            if not isinstance(meta, KVBatchMeta):
                raise TypeError(f"get_data expects a KVBatchMeta, got {type(meta).__name__}")
            part = self._live(meta.partition_id)
            got = meta.extra_info.get(LOCAL_PARTITION_GENERATION)
            if not _is_int(got) or got != part.generation:
                raise ValueError(
                    f"Stale local metadata for partition {meta.partition_id!r}: generation "
                    f"{got}, expected {part.generation}."
                )
            if select_fields:
                fields = select_fields
            elif meta.fields:
                fields = meta.fields
            else:
                raise ValueError(
                    "get_data: neither select_fields nor meta.fields names a field; "
                    "fetching all fields silently is forbidden"
                )
            plan = self._plan_get(part, meta.sample_ids, fields)
        return self._build(plan)

    def check_consumption_status(self, partition_id: str, task_names: Sequence[str]) -> bool:
        """True iff every listed task claimed every row currently in the partition.

        Raises:
            RuntimeError: Closed.
            KeyError: Unknown partition or task.
            ValueError: Empty ``task_names``.
        """
        with self._lock:
            self._begin_data_op()
            part = self._live(partition_id)
            tasks = _check_names(task_names, "task_names")
            if not tasks:
                raise ValueError("check_consumption_status: task_names must not be empty")
            for t in tasks:
                self._check_task(part, t)
            if not part.row_of:
                return False
            return all(all(sid in part.claimed[t] for sid in part.row_of) for t in tasks)

    # --- direct-by-key half -------------------------------------------------------------------
    def put_samples(
        self,
        sample_ids: Sequence[str],
        partition_id: str,
        fields: TensorDict | None = None,
        tags: Sequence[dict] | None = None,
    ) -> KVBatchMeta:
        """Write the partition's one complete batch (exactly ``num_samples`` rows).

        Raises:
            RuntimeError: Closed.
            KeyError: Unknown partition.
            TypeError: Bad id types, tags not JSON-compatible, dtype/kind change, nested
                TensorDict leaf, a tensor in an ``enums`` field.
            ValueError: Neither fields nor tags, duplicate ids, batch/tags length mismatch,
                undeclared fields, a value outside a field's ``enums``, a second put
                ("duplicate writes"), or a row count other than ``num_samples``.
        """
        with self._lock:
            self._begin_data_op()
            part = self._live(partition_id)
            ids = _check_names(sample_ids, "sample_ids")
            pending = self._validate_put(part, ids, fields, tags)
            return self._commit_put(part, ids, pending, fields is not None)

    def _validate_put(
        self,
        part: Partition,
        ids: list[str],
        fields: TensorDict | None,
        tags: Sequence[dict] | None,
    ) -> _PendingPut:
        n = len(ids)
        if fields is None and tags is None:
            raise ValueError("put_samples: give fields, tags or both (got neither)")
        if fields is not None and not isinstance(fields, TensorDictBase):
            raise TypeError(f"put_samples: fields must be a TensorDict, got {type(fields).__name__}")
        if tags is not None and (
            isinstance(tags, (str, bytes, Mapping)) or not isinstance(tags, Sequence)
        ):
            raise TypeError(
                f"put_samples: tags must be a sequence of dicts, got {type(tags).__name__}"
            )
        row_of = dict(zip(ids, range(n)))  # doubles as the duplicate check
        if len(row_of) != n:
            raise ValueError(
                f"put_samples: duplicate sample ids in one put: {_listed(_duplicates(ids))}"
            )
        if fields is not None and (fields.batch_dims != 1 or fields.batch_size[0] != n):
            raise ValueError(
                f"put_samples: fields.batch_size {tuple(fields.batch_size)} does not match "
                f"{n} sample ids"
            )
        if tags is not None:
            if len(tags) != n:
                raise ValueError(f"put_samples: {len(tags)} tags for {n} sample ids")
            for i, tag in enumerate(tags):
                if not isinstance(tag, Mapping):
                    raise TypeError(f"put_samples: tags[{i}] is a {type(tag).__name__}, not a dict")
                _check_tag_value(tag, f"put_samples: tags[{i}]")
        names = list(fields.keys()) if fields is not None else []
        if undeclared := [k for k in names if k not in part.fields]:
            raise ValueError(
                f"put_samples: fields {undeclared} are not declared in partition "
                f"{part.partition_id!r} (declared: {list(part.fields)})"
            )
        leaves: dict[str, tuple[str, Any]] = {}
        for name in names:
            kind, payload = _classify_leaf(name, fields.get(name), n)  # type: ignore[union-attr]
            stored = part.field_kinds.get(name)
            if stored is not None and stored != kind:
                raise TypeError(
                    f"put_samples: field {name!r} is stored as {stored} in partition "
                    f"{part.partition_id!r}, this put has {kind}"
                )
            if name in part.enums:
                if kind != OBJECT_KIND:
                    raise TypeError(
                        f"put_samples: field {name!r} has an enums vocabulary and must be a "
                        f"non-tensor column, got a {kind} tensor"
                    )
                allowed = part.enums[name]
                for value in payload:
                    if not isinstance(value, str) or value not in allowed:
                        raise ValueError(
                            f"put_samples: field {name!r} value {value!r} is not in its enums "
                            f"vocabulary {list(allowed)}"
                        )
            leaves[name] = (kind, payload)
        if part.written:
            raise ValueError(
                f"put_samples: partition {part.partition_id!r} already holds its batch; the "
                "Local data plane accepts exactly one put per partition and rejects duplicate "
                "writes (write-back of new columns needs the TransferQueue adapter)"
            )
        if n != part.num_samples:
            raise ValueError(
                f"put_samples: partition {part.partition_id!r} expects exactly "
                f"{part.num_samples} rows in its one put, got {n}"
            )
        # Everything is valid: now take the one copy per column.
        columns: dict[str, Column] = {}
        for name, (kind, payload) in leaves.items():
            if kind == OBJECT_KIND:
                columns[name] = ObjectColumn(copy.deepcopy(payload))
            else:
                columns[name] = store_tensor(name, payload)
        return _PendingPut(
            row_of, columns, copy.deepcopy([dict(t) for t in tags]) if tags is not None else None
        )

    def _commit_put(
        self, part: Partition, ids: list[str], pending: _PendingPut, has_fields: bool
    ) -> KVBatchMeta:
        part.written = True
        part.row_of = pending.row_of
        part.columns = pending.columns
        part.field_kinds = {name: col.kind for name, col in pending.columns.items()}
        if pending.tags is not None:
            part.tags = dict(zip(ids, pending.tags))
        self._changed.notify_all()
        lengths: list[int] | None = None
        col = pending.columns.get(INPUT_LENGTHS)
        if isinstance(col, DenseColumn) and col.data.dim() == 1 and _is_integer_dtype(col.data.dtype):
            lengths = [int(x) for x in col.data.tolist()]
        if lengths is None:
            lengths = _lengths_from_tags(pending.tags)
        return KVBatchMeta(
            part.partition_id,
            None,
            list(ids),
            fields=list(pending.columns) if has_fields else None,
            sequence_lengths=lengths,
            extra_info=self._meta_extra(part),
            tags=copy.deepcopy(pending.tags),
        )

    def get_samples(
        self, sample_ids: Sequence[str], partition_id: str, select_fields: Sequence[str]
    ) -> TensorDict:
        """Read exactly the requested rows and fields, in the requested order (fresh copies).

        Raises:
            RuntimeError: Closed.
            KeyError: Unknown partition, unknown/cleared ids, unproduced or misspelled fields.
            ValueError: Empty ``select_fields`` or duplicate ids.
        """
        with self._lock:
            self._begin_data_op()
            part = self._live(partition_id)
            plan = self._plan_get(part, sample_ids, select_fields)
        return self._build(plan)

    def _plan_get(
        self, part: Partition, sample_ids: Sequence[str], select_fields: Sequence[str] | None
    ) -> tuple[int, list[tuple[str, Column]], Selection]:
        """Validate a read and capture what to copy (stored columns are immutable)."""
        if select_fields is None:
            raise ValueError("get_samples: select_fields is required; there is no 'fetch everything'")
        names = _check_names(select_fields, "select_fields")
        if not names:
            raise ValueError("get_samples: select_fields must not be empty")
        ids = _check_names(sample_ids, "sample_ids")
        if dup := _duplicates(ids):
            raise ValueError(f"get_samples: duplicate sample ids requested: {_listed(dup)}")
        if dup := _duplicates(names):
            raise ValueError(f"get_samples: duplicate select_fields: {dup}")
        if not ids:
            return 0, [], Selection([])
        row_of = part.row_of
        try:
            positions = [row_of[sid] for sid in ids]
        except KeyError:
            missing = [sid for sid in ids if sid not in row_of]
            raise KeyError(
                f"get_samples: {len(missing)} unknown or cleared sample ids in partition "
                f"{part.partition_id!r}: {_listed(missing)}"
            ) from None
        if unproduced := [f for f in names if f not in part.columns]:
            raise KeyError(
                f"get_samples: fields {unproduced} have not been produced in partition "
                f"{part.partition_id!r} (produced: {sorted(part.columns)})"
            )
        return len(ids), [(f, part.columns[f]) for f in names], Selection.of(positions)

    @staticmethod
    def _build(plan: tuple[int, list[tuple[str, Column]], Selection]) -> TensorDict:
        n, cols, sel = plan
        out: dict[str, Any] = {}
        for name, col in cols:
            if isinstance(col, ObjectColumn):
                out[name] = NonTensorData(col.take(sel), batch_size=(n,))
            else:
                out[name] = col.take(sel)
        return TensorDict(out, batch_size=(n,))

    def list_sample_ids(self, partition_id: str) -> list[str]:
        """Sorted live ids; ``[]`` for an unknown or empty partition. Moves no cursor.

        Raises:
            RuntimeError: Closed.
        """
        with self._lock:
            self._begin_data_op()
            _check_name(partition_id, "partition_id")
            part = self._partitions.get(partition_id)
            return sorted(part.row_of) if part is not None else []

    def clear_samples(self, sample_ids: Sequence[str] | None, partition_id: str) -> None:
        """Drop rows (explicit ids) or the whole partition (``None``).

        Clearing the last live row by explicit ids drops the partition too (its id may be
        registered again and its ``max_partitions`` slot is freed); ``[]`` is a no-op.

        Raises:
            RuntimeError: Closed.
            KeyError: Unknown partition, or an explicit id that is not live (nothing cleared).
            ValueError: Duplicate explicit ids.
        """
        with self._lock:
            self._begin_data_op()
            part = self._live(partition_id)
            if sample_ids is None:
                del self._partitions[partition_id]
                self._changed.notify_all()
                return
            ids = _check_names(sample_ids, "sample_ids")
            if dup := _duplicates(ids):
                raise ValueError(f"clear_samples: duplicate sample ids: {_listed(dup)}")
            if missing := [sid for sid in ids if sid not in part.row_of]:
                raise KeyError(
                    f"clear_samples: {len(missing)} ids are not live in partition "
                    f"{partition_id!r}: {_listed(missing)}"
                )
            for sid in ids:
                del part.row_of[sid]
                part.tags.pop(sid, None)
                for claimed in part.claimed.values():
                    claimed.discard(sid)
            if ids and not part.row_of:
                # the last row is gone: the partition can never take another put, so it is
                # dropped exactly as by the None form (its max_partitions slot is freed)
                del self._partitions[partition_id]
            self._changed.notify_all()

    # --- checkpoints --------------------------------------------------------------------------
    def save_checkpoint(
        self, checkpoint_dir: str | PathLike, *, metadata: Mapping | None = None
    ) -> None:
        """Atomically write every live partition plus ``metadata`` (``local_checkpoint``).

        Every stored value comes back exactly on load (typed encoding, no pickle).

        Raises:
            RuntimeError: Closed.
            TypeError: Non-JSON metadata, or a stored object value or tag the typed encoding
                cannot represent (naming partition, field or tags, and sample id); raised
                before anything is written, so a previous checkpoint stays intact.
            ValueError: Non-finite floats in metadata.
        """
        with self._lock:
            self._check_open()
            user_metadata = validate_json_metadata(metadata)
            manifest, tensors = snapshot(
                self._partitions.values(), self._generation + 1, user_metadata
            )

        def write(tmp: Path) -> None:
            write_snapshot(tmp, manifest, tensors)

        write_checkpoint_atomically(checkpoint_dir, write)

    def load_checkpoint(self, checkpoint_dir: str | PathLike) -> dict:
        """Restore a checkpoint into this clean client and return its user metadata.

        Raises:
            RuntimeError: Closed, or a data operation (or load attempt) already ran on this
                client ("clean data-plane client").
            FileNotFoundError: Missing directory (naming a surviving ``.old-*``) or manifest.
            ValueError: Unknown format/version, corrupt or inconsistent manifest or tensor
                file (naming the file), or more partitions than ``max_partitions``.
        """
        with self._lock:
            self._check_open()
            if self._used:
                raise RuntimeError(
                    "load_checkpoint needs a clean data-plane client: a data operation or a "
                    "previous load already ran on this one; build a new client to load into"
                )
            self._used = True
            partitions, next_generation, metadata = read_checkpoint(
                checkpoint_dir, self._max_partitions
            )
            self._partitions = partitions
            self._generation = next_generation - 1
            return metadata

    # --- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Drop every partition and mark the client closed; idempotent."""
        with self._lock:
            self._closed = True
            self._partitions = {}
            self._changed.notify_all()


def build_local_client(
    cfg: LocalDataPlaneConfig, *, bootstrap: bool = True, checkpointing: bool = False
) -> LocalDataPlaneClient:
    """The backend registry's constructor for the Local backend.

    Args:
        cfg: The validated Local config.
        bootstrap: Ignored: every Local client owns its own store.
        checkpointing: Ignored: every Local client can checkpoint.

    Returns:
        A new ``LocalDataPlaneClient``.
    """
    del bootstrap, checkpointing
    return LocalDataPlaneClient(cfg)
