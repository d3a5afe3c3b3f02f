"""Worker side of the colocated SFT loader (``ColocatedLoaderMixin``, composed into the policy
worker), and what both sides share: the batch envelope and the partition ids."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from nemo_dp.data_plane.batch_columns import local_batch_to_tensordict
from nemo_dp.data_plane.interfaces import DataPlaneUnavailableError, KVBatchMeta, PartitionLimitError
from nemo_dp.data_plane.schema import TASK_TRAIN

__all__ = ["SFT_PARTITION_TEMPLATE", "SFTBatchEnvelope", "ColocatedLoaderMixin", "sft_partition_id"]

#: Partition of DP rank ``rank``'s part of batch ``k``.
SFT_PARTITION_TEMPLATE = "sft_dp{rank}_batch{k}"


def _batch_to_tensordict(batch: Mapping[str, Any], n: int) -> Any:
    """A collated batch as the TensorDict a put takes; ``PackedTensor`` columns (VLM images) go in per row."""
    from nemo_dp.data_plane.codec import pack_jagged_fields
    from nemo_dp.utils.packed_tensor import PackedTensor

    packed = {k: v for k, v in batch.items() if isinstance(v, PackedTensor)}
    td = local_batch_to_tensordict({k: v for k, v in batch.items() if k not in packed}, batch_size=n)
    if packed:
        rows = pack_jagged_fields(packed, lengths=None)
        for key in packed:
            td.set(key, rows.get(key))
    return td


def sft_partition_id(rank: int, k: int) -> str:
    """DP rank ``rank``'s partition of batch ``k`` (0-based, trained in step ``k + 1``)."""
    return SFT_PARTITION_TEMPLATE.format(rank=int(rank), k=int(k))


@dataclass
class SFTBatchEnvelope:
    """What a worker returns for one loaded batch (all the driver receives).

    ``meta`` is the put receipt (``task_name="train"``, ``sequence_lengths``, ``pad_to_multiple`` in
    ``extra_info``); ``source_ids`` are dataset indices in row order; ``load_time_s`` is 0 when prefetched.
    """

    meta: KVBatchMeta
    dp_rank: int
    batch_index: int
    source_ids: list[int]
    valid_tokens: int
    num_microbatches: int
    load_time_s: float
    prefetched: bool


@dataclass
class _LoadedBatch:
    envelope: SFTBatchEnvelope
    loader_state_before: dict[str, Any]
    loader_state_after: dict[str, Any]


