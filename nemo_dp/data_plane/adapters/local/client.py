"""The Local adapter's client: locking, blocking claims, puts and reads over a partition book.

Partitions, claims, consumption and tags are the shared partition book (``adapters._book``);
this module adds the lock, the one-put rule and the stored columns (``store``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from os import PathLike
from typing import Any

from tensordict import TensorDict

from nemo_dp.data_plane.adapters._base import BaseDataPlaneClient
from nemo_dp.data_plane.adapters._book import PartitionBook
from nemo_dp.data_plane.adapters._validation import (
    check_meta,
    claim_timeout,
    get_data_fields,
    lengths_from_tags,
    put_receipt,
)
from nemo_dp.data_plane.adapters.local.checkpoint import read_checkpoint, snapshot
from nemo_dp.data_plane.adapters.local.store import DenseColumn, Partition
from nemo_dp.data_plane.adapters.local.validation import (
    PendingPut,
    build_read,
    is_int,
    is_integer_dtype,
    plan_get,
    validate_put,
)
from nemo_dp.data_plane.interfaces import (
    KVBatchMeta,
    LocalDataPlaneConfig,
    PartitionLimitError,
)
from nemo_dp.data_plane.schema import INPUT_LENGTHS, LOCAL_PARTITION_GENERATION
from nemo_dp.data_plane.typed_checkpoint import write_checkpoint
from nemo_dp.utils.checkpoint_io import validate_json_metadata

__all__ = ["LocalDataPlaneClient", "build_local_client"]


# --- the client ---


class LocalDataPlaneClient(BaseDataPlaneClient):
    """In-process data plane holding at most ``cfg.max_partitions`` complete batches.

    Thread-safe: every state change happens under one lock; blocking claims wait on a
    condition variable notified by puts, clears and ``close``.  Reads return fresh tensors, never
    views of the store (a whole column or a contiguous run of rows is one ``clone`` of a slice,
    any other selection one ``index_select``); a non-tensor column comes back as one
    ``NonTensorData`` holding a deep copy of the selected rows (read it with
    ``materialize_local``).  A partition emptied by an explicit ``clear_samples(ids, pid)`` is
    dropped as by ``clear_samples(None, pid)``: it could never take another put.

    Raises:
        TypeError: ``cfg`` is not a ``LocalDataPlaneConfig``.
    """

    BACKEND = "Local"

    def __init__(self, cfg: LocalDataPlaneConfig) -> None:
        if not isinstance(cfg, LocalDataPlaneConfig):
            raise TypeError(
                f"LocalDataPlaneClient needs a LocalDataPlaneConfig, got {type(cfg).__name__}"
            )
        self._cfg = cfg
        self._max_partitions = cfg.max_partitions
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._book: PartitionBook[Partition] = PartitionBook()
        self._generation = 0  # generation of the most recent registration
        self._init_lifetime(True, closed=False)

    # --- internal helpers (call with the lock held) -------------------------------------------
    def _meta_extra(self, part: Partition) -> dict[str, Any]:
        return {LOCAL_PARTITION_GENERATION: part.generation}

    # --- task-mediated half -------------------------------------------------------------------
    def _register(self, partition_id: Any, fields: Any, n: Any, tasks: Any, group_size: Any, enums: Any) -> None:
        """Register a partition; ``PartitionLimitError`` once ``max_partitions`` are live."""
        with self._operation():
            reg = self._book.check_new(partition_id, fields, n, tasks, group_size, enums)
            if len(self._book.partitions) >= self._max_partitions:
                raise PartitionLimitError(
                    f"Local data plane partition limit reached ({self._max_partitions} live "
                    f"partitions: {sorted(self._book.partitions)}); cannot register {partition_id!r}. "
                    "Clear an active or prefetched partition first (clear_samples(None, pid)) "
                    "or raise data_plane.max_partitions."
                )
            self._generation += 1
            self._book.add(Partition, reg, generation=self._generation)

    def _claim(
        self, partition_id: Any, task_name: Any, fields: Any, n: Any, blocking: bool, timeout_s: Any
    ) -> KVBatchMeta:
        """Claim under the lock, waiting on the condition that puts, clears and close notify."""
        with self._operation():
            part, required = self._book.check_claim(partition_id, task_name, fields, n, timeout_s)
            deadline = time.monotonic() + float(timeout_s)
            while True:
                if ids := self._book.take(part, task_name, required, n):
                    return self._claim_meta(part, task_name, required, ids)
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
                    raise claim_timeout(partition_id, task_name, n, timeout_s)
                self._changed.wait(remaining)
                self._check_open()
                if self._book.partitions.get(partition_id) is not part:
                    raise KeyError(
                        f"partition {partition_id!r} was dropped while claim_meta was waiting"
                    )

    def _claim_meta(self, part: Partition, task_name: str, required: Sequence[str], ids: list[str]) -> KVBatchMeta:
        tags = part.tags_of(ids)
        lengths = lengths_from_tags(tags)
        if lengths is None:
            col = part.columns.get(INPUT_LENGTHS)
            if (
                isinstance(col, DenseColumn)
                and col.data.dim() == 1
                and is_integer_dtype(col.data.dtype)
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
        with self._operation():
            check_meta(meta)
            part = self._book.live(meta.partition_id)
            got = meta.extra_info.get(LOCAL_PARTITION_GENERATION)
            if not is_int(got) or got != part.generation:
                raise ValueError(
                    f"Stale local metadata for partition {meta.partition_id!r}: generation "
                    f"{got}, expected {part.generation}."
                )
            fields = get_data_fields(meta, select_fields)
            plan = plan_get(part, meta.sample_ids, fields)
        return build_read(plan)

    def _consumed(self, partition_id: Any, task_names: Any) -> bool:
        """Whether the tasks consumed the partition, from the book."""
        with self._operation():
            return self._book.consumed(partition_id, task_names)

    # --- direct-by-key half -------------------------------------------------------------------
    def _put(self, sample_ids: Any, partition_id: Any, fields: Any, tags: Any) -> KVBatchMeta:
        """Write the partition's one complete batch: exactly ``num_samples`` rows, once.

        Raises:
            TypeError: Also a tensor in an ``enums`` field.
            ValueError: Also a second put ("duplicate writes") or a row count other than
                ``num_samples``.
        """
        with self._operation():
            part = self._book.live(partition_id)
            pending = validate_put(part, sample_ids, fields, tags)
            return self._commit_put(part, list(pending.row_of), pending, fields is not None)

    def _commit_put(self, part: Partition, ids: list[str], pending: PendingPut, has_fields: bool) -> KVBatchMeta:
        part.written = True
        part.row_of = pending.row_of
        part.columns = pending.columns
        part.field_kinds = {name: col.kind for name, col in pending.columns.items()}
        if pending.tags is not None:
            part.tags = dict(zip(ids, pending.tags))
        self._changed.notify_all()
        col = pending.columns.get(INPUT_LENGTHS)
        return put_receipt(
            part.partition_id,
            ids,
            list(pending.columns) if has_fields else None,
            col.data if isinstance(col, DenseColumn) else None,
            pending.tags,
            self._meta_extra(part),
        )

    def _get(self, sample_ids: Any, partition_id: Any, select_fields: Any) -> TensorDict:
        """Plan the read under the lock, copy the rows after releasing it."""
        with self._operation():
            part = self._book.live(partition_id)
            plan = plan_get(part, sample_ids, select_fields)
        return build_read(plan)

    def _list_ids(self, partition_id: Any) -> list[str]:
        """The book's sorted live ids."""
        with self._operation():
            return self._book.list_ids(partition_id)

    def _clear(self, sample_ids: Any, partition_id: Any) -> None:
        """Drop rows or the partition.

        Clearing the last live row by explicit ids drops the partition too (its id may be
        registered again and its ``max_partitions`` slot is freed).
        """
        with self._operation():
            if sample_ids is None:
                self._book.drop(partition_id)
                self._changed.notify_all()
                return
            part, ids = self._book.check_clear(partition_id, sample_ids)
            self._book.forget_rows(part, ids)
            if ids and not part.row_of:
                # the last row is gone: the partition can never take another put, so it is
                # dropped exactly as by the None form (its max_partitions slot is freed)
                self._book.drop(partition_id)
            self._changed.notify_all()

    # --- checkpoints --------------------------------------------------------------------------
    def save_checkpoint(self, checkpoint_dir: str | PathLike, *, metadata: Mapping | None = None) -> None:
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
                self._book.partitions.values(), self._generation + 1, user_metadata
            )
        write_checkpoint(checkpoint_dir, manifest, tensors)

    def load_checkpoint(self, checkpoint_dir: str | PathLike) -> dict:
        """Restore a checkpoint into this clean client and return its user metadata.

        Raises:
            RuntimeError: Closed, or a data operation (or load attempt) already ran on this
                client ("clean data-plane client").
            FileNotFoundError: Missing directory (naming a surviving ``.old-*``) or manifest.
            ValueError: Unknown format/version, an older format or a file the format does
                not hold (refused unread, naming the file), corrupt or inconsistent manifest
                or tensor file (naming the file), or more partitions than ``max_partitions``.
        """
        with self._lock:
            self._check_open()
            self._begin_load()
            partitions, next_generation, metadata = read_checkpoint(
                checkpoint_dir, self._max_partitions
            )
            self._book.partitions = partitions
            self._generation = next_generation - 1
            return metadata

    # --- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Drop every partition and mark the client closed; idempotent."""
        with self._lock:
            self._closed = True
            self._book.partitions = {}
            self._changed.notify_all()


def build_local_client(
    cfg: LocalDataPlaneConfig, *, bootstrap: bool = True, checkpointing: bool = False
) -> LocalDataPlaneClient:
    """The backend registry's constructor for the Local backend; ``bootstrap`` and ``checkpointing`` are ignored.

    Every Local client owns its own store and can checkpoint.
    """
    del bootstrap, checkpointing
    return LocalDataPlaneClient(cfg)
