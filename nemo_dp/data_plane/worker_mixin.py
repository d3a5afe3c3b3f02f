"""Worker-side ``*_presharded`` data-plane entrypoints of policy / value workers (``TQWorkerMixin``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from nemo_dp.data_plane.batch_columns import materialize_for_meta
from nemo_dp.data_plane.codec import make_pad_value_dict
from nemo_dp.data_plane.column_io import write_columns
from nemo_dp.data_plane.driver_mixin import cfg_value
from nemo_dp.data_plane.factory import build_data_plane_client
from nemo_dp.data_plane.interfaces import DataPlaneClient, KVBatchMeta
from nemo_dp.data_plane.observability import is_metrics_client
from nemo_dp.data_plane.schema import (
    ADVANTAGES,
    ELEM_COUNTS_PER_GB,
    GLOBAL_FORWARD_PAD_SEQLEN,
    MICRO_BATCH_INDICES,
    MICRO_BATCH_LENGTHS,
    PREV_LOGPROBS,
    REFERENCE_POLICY_LOGPROBS,
    SAMPLE_MASK,
    TOKEN_MASK,
    VALUES,
    Layout,
)
from nemo_dp.distributed.batched_data_dict import BatchedDataDict

__all__ = ["PARALLEL_AXES", "ROW_VALUES_KEY", "ROW_VALUE_FIELDS", "TQWorkerMixin", "apply_row_values"]

PARALLEL_AXES: tuple[str, ...] = ("tensor_parallel", "context_parallel", "pipeline_parallel")

#: Training inputs a dispatch may carry per row instead of the store (``train_presharded``).
ROW_VALUE_FIELDS: tuple[str, ...] = (ADVANTAGES, SAMPLE_MASK)
#: ``extra_info`` key of a training shard holding those values (``{field: 1-D tensor}`` in row order).
ROW_VALUES_KEY = "row_values"


def apply_row_values(data: BatchedDataDict, row_values: Mapping[str, torch.Tensor]) -> BatchedDataDict:
    """Set the per-row training inputs (``ROW_VALUE_FIELDS``) a dispatch carried on a fetched batch, in place.

    ``advantages`` becomes ``adv[:, None] * token_mask.float()`` (the legacy GRPO expression, bit-identical).

    Raises:
        ValueError: An unknown key, a length other than ``data.size``, or ``advantages`` without ``token_mask``.
    """
    for key, value in row_values.items():
        if key not in ROW_VALUE_FIELDS:
            raise ValueError(f"row_values key {key!r} is not one of {list(ROW_VALUE_FIELDS)}")
        if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.shape[0] != data.size:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"row_values[{key!r}] must be a 1-D tensor of {data.size} rows, got {got}")
    if ADVANTAGES in row_values:
        if TOKEN_MASK not in data:
            raise ValueError(
                f"row_values[{ADVANTAGES!r}] is spread over {TOKEN_MASK!r}, which the fetched batch does not hold"
            )
        data[ADVANTAGES] = row_values[ADVANTAGES].unsqueeze(1) * data[TOKEN_MASK].float()
    if SAMPLE_MASK in row_values:
        data[SAMPLE_MASK] = row_values[SAMPLE_MASK]
    return data


def _one_field_name(tq_field: str | None, field: str | None) -> str:
    if tq_field is None and field is None:
        raise TypeError("_write_back_result_field: pass the data-plane field as tq_field=")
    if tq_field is not None and field is not None and tq_field != field:
        raise TypeError(
            f"_write_back_result_field: tq_field={tq_field!r} and field={field!r} name two different fields; pass one"
        )
    return str(tq_field if tq_field is not None else field)


class TQWorkerMixin:
    """``*_presharded`` entrypoints: fetch this DP rank's ``KVBatchMeta`` shard, run the host's method, write back.

    The driver's micro-batch plan on the meta is followed, never re-planned; results are written by
    the replica leader only.  The host provides the methods under ``TYPE_CHECKING`` below and
    ``_local_coords()``; ``self.dp_client`` (alias ``_dp_client``) is set by ``setup_data_plane``.
    """

    dp_client: DataPlaneClient | None = None
    dp_cfg: Any = None
    _dp_train_step_active: bool = False

    if TYPE_CHECKING:  # the host's hooks, with the host's signatures; never defined here at runtime
        cfg: Any
        train: Callable[..., dict]  # (data, loss_fn, eval_mode, gbs, mbs)
        get_logprobs: Callable[..., Mapping[str, Any]]  # (data, micro_batch_size)
        get_reference_policy_logprobs: Callable[..., Mapping[str, Any]]  # (data, micro_batch_size)
        get_values: Callable[..., Mapping[str, Any]]  # (data, micro_batch_size)
        begin_train_step: Callable[..., None]  # (loss_fn, mbs)
        train_microbatch: Callable[[BatchedDataDict], None]
        finish_train_step: Callable[[], dict]
        abort_train_step: Callable[[], None]

    def setup_data_plane(self, cfg: Any) -> None:
        """Build this worker's client (idempotent): TransferQueue attaches to the driver's, Local is private.

        Raises:
            ValueError: The config is disabled or invalid (from ``build_data_plane_client``).
        """
        if self.dp_client is not None:
            return
        self.dp_client = build_data_plane_client(cfg, bootstrap=False)
        self.dp_cfg = cfg

    @property
    def _dp_client(self) -> DataPlaneClient | None:
        return self.dp_client

    @_dp_client.setter
    def _dp_client(self, client: DataPlaneClient | None) -> None:
        self.dp_client = client

    def _require_dp_client(self) -> DataPlaneClient:
        """``self.dp_client``; ``RuntimeError`` before ``setup_data_plane``."""
        if self.dp_client is None:
            raise RuntimeError(
                f"Data-plane client not initialised on worker {type(self).__name__}: call "
                "setup_data_plane(cfg) before invoking any *_presharded entrypoint."
            )
        return self.dp_client

    def _local_coords(self) -> dict[str, int]:
        """This rank's model-parallel coordinates; ``NotImplementedError`` unless a host class defines it."""
        parent = getattr(super(), "_local_coords", None)
        if parent is None:
            raise NotImplementedError(
                f"{type(self).__name__} must define _local_coords() -> dict[str, int] "
                f"(coordinates on {list(PARALLEL_AXES)}); TQWorkerMixin has no default because "
                "every rank would become a replica leader and write the same rows."
            )
        return parent()

    def _is_replica_leader(self) -> bool:
        """True iff this rank's coordinate is 0 on every ``PARALLEL_AXES`` axis (missing = 0)."""
        coords = self._local_coords()
        return all(int(coords.get(axis, 0)) == 0 for axis in PARALLEL_AXES)

    def _packing_enabled(self) -> bool:
        """A host base class's answer, else whether dynamic batching or sequence packing is on (``KeyError``)."""
        parent = getattr(super(), "_packing_enabled", None)
        if parent is not None:
            return bool(parent())
        cfg = getattr(self, "cfg", None)
        if cfg is None:
            raise KeyError(
                f"{type(self).__name__} has no cfg with dynamic_batching / sequence_packing "
                "sections; define self.cfg or override _packing_enabled()"
            )
        db = cfg_value(cfg, "dynamic_batching", "cfg")
        sp = cfg_value(cfg, "sequence_packing", "cfg")
        db_on = bool(cfg_value(db, "enabled", "cfg.dynamic_batching"))
        return db_on or bool(cfg_value(sp, "enabled", "cfg.sequence_packing"))

    def _data_plane_pad_values(self) -> Mapping[str, float | int] | None:
        """A host base class's pad values, else ``make_pad_value_dict(self.pad_id)`` for an int ``pad_id``."""
        parent = getattr(super(), "_data_plane_pad_values", None)
        if parent is not None:
            return parent()
        pad_id = getattr(self, "pad_id", None)
        if isinstance(pad_id, int) and not isinstance(pad_id, bool):
            return make_pad_value_dict(pad_id)
        return None

    def _fetch(
        self, meta: KVBatchMeta, *, layout: Layout = "padded", dp_aligned_seq_len: bool = True
    ) -> BatchedDataDict:
        """Fetch and materialise this rank's shard (``meta.fields``, ``meta.sample_ids`` order); no plan attached.

        ``dp_aligned_seq_len`` pads to the meta's ``global_forward_pad_seqlen`` (else to the slice maximum).
        Raises ``RuntimeError`` without a client and as ``materialize_for_meta`` and the store.
        """
        client = self._require_dp_client()
        pad_to_seqlen = int(meta.extra_info.get(GLOBAL_FORWARD_PAD_SEQLEN, 0)) if dp_aligned_seq_len else 0
        td = client.get_data(meta, select_fields=list(meta.fields) if meta.fields else None)
        return materialize_for_meta(
            meta, td, layout=layout, pad_value_dict=self._data_plane_pad_values(), pad_to_seqlen=pad_to_seqlen
        )

    def _attach_pack_metadata(self, data: BatchedDataDict, meta: KVBatchMeta) -> BatchedDataDict:
        """Set copies of ``meta``'s microbatch plan (trusted, never recomputed) as attributes of ``data``.

        Raises:
            ValueError: Half a plan, or none while dynamic batching / sequence packing is on.
        """
        info = meta.extra_info
        has_indices = MICRO_BATCH_INDICES in info
        has_lengths = MICRO_BATCH_LENGTHS in info
        if has_indices != has_lengths:
            missing = MICRO_BATCH_LENGTHS if has_indices else MICRO_BATCH_INDICES
            raise ValueError(
                f"_attach_pack_metadata: meta for partition {meta.partition_id!r} carries an "
                f"incomplete microbatch plan: extra_info[{missing!r}] is missing"
            )
        if has_indices:
            data.micro_batch_indices = [[list(pair) for pair in chunk] for chunk in info[MICRO_BATCH_INDICES]]
            data.micro_batch_lengths = [list(chunk) for chunk in info[MICRO_BATCH_LENGTHS]]
            if ELEM_COUNTS_PER_GB in info:
                data.elem_counts_per_gb = list(info[ELEM_COUNTS_PER_GB])
            return data
        if self._packing_enabled():
            raise ValueError(
                f"_attach_pack_metadata: dynamic batching / sequence packing is enabled but the meta for partition "
                f"{meta.partition_id!r} carries no microbatch plan (extra_info[{MICRO_BATCH_INDICES!r}] / "
                f"[{MICRO_BATCH_LENGTHS!r}]); the driver must shard with shard_meta_for_dp or ship a producer plan"
            )
        return data

    def _write_back(self, meta: KVBatchMeta, fields: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        """``write_columns`` on the replica leader only (no-op elsewhere or for no fields); needs a client."""
        client = self._require_dp_client()
        if len(fields) == 0 or not self._is_replica_leader():
            return
        write_columns(client, meta, fields)

    def _result_column(self, meta: KVBatchMeta, result: Any, *, result_key: str, field: str) -> torch.Tensor:
        """``result[result_key]`` checked as column ``field`` (named in errors) of ``meta``'s rows; detached, on CPU.

        Raises ``RuntimeError`` unless ``result`` is a Mapping holding ``result_key``, ``TypeError`` unless the
        value is a tensor, ``ValueError`` unless its batch dim is ``meta.size``.
        """
        if not isinstance(result, Mapping) or result_key not in result:
            got = sorted(map(str, result.keys())) if isinstance(result, Mapping) else type(result).__name__
            raise RuntimeError(
                f"write-back of {field!r}: expected a Mapping holding {result_key!r} from the "
                f"worker's compute method, got {got}"
            )
        value = result[result_key]
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"write-back of {field!r}: result[{result_key!r}] must be a torch.Tensor, got {type(value).__name__}"
            )
        rows = int(value.shape[0]) if value.dim() > 0 else None
        if rows != meta.size:
            raise ValueError(
                f"write-back of {field!r}: result[{result_key!r}] has batch dim {rows}, expected "
                f"meta.size {meta.size} (partition {meta.partition_id!r})"
            )
        return value.detach().cpu()

    def _write_back_result_field(
        self, meta: KVBatchMeta, result: Any, *, result_key: str, tq_field: str | None = None, field: str | None = None
    ) -> None:
        """Like :meth:`_result_column`, but writes the column as ``tq_field`` (alias ``field``; give one).

        Non-leaders return without looking at ``result``.  Also raises ``RuntimeError`` without a client,
        ``TypeError`` for neither or two different field names.
        """
        field = _one_field_name(tq_field, field)
        self._require_dp_client()
        if not self._is_replica_leader():
            return
        value = self._result_column(meta, result, result_key=result_key, field=field)
        self._write_back(meta, {field: value})

    def _fetch_planned(self, meta: KVBatchMeta) -> BatchedDataDict:
        return self._attach_pack_metadata(self._fetch(meta), meta)

    def train_presharded(
        self, meta: KVBatchMeta, loss_fn: Any, eval_mode: bool = False, gbs: int | None = None, mbs: int | None = None
    ) -> dict:
        """Train on this rank's shard (``self.train``, after ``apply_row_values``); return its metrics."""
        data = self._fetch_planned(meta)
        row_values = meta.extra_info.get(ROW_VALUES_KEY)
        if row_values is not None:
            apply_row_values(data, row_values)
        return self.train(data, loss_fn, eval_mode=eval_mode, gbs=gbs, mbs=mbs)

    def get_logprobs_presharded(self, meta: KVBatchMeta, micro_batch_size: int | None = None) -> None:
        """Log-probs of this rank's shard, written back as ``prev_logprobs``."""
        data = self._fetch_planned(meta)
        result = self.get_logprobs(data, micro_batch_size=micro_batch_size)
        self._write_back_result_field(meta, result, result_key="logprobs", tq_field=PREV_LOGPROBS)

    def get_reference_policy_logprobs_presharded(self, meta: KVBatchMeta, micro_batch_size: int | None = None) -> None:
        """Reference-policy log-probs of this rank's shard, written back as ``reference_policy_logprobs``."""
        data = self._fetch_planned(meta)
        result = self.get_reference_policy_logprobs(data, micro_batch_size=micro_batch_size)
        self._write_back_result_field(meta, result, result_key="reference_logprobs", tq_field=REFERENCE_POLICY_LOGPROBS)

    def get_logprobs_and_reference_presharded(self, meta: KVBatchMeta, micro_batch_size: int | None = None) -> None:
        """Both log-prob entrypoints from one read and one put (bit-identical to the two separate ones)."""
        data = self._fetch_planned(meta)
        policy = self.get_logprobs(data, micro_batch_size=micro_batch_size)
        reference = self.get_reference_policy_logprobs(data, micro_batch_size=micro_batch_size)
        if not self._is_replica_leader():
            return
        columns = {
            PREV_LOGPROBS: self._result_column(meta, policy, result_key="logprobs", field=PREV_LOGPROBS),
            REFERENCE_POLICY_LOGPROBS: self._result_column(
                meta, reference, result_key="reference_logprobs", field=REFERENCE_POLICY_LOGPROBS
            ),
        }
        self._write_back(meta, columns)

    def get_values_presharded(self, meta: KVBatchMeta, micro_batch_size: int | None = None) -> None:
        """Value estimates of this rank's shard, written back as ``values``."""
        data = self._fetch_planned(meta)
        result = self.get_values(data, micro_batch_size=micro_batch_size)
        self._write_back_result_field(meta, result, result_key="values", tq_field=VALUES)

    def begin_train_step_presharded(self, loss_fn: Any, gbs: int | None = None, mbs: int | None = None) -> None:
        """Start one optimizer step made of placed microbatches (``gbs`` is unused, kept for parity).

        Raises:
            RuntimeError: No client, or a step is already active (``"already active"``).
        """
        self._require_dp_client()
        if self._dp_train_step_active:
            raise RuntimeError(
                f"{type(self).__name__}: a presharded train step is already active; call "
                "finish_train_step_presharded() or abort_train_step_presharded() first"
            )
        self.begin_train_step(loss_fn, mbs=mbs)
        self._dp_train_step_active = True

    def train_microbatch_presharded(self, meta: KVBatchMeta) -> None:
        """Fetch one placed microbatch and run forward/backward (gradients accumulate); ``RuntimeError``: no step."""
        self._require_active_step("train_microbatch_presharded")
        data = self._fetch_planned(meta)
        self.train_microbatch(data)

    def finish_train_step_presharded(self) -> dict:
        """Reduce gradients and step; return metrics plus ``is_replica_leader``; ``RuntimeError``: no step.

        The step stays active if the host raises, so the driver's abort still drops the gradients.
        """
        self._require_active_step("finish_train_step_presharded")
        metrics = dict(self.finish_train_step())
        self._dp_train_step_active = False
        metrics["is_replica_leader"] = self._is_replica_leader()
        return metrics

    def _require_active_step(self, entrypoint: str) -> None:
        if not self._dp_train_step_active:
            raise RuntimeError(
                f"{type(self).__name__}: {entrypoint} called without an active "
                "step; call begin_train_step_presharded() first"
            )

    def abort_train_step_presharded(self) -> None:
        """Drop accumulated gradients and end the step (idempotent; no-op without a step)."""
        if not self._dp_train_step_active:
            return
        self.abort_train_step()
        self._dp_train_step_active = False

    def data_plane_step_metrics(self, step_time_s: float) -> dict[str, float]:
        """This worker's ``get_step_metrics`` (resets its window); ``{}`` without a ``MetricsDataPlaneClient``."""
        client = self.dp_client
        return dict(client.get_step_metrics(step_time_s)) if is_metrics_client(client) else {}

    def get_data_plane_snapshot(self) -> dict | None:
        """The metrics wrapper's snapshot, or ``None`` without a ``MetricsDataPlaneClient``."""
        client = self.dp_client
        return client.snapshot() if is_metrics_client(client) else None
