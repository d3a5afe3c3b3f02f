"""The Local adapter's client: the lock, blocking claims, the one-put rule and stored columns over a partition book."""

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
    int_lengths,
    lengths_from_tags,
    put_receipt,
)
from nemo_dp.data_plane.adapters.local.checkpoint import read_checkpoint, snapshot
from nemo_dp.data_plane.adapters.local.store import DenseColumn, Partition
from nemo_dp.data_plane.adapters.local.validation import build_read, plan_get, validate_put
from nemo_dp.data_plane.interfaces import KVBatchMeta, LocalDataPlaneConfig, PartitionLimitError
from nemo_dp.data_plane.schema import INPUT_LENGTHS, LOCAL_PARTITION_GENERATION
from nemo_dp.data_plane.typed_checkpoint import is_int, write_checkpoint
from nemo_dp.utils.checkpoint_io import validate_json_metadata

__all__ = ["LocalDataPlaneClient", "build_local_client"]


class LocalDataPlaneClient(BaseDataPlaneClient):
    """In-process data plane holding at most ``cfg.max_partitions`` complete batches.

    Thread-safe: every state change happens under one lock; blocking claims wait on a condition
    notified by puts, clears and ``close``.  Reads return fresh tensors, never views of the store; a
    non-tensor column comes back as one ``NonTensorData`` holding a deep copy of the selected rows
    (read it with ``materialize_local``).
    """

    BACKEND = "Local"

    def __init__(self, cfg: LocalDataPlaneConfig) -> None:
        if not isinstance(cfg, LocalDataPlaneConfig):
            raise TypeError(f"LocalDataPlaneClient needs a LocalDataPlaneConfig, got {type(cfg).__name__}")
        self._cfg = cfg
        self._max_partitions = cfg.max_partitions
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._book: PartitionBook[Partition] = PartitionBook()
        self._generation = 0  # generation of the most recent registration
        self._init_lifetime(True, closed=False)

    def _meta_extra(self, part: Partition) -> dict[str, Any]:
        return {LOCAL_PARTITION_GENERATION: part.generation}

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
                    extra = self._meta_extra(part)
                    return KVBatchMeta(partition_id, task_name, [], fields=list(required), extra_info=extra)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise claim_timeout(partition_id, task_name, n, timeout_s)
                self._changed.wait(remaining)
                self._check_open()
                if self._book.partitions.get(partition_id) is not part:
                    raise KeyError(f"partition {partition_id!r} was dropped while claim_meta was waiting")

    def _claim_meta(self, part: Partition, task_name: str, required: Sequence[str], ids: list[str]) -> KVBatchMeta:
        tags = part.tags_of(ids)
        lengths = lengths_from_tags(tags)
        col = part.columns.get(INPUT_LENGTHS)
        if lengths is None and isinstance(col, DenseColumn) and (stored := int_lengths(col.data)) is not None:
            lengths = [stored[part.row_of[sid]] for sid in ids]
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
        """Fetch ``meta``'s rows; ``ValueError`` ("Stale local metadata") when its generation is not the live one."""
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
        with self._operation():
            return self._book.consumed(partition_id, task_names)

    def _put(self, sample_ids: Any, partition_id: Any, fields: Any, tags: Any) -> KVBatchMeta:
        """Write the partition's one complete batch: exactly ``num_samples`` rows, once.

        Raises:
            TypeError: Also a tensor in an ``enums`` field.
            ValueError: Also a second put ("duplicate writes") or a row count other than ``num_samples``.
        """
        with self._operation():
            part = self._book.live(partition_id)
            pending = validate_put(part, sample_ids, fields, tags)
            ids = list(pending.row_of)
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
                list(pending.columns) if fields is not None else None,
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
        with self._operation():
            return self._book.list_ids(partition_id)

    def _clear(self, sample_ids: Any, partition_id: Any) -> None:
        """Drop rows or the partition; clearing the last live row by ids drops the partition too."""
        with self._operation():
            if sample_ids is None:
                self._book.drop(partition_id)
                self._changed.notify_all()
                return
            part, ids = self._book.check_clear(partition_id, sample_ids)
            self._book.forget_rows(part, ids)
            if ids and not part.row_of:
                # it can never take another put: free its max_partitions slot
                self._book.drop(partition_id)
            self._changed.notify_all()

    def save_checkpoint(self, checkpoint_dir: str | PathLike, *, metadata: Mapping | None = None) -> None:
        """Atomically write every live partition plus ``metadata``; every value comes back exactly on load.

        Raises:
            RuntimeError: Closed.
            TypeError: Non-JSON metadata, or a stored value or tag the typed encoding cannot represent
                (raised before anything is written).
            ValueError: Non-finite floats in metadata.
        """
        with self._lock:
            self._check_open()
            user_metadata = validate_json_metadata(metadata)
            manifest, tensors = snapshot(self._book.partitions.values(), self._generation + 1, user_metadata)
        write_checkpoint(checkpoint_dir, manifest, tensors)

    def load_checkpoint(self, checkpoint_dir: str | PathLike) -> dict:
        """Restore a checkpoint into this clean client and return its user metadata.

        Raises:
            RuntimeError: Closed, or not a clean client.
            FileNotFoundError | ValueError: As :func:`~nemo_dp.data_plane.adapters.local.checkpoint.read_checkpoint`.
        """
        with self._lock:
            self._check_open()
            self._begin_load()
            partitions, next_generation, metadata = read_checkpoint(checkpoint_dir, self._max_partitions)
            self._book.partitions = partitions
            self._generation = next_generation - 1
            return metadata

    def close(self) -> None:
        """Drop every partition and mark the client closed; idempotent."""
        with self._lock:
            self._closed = True
            self._book.partitions = {}
            self._changed.notify_all()


def build_local_client(
    cfg: LocalDataPlaneConfig, *, bootstrap: bool = True, checkpointing: bool = False
) -> LocalDataPlaneClient:
    """The backend registry's constructor: every Local client owns its store and can checkpoint."""
    del bootstrap, checkpointing
    return LocalDataPlaneClient(cfg)