class ColocatedLoaderMixin:
    """Worker-side colocated SFT loader (driver side: ``nemo_dp.algorithms.sft_loader.ColocatedLoaderGroup``).

    Keeps a lockstep replica of the run's ``EpochLoader`` and puts rank ``r``'s block of batch ``k`` into
    partition ``sft_dp{r}_batch{k}``.  A commit stays provisional until the driver asks for the next
    batch, so a failed step is retried on every rank.  Pure data parallelism only.
    """

    _cl_loader: Any = None

    def setup_colocated_loader(
        self,
        loader: Any,
        *,
        tokenizer: Any,
        max_seq_len: int | None,
        micro_batch_size: int,
        max_live_batches: int,
        pad_to_multiple: int = 1,
    ) -> None:
        """Take a replica of the run's ``EpochLoader`` and start at its current position.

        ``max_live_batches`` bounds the batches held in the store at once (active + prefetched);
        ``pad_to_multiple`` is recorded in each meta's ``extra_info``.  Raises ``ValueError`` for a
        bad setting, ``RuntimeError`` while batches of an earlier setup are live.
        """
        if self._cl_loader is not None and getattr(self, "_cl_ready", None):
            raise self._cl_error(
                RuntimeError,
                f"{len(self._cl_ready)} batches are still live; commit or abort them before setting the loader "
                "up again",
            )
        is_leader = getattr(self, "_is_replica_leader", None)
        if is_leader is not None and not is_leader():
            raise self._cl_error(
                RuntimeError,
                "this worker is not a DP-replica leader; the colocated SFT loader supports pure data parallelism only",
            )
        world = int(self.world_size)
        gbs = int(loader.batch_size)
        if gbs % world != 0:
            raise ValueError(f"colocated loader: global batch size {gbs} is not divisible by dp_size {world}")
        sizes = (
            ("max_live_batches", max_live_batches), ("micro_batch_size", micro_batch_size),
            ("pad_to_multiple", pad_to_multiple),
        )
        for name, value in sizes:
            if int(value) < 1:
                raise ValueError(f"colocated loader: {name} must be >= 1, got {value}")
        # A private replica even in-process: ranks must never advance each other's cursor.
        self._cl_loader = copy.deepcopy(loader)
        self._cl_tokenizer = tokenizer
        self._cl_max_seq_len = None if max_seq_len is None else int(max_seq_len)
        self._cl_rows = gbs // world
        self._cl_mbs = int(micro_batch_size)
        self._cl_max_live = int(max_live_batches)
        self._cl_pad_to_multiple = int(pad_to_multiple)
        self._cl_ready: dict[int, _LoadedBatch] = {}
        self._cl_active: int | None = None
        self._cl_next_step = 0  # batch index the next step trains on
        self._cl_next_produce = 0  # batch index the loader produces next
        self._cl_committed_state: dict[str, Any] = dict(self._cl_loader.state_dict())
        # (k, committed loader state before k) of the last commit, until the driver confirms it
        # by asking for batch k + 1: an abort of step k can then roll this rank's commit back.
        self._cl_uncommit: tuple[int, dict[str, Any]] | None = None
        self._cl_stats = {"loads": 0, "prefetched_hits": 0, "store_full": 0}

    def set_colocated_position(self, next_batch_index: int) -> None:
        """After a resume, set the batch index the next step trains on (``RuntimeError`` while batches are live)."""
        self._cl_require()
        if self._cl_ready:
            raise self._cl_error(RuntimeError, f"cannot reposition while batches {sorted(self._cl_ready)} are live")
        self._cl_next_step = int(next_batch_index)
        self._cl_next_produce = int(next_batch_index)
        self._cl_uncommit = None

    def close_colocated_loader(self) -> None:
        """Forget the loader (no data-plane call; the store is closed by its owner)."""
        self._cl_loader = None
        self._cl_ready = {}
        self._cl_active = None

    def _cl_require(self) -> None:
        if self._cl_loader is None:
            raise RuntimeError(
                f"colocated loader not set up on DP rank {getattr(self, 'rank', '?')}: call "
                "setup_colocated_loader(...) first"
            )

    def _cl_error(self, cls: type[Exception], message: str) -> Exception:
        return cls(f"colocated loader on DP rank {self.rank}: {message}")

    def _cl_client(self) -> Any:
        require = getattr(self, "_require_dp_client", None)
        if require is not None:
            return require()
        client = getattr(self, "dp_client", None)
        if client is None:
            raise self._cl_error(RuntimeError, "no data-plane client")
        return client

    def _cl_produce(self, *, wait: bool = True) -> _LoadedBatch | None:
        """Load the next batch into a fresh partition; a full store raises with ``wait``, else returns ``None``."""
        from nemo_dp.data.datasets import collate_sft

        client = self._cl_client()
        k = self._cl_next_produce
        rank = int(self.rank)
        pid = sft_partition_id(rank, k)
        t0 = time.perf_counter()
        loader = self._cl_loader
        state_before = dict(loader.state_dict())
        examples = loader.next_batch()
        indices = [int(i) for i in loader.last_batch_indices]
        state_after = dict(loader.state_dict())
        lo, hi = rank * self._cl_rows, (rank + 1) * self._cl_rows
        try:
            batch = collate_sft(examples[lo:hi], self._cl_tokenizer, max_seq_len=self._cl_max_seq_len)
            n = int(batch["input_ids"].shape[0])
            td = _batch_to_tensordict(batch, n)
            sample_ids = [f"{pid}_row{i}" for i in range(n)]
            source_ids = indices[lo:hi]
            if not self._cl_register(client, pid, fields=list(td.keys()), num_samples=n, wait=wait):
                loader.load_state_dict(state_before)
                return None
            try:
                receipt = client.put_samples(
                    sample_ids, pid, td, tags=[{"source_id": int(s)} for s in source_ids]
                )
            except BaseException:
                client.clear_samples(None, pid)
                raise
        except BaseException:
            # Nothing of this batch is stored: rewind so the loader produces it again.
            loader.load_state_dict(state_before)
            raise
        extra = dict(receipt.extra_info)
        extra["pad_to_multiple"] = self._cl_pad_to_multiple
        meta = replace(
            receipt,
            task_name=TASK_TRAIN,
            fields=list(td.keys()),
            sequence_lengths=[int(x) for x in batch["input_lengths"].tolist()],
            extra_info=extra,
            tags=[{"source_id": int(s)} for s in source_ids],
        )
        envelope = SFTBatchEnvelope(
            meta=meta,
            dp_rank=rank,
            batch_index=k,
            source_ids=list(source_ids),
            valid_tokens=int(batch["token_mask"].sum()),
            num_microbatches=math.ceil(n / self._cl_mbs),
            load_time_s=time.perf_counter() - t0,
            prefetched=False,
        )
        loaded = _LoadedBatch(envelope, state_before, state_after)
        self._cl_ready[k] = loaded
        self._cl_next_produce = k + 1
        self._cl_stats["loads"] += 1
        return loaded

    def _cl_register(self, client: Any, pid: str, *, fields: list[str], num_samples: int, wait: bool) -> bool:
        """Register ``pid`` if the loader's bound and the store leave a slot; False (only without ``wait``) if not.

        Raises (with ``wait``): RuntimeError (``max_live_batches`` reached), PartitionLimitError (store full).
        """
        if len(self._cl_ready) >= self._cl_max_live:
            self._cl_stats["store_full"] += 1
            if not wait:
                return False
            raise self._cl_error(
                RuntimeError,
                f"cannot load {pid!r}: batches {sorted(self._cl_ready)} are already live (max_live_batches="
                f"{self._cl_max_live}); commit or abort them first",
            )
        try:
            client.register_partition(pid, fields=fields, num_samples=num_samples, consumer_tasks=[TASK_TRAIN])
        except PartitionLimitError:
            self._cl_stats["store_full"] += 1
            if not wait:
                return False
            raise
        return True

    def load_sft_batch(self, batch_index: int, prefetch: bool = True) -> SFTBatchEnvelope:
        """The envelope of the run's next batch ``batch_index`` (loaded now unless prefetched); it becomes active.

        With ``prefetch``, later batches are then loaded while fewer than ``max_live_batches`` are live.

        Raises:
            RuntimeError: Not set up, or another batch is active.
            ValueError: ``batch_index`` is not the next batch.
            PartitionLimitError: The store is full (nothing stored; the loader is rewound).
        """
        self._cl_require()
        k = int(batch_index)
        if self._cl_active is not None:
            raise self._cl_error(
                RuntimeError, f"batch {self._cl_active} is already active; commit or abort it before loading batch {k}"
            )
        if k != self._cl_next_step:
            raise self._cl_error(ValueError, f"asked for batch {k} but the next batch is {self._cl_next_step}")
        self._cl_uncommit = None  # the driver asks for batch k: the commit of k - 1 stands
        envelope = self._cl_envelope(k, wait=True)
        assert envelope is not None  # with wait it returns the envelope or raises
        self._cl_active = k
        if prefetch:
            self.prefetch_sft_batches()
        return envelope

    def _cl_envelope(self, k: int, *, wait: bool) -> SFTBatchEnvelope | None:
        """Batch ``k``'s envelope, prefetched or loaded now (without ``wait``, ``None`` when the store is full)."""
        loaded = self._cl_ready.get(k)
        if loaded is not None:
            self._cl_stats["prefetched_hits"] += 1
            return replace(loaded.envelope, prefetched=True, load_time_s=0.0)
        produced = self._cl_produce(wait=wait)
        return None if produced is None else produced.envelope

    def run_sft_step(
        self, placed_meta: KVBatchMeta, batch_index: int, loss_fn: Any, mbs: int | None = None
    ) -> dict[str, Any]:
        """One whole SFT step on this rank: train batch ``batch_index`` (*k*), commit it, ready *k+1*.

        ``placed_meta`` must be the loaded batch's meta as the driver stamped it.  A failure before
        the optimizer step aborts this rank's step and leaves the batch loaded (the driver then
        aborts every rank).  Readying *k+1* never fails the step.

        Returns ``{"metrics", "consumed" (rows), "next" (envelope of k+1 or None), "load_s", "next_error",
        "next_store_unavailable" (the error was ``DataPlaneUnavailableError``)}``.

        Raises:
            ValueError: ``batch_index`` is not the next batch, or ``placed_meta`` is not its meta.
            RuntimeError: Not set up, the batch is not loaded, or another batch is active.
        """
        self._cl_require()
        k = int(batch_index)
        self._cl_check_placed(k, placed_meta)
        self._cl_uncommit = None  # the driver asks for batch k: the commit of k - 1 stands
        self._cl_active = k
        begun = False
        try:
            self.begin_train_step_presharded(loss_fn, mbs=mbs)  # type: ignore[attr-defined]
            begun = True
            self.train_microbatch_presharded(placed_meta)  # type: ignore[attr-defined]
            metrics = self.finish_train_step_presharded()  # type: ignore[attr-defined]
        except BaseException as exc:
            if begun:
                try:
                    self.abort_train_step_presharded()  # type: ignore[attr-defined]
                except Exception as abort_exc:  # keep the step's own error as the one raised
                    exc.add_note(f"(aborting the train step on DP rank {self.rank} also failed: {abort_exc!r})")
            raise
        consumed = self.commit_sft_batch(k)
        t0 = time.perf_counter()
        nxt: SFTBatchEnvelope | None = None
        error: str | None = None
        unavailable = False
        try:
            nxt = self._cl_envelope(k + 1, wait=False)
            if nxt is None:
                error = "no free store slot for the next batch"
            else:
                self.prefetch_sft_batches()
        except Exception as exc:  # the batch that failed was rewound; its step will reload it
            error = repr(exc)
            unavailable = isinstance(exc, DataPlaneUnavailableError)
        return {
            "metrics": metrics, "consumed": consumed, "next": nxt, "load_s": time.perf_counter() - t0,
            "next_error": error, "next_store_unavailable": unavailable,
        }

    def _cl_check_placed(self, k: int, placed_meta: KVBatchMeta) -> None:
        """Raise unless batch ``k`` is the loaded next batch and ``placed_meta`` is its meta."""
        if k != self._cl_next_step:
            raise self._cl_error(ValueError, f"asked to train batch {k} but the next batch is {self._cl_next_step}")
        if self._cl_active not in (None, k):
            raise self._cl_error(
                RuntimeError, f"batch {self._cl_active} is already active; commit or abort it before training batch {k}"
            )
        loaded = self._cl_ready.get(k)
        if loaded is None:
            raise self._cl_error(RuntimeError, f"batch {k} is not loaded; load it first (load_sft_batch)")
        meta = loaded.envelope.meta
        same = {
            "partition_id": placed_meta.partition_id == meta.partition_id,
            "sample_ids": list(placed_meta.sample_ids) == list(meta.sample_ids),
            "extra_info": all(placed_meta.extra_info.get(key) == value for key, value in meta.extra_info.items()),
        }
        mismatch = [name for name, ok in same.items() if not ok]
        if mismatch:
            raise self._cl_error(
                ValueError,
                f"the placed meta of batch {k} (partition {placed_meta.partition_id!r}) differs from the loaded batch "
                f"{meta.partition_id!r} in {mismatch}; place the envelope this rank returned",
            )

    def prefetch_sft_batches(self) -> int:
        """Load ahead while fewer than ``max_live_batches`` are live, stopping at a full store; return how many."""
        self._cl_require()
        loaded = 0
        while len(self._cl_ready) < self._cl_max_live:
            if self._cl_produce(wait=False) is None:
                break
            loaded += 1
        return loaded

    def commit_sft_batch(self, batch_index: int) -> int:
        """Mark the active batch trained: clear its partition, advance, return rows consumed (else ``RuntimeError``)."""
        self._cl_require()
        k = int(batch_index)
        if self._cl_active != k:
            raise self._cl_error(RuntimeError, f"commit of batch {k} but the active batch is {self._cl_active}")
        loaded = self._cl_ready[k]
        self._cl_client().clear_samples(None, loaded.envelope.meta.partition_id)
        del self._cl_ready[k]
        self._cl_active = None
        self._cl_uncommit = (k, dict(self._cl_committed_state))
        self._cl_next_step = k + 1
        self._cl_committed_state = dict(loaded.loader_state_after)
        return len(loaded.envelope.source_ids)

    def abort_sft_batch(self, batch_index: int | None = None) -> list[str]:
        """Drop the active and every prefetched batch and rewind the loader; return the partitions dropped.

        The loader returns to the committed position, so the next :meth:`load_sft_batch` reloads the
        same batch.  Idempotent.  ``batch_index`` is the batch of the step the driver aborts (this
        rank's commit of it is rolled back first); ``None`` aborts at this rank's own position.

        Raises ``RuntimeError`` (after dropping everything) when ``batch_index`` is neither this
        rank's next batch nor the one it just committed.
        """
        if self._cl_loader is None:
            return []
        mismatch: Exception | None = None
        if batch_index is not None:
            k = int(batch_index)
            undo = self._cl_uncommit
            if undo is not None and undo[0] == k and self._cl_next_step == k + 1:
                self._cl_committed_state = dict(undo[1])
                self._cl_next_step = k
                self._cl_uncommit = None
            elif k != self._cl_next_step:
                mismatch = self._cl_error(
                    RuntimeError, f"abort of the step of batch {k} but this rank's next batch is {self._cl_next_step}"
                )
        dropped = self._cl_drop_all()
        self._cl_active = None
        if mismatch is not None:
            raise mismatch
        return dropped

    def _cl_drop_all(self) -> list[str]:
        client = self._cl_client()
        dropped: list[str] = []
        first_error: BaseException | None = None
        for k in sorted(self._cl_ready):
            pid = self._cl_ready[k].envelope.meta.partition_id
            try:
                client.clear_samples(None, pid)
                dropped.append(pid)
            except KeyError:
                dropped.append(pid)  # already gone (e.g. the store was reset)
            except DataPlaneUnavailableError as exc:
                # Each further clear would wait out the same bound: forget the rest (their rows
                # are undefined, see DataPlaneUnavailableError) and raise the first error.
                first_error = first_error or exc
                break
            except BaseException as exc:  # keep dropping the others, re-raise the first
                first_error = first_error or exc
        self._cl_ready.clear()
        self._cl_loader.load_state_dict(dict(self._cl_committed_state))
        self._cl_next_produce = self._cl_next_step
        if first_error is not None:
            raise first_error
        return dropped

    def quiesce_colocated_loader(self) -> dict[str, Any]:
        """Drop prefetched batches (rewinding the loader); return ``{"loader", "next_batch", "dp_rank"}``.

        Raises ``RuntimeError`` while a batch is active.
        """
        self._cl_require()
        if self._cl_active is not None:
            raise self._cl_error(
                RuntimeError,
                f"cannot checkpoint while batch {self._cl_active} is active; commit or abort the step first",
            )
        self._cl_drop_all()
        self._cl_uncommit = None  # the driver checkpoints this position: the last commit stands
        return {
            "loader": dict(self._cl_committed_state), "next_batch": int(self._cl_next_step), "dp_rank": int(self.rank)
        }

    def save_colocated_data_plane(self, checkpoint_dir: str, metadata: Mapping[str, Any]) -> str:
        """Save this worker's store atomically with JSON ``metadata``; return the dir (``RuntimeError`` if active)."""
        self._cl_require()
        if self._cl_active is not None:
            raise self._cl_error(RuntimeError, f"cannot save the data plane while batch {self._cl_active} is active")
        self._cl_client().save_checkpoint(checkpoint_dir, metadata=dict(metadata))
        return str(checkpoint_dir)

    def load_colocated_data_plane(self, checkpoint_dir: str) -> dict[str, Any]:
        """Restore :meth:`save_colocated_data_plane` output (into a clean client only); return its metadata."""
        return dict(self._cl_client().load_checkpoint(checkpoint_dir))

    def colocated_loader_stats(self) -> dict[str, Any]:
        """Counters of this loader (loads, prefetch hits, full-store refusals), live batches."""
        self._cl_require()
        return {**self._cl_stats, "live": sorted(self._cl_ready), "active": self._cl_active}
