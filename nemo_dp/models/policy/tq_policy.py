"""``TQPolicy``: the driver-side policy façade whose bulk tensors live in the data plane (a model call
sends one meta shard per DP rank to the workers' ``*_presharded`` entrypoints)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import Any, ClassVar

import torch

from nemo_dp.data_plane.driver_mixin import TQDriverMixin
from nemo_dp.data_plane.factory import build_data_plane_client, coerce_data_plane_config
from nemo_dp.data_plane.interfaces import KVBatchMeta
from nemo_dp.data_plane.observability import is_metrics_client
from nemo_dp.data_plane.schema import (
    ADVANTAGES,
    DP_TRAIN_FIELDS,
    LP_SEED_FIELDS,
    TASK_PREV_LP,
    TASK_REF_LP,
    TASK_TRAIN,
    TASK_VAL,
    TOKEN_MASK,
    TRAIN_PARTITION,
    VAL_PARTITION,
)
from nemo_dp.data_plane.worker_mixin import ROW_VALUE_FIELDS, ROW_VALUES_KEY
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.utils.packed_tensor import IMAGE_FIELDS
from nemo_dp.models.builders import policy_takes_images
from nemo_dp.models.policy.policy import Policy
from nemo_dp.models.policy.scoring_pair import ScoringPairSender, pair_digest
from nemo_dp.models.policy.tq_worker import ROLLOUT_STORE_FIELDS, TQPolicyWorker

__all__ = ["TQPolicy", "RolloutResult"]

#: Consumer tasks registered on the train partition.
TRAIN_TASKS: tuple[str, ...] = (TASK_PREV_LP, TASK_REF_LP, TASK_TRAIN)


@dataclass
class RolloutResult:
    """A rollout into the store: one ``meta`` (prompt order), the per-row ``carry`` and decoded ``responses``."""

    meta: KVBatchMeta
    carry: BatchedDataDict
    responses: list[str] | None


class TQPolicy(TQDriverMixin, Policy):
    """The policy façade of the data-plane trainers (``ValueError`` for a disabled or invalid ``dp_cfg``)."""

    #: Image columns the workers read with each dispatch (set per instance for a VLM policy).
    image_fields: tuple[str, ...] = ()

    worker_class: ClassVar[type] = TQPolicyWorker

    def __init__(self, *args: Any, dp_cfg: Any, partition_id: str = TRAIN_PARTITION, **kwargs: Any) -> None:
        self.dp_cfg = dp_cfg
        self.partition_id = partition_id
        self._live_partitions: set[str] = set()
        self._train_step_active = False
        self._scoring = ScoringPairSender()
        self.dp_client = build_data_plane_client(dp_cfg, bootstrap=True)
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            self.dp_client.close()
            raise
        self.image_fields: tuple[str, ...] = IMAGE_FIELDS if policy_takes_images(self.cfg) else ()
        try:
            # Workers get the validated dataclass: picklable and free of interpolations.
            self._dispatch_all("setup_data_plane", coerce_data_plane_config(dp_cfg))
        except BaseException:
            self.shutdown()
            raise

    def prepare_step(self, num_samples: int, group_size: int | None = None, extra_fields: Sequence[str] = ()) -> None:
        """Register the training partition for one step of ``num_samples`` (GRPO groups of ``group_size``).

        ``extra_fields`` are columns beyond ``DP_TRAIN_FIELDS`` and ``ROLLOUT_STORE_FIELDS``.
        Raises ``ValueError`` (``"already registered"``) for a live partition.
        """
        fields = list(dict.fromkeys((*DP_TRAIN_FIELDS, *ROLLOUT_STORE_FIELDS, *self.image_fields, *extra_fields)))
        self.dp_client.register_partition(
            self.partition_id, fields=fields, num_samples=int(num_samples), consumer_tasks=list(TRAIN_TASKS),
            grpo_group_size=group_size,
        )
        self._live_partitions.add(self.partition_id)

    def prepare_val_partition(self, num_samples: int, partition_id: str = VAL_PARTITION) -> None:
        """Register a validation partition (rollout columns, task ``"val"``); ``ValueError`` if already live."""
        fields = [*ROLLOUT_STORE_FIELDS, *self.image_fields]
        self.dp_client.register_partition(
            partition_id, fields=fields, num_samples=int(num_samples), consumer_tasks=[TASK_VAL]
        )
        self._live_partitions.add(partition_id)

    def discard_samples(self, ids: Sequence[str], partition_id: str | None = None) -> None:
        """Clear exactly ``ids`` from a partition (default: training); ``KeyError`` (nothing cleared) if one is gone."""
        ids = list(ids)
        if ids:
            self.dp_client.clear_samples(ids, partition_id or self.partition_id)

    def finish_step(self, meta: KVBatchMeta) -> None:
        """Drop ``meta``'s whole partition (step end); ``KeyError`` when it is not live."""
        self.dp_client.clear_samples(None, meta.partition_id)
        self._live_partitions.discard(meta.partition_id)

    def drop_partition(self, partition_id: str | None = None) -> bool:
        """Drop a partition (default: the training one) this policy registered if still live; True if dropped."""
        pid = partition_id or self.partition_id
        if pid not in self._live_partitions:
            return False
        self._live_partitions.discard(pid)
        self.dp_client.clear_samples(None, pid)
        return True

    def generate_to_dataplane(
        self,
        prompts: Sequence[Sequence[int]],
        seeds: Sequence[int],
        *,
        sample_ids: Sequence[str],
        answers: Sequence[str],
        greedy: bool,
        tokenizer: Any,
        env: Any,
        partition_id: str | None = None,
        task_name: str | None = None,
        return_responses: bool = False,
    ) -> RolloutResult:
        """Generate, score and write a batch into the store from the workers, split as ``Policy.generate``.

        One list entry per row; ``partition_id`` defaults to the training partition.
        Raises ``ValueError`` for empty input or misaligned lists.
        """
        n = len(prompts)
        if n == 0:
            raise ValueError(f"{self.name_prefix}.generate_to_dataplane: no prompts")
        if not (len(seeds) == len(sample_ids) == len(answers) == n):
            raise ValueError(
                f"{self.name_prefix}.generate_to_dataplane: {n} prompts, {len(seeds)} seeds, "
                f"{len(sample_ids)} sample_ids, {len(answers)} answers must align"
            )
        # answers: str; an Answer keeps its row for reward functions
        shards = self._prompt_shards(prompts, seeds, sample_ids=[str(s) for s in sample_ids], answers=answers)
        # One dispatch reaches every rank, so the ranks hold one pair between them.
        digest = pair_digest(tokenizer, env)
        outs = self._dispatch_sharded(
            "generate_into_store", shards, greedy, partition_id=partition_id or self.partition_id,
            task_name=task_name, return_responses=return_responses,
            **self._scoring.kwargs("ranks", digest, tokenizer, env),
        )
        self._scoring.sent("ranks", digest)
        metas = [o["meta"] for o in outs if o["meta"] is not None]
        meta = metas[0].concat(*metas[1:])
        carry = BatchedDataDict.from_batches([BatchedDataDict(o["carry"]) for o in outs if o["meta"] is not None])
        responses = [r for o in outs for r in (o["responses"] or [])] if return_responses else None
        return RolloutResult(meta, carry, responses)

    def _dispatch_logprobs(self, meta: KVBatchMeta, task_name: str, method: str) -> None:
        """Send each DP rank its shard of ``meta``'s log-prob seed columns for worker ``method``."""
        isolated = self._isolated_meta(
            meta, fields=(*LP_SEED_FIELDS, *self.image_fields), task_name=task_name, keep_tags=False
        )
        shards = self._shard_meta(isolated, batch_size=None, mb_tokens_key="logprob_mb_tokens")
        self._dispatch_sharded(method, shards)

    def get_logprobs_from_meta(self, meta: KVBatchMeta) -> None:
        """Policy log-probs of ``meta``'s rows (holding ``LP_SEED_FIELDS``), stored as ``prev_logprobs``."""
        self._dispatch_logprobs(meta, TASK_PREV_LP, "get_logprobs_presharded")

    def get_policy_and_reference_logprobs_from_meta(self, meta: KVBatchMeta) -> None:
        """Policy and reference log-probs in one dispatch per rank, bit-equal to the two separate calls."""
        self._dispatch_logprobs(meta, TASK_PREV_LP, "get_logprobs_and_reference_presharded")

    def get_reference_policy_logprobs_from_meta(self, meta: KVBatchMeta) -> None:
        """Like :meth:`get_logprobs_from_meta`, but reference log-probs, written as ``reference_policy_logprobs``."""
        self._dispatch_logprobs(meta, TASK_REF_LP, "get_reference_policy_logprobs_presharded")

    def train_from_meta(self, meta: KVBatchMeta, loss_fn: Any, eval_mode: bool = False, gbs: int | None = None,
                        mbs: int | None = None, train_fields: Sequence[str] = DP_TRAIN_FIELDS,
                        row_values: Mapping[str, torch.Tensor] | None = None) -> dict[str, Any]:
        """Like ``Policy.train`` on ``meta``'s rows: the workers fetch their shards from the store.

        ``row_values`` carries per-row ``advantages`` / ``sample_mask`` (float ``[B]``) with the
        dispatch instead of through the store; each rank sets ``advantages = adv[:, None] *
        token_mask`` on its fetched rows.  Fields in ``row_values`` are not fetched.

        Raises ``ValueError`` when the rows do not divide over the ranks or ``row_values`` is malformed.
        """
        gbs = int(gbs or self.cfg.train_global_batch_size)
        rows = self._check_row_values(meta, row_values, train_fields)
        fields = [f for f in train_fields if f not in rows]
        fields += [f for f in self.image_fields if f not in fields]
        isolated = self._isolated_meta(meta, fields=fields, task_name=TASK_TRAIN, keep_tags=False)
        shards = self._shard_meta(isolated, batch_size=gbs, mb_tokens_key="train_mb_tokens")
        if rows:
            position = {sid: i for i, sid in enumerate(meta.sample_ids)}
            for shard in shards:
                index = torch.tensor([position[sid] for sid in shard.sample_ids], dtype=torch.long)
                shard.extra_info[ROW_VALUES_KEY] = {k: v.index_select(0, index) for k, v in rows.items()}
        results = self._dispatch_sharded(
            "train_presharded", shards, loss_fn=loss_fn, eval_mode=eval_mode, gbs=gbs, mbs=mbs
        )
        return self._aggregate_train_results(results)

    def _check_row_values(
        self, meta: KVBatchMeta, row_values: Mapping[str, torch.Tensor] | None, train_fields: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        """``row_values`` checked for :meth:`train_from_meta` (CPU, detached; ``{}`` for none)."""
        if not row_values:
            return {}
        out: dict[str, torch.Tensor] = {}
        for key, value in row_values.items():
            if key not in ROW_VALUE_FIELDS:
                raise ValueError(
                    f"{self.name_prefix}.train_from_meta: row_values key {key!r} is not one of "
                    f"{list(ROW_VALUE_FIELDS)}"
                )
            if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.shape[0] != meta.size:
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(
                    f"{self.name_prefix}.train_from_meta: row_values[{key!r}] must be a 1-D "
                    f"tensor of meta.size={meta.size} rows, got {got}"
                )
            out[key] = value.detach().cpu()
        if ADVANTAGES in out and TOKEN_MASK not in train_fields:
            raise ValueError(
                f"{self.name_prefix}.train_from_meta: per-row advantages are spread over "
                f"{TOKEN_MASK!r}, which train_fields must include"
            )
        return out

    def begin_train_step(self, loss_fn: Any, gbs: int | None = None, mbs: int | None = None) -> None:
        """Start one optimizer step on every rank (``gbs`` only for signature parity); ``"already active"`` raises."""
        if self._train_step_active:
            raise RuntimeError(f"{self.name_prefix}: a train step is already active; finish or abort it first")
        self._dispatch_all("begin_train_step_presharded", loss_fn, gbs=gbs, mbs=mbs)
        self._train_step_active = True

    def train_placed_microbatches(self, dp_metas: Sequence[KVBatchMeta]) -> None:
        """Run placed meta ``r`` on DP rank ``r`` (gradients accumulate); ``RuntimeError`` without a step."""
        placed = self.checked_placed_metas(dp_metas)
        if not self._train_step_active:
            raise RuntimeError(f"{self.name_prefix}: train_placed_microbatches without begin_train_step")
        self._dispatch_sharded("train_microbatch_presharded", placed)

    def checked_placed_metas(self, dp_metas: Sequence[KVBatchMeta]) -> list[KVBatchMeta]:
        """Check one placed meta per DP rank (rank order); return copies stamped with one global pad target.

        Raises ``ValueError``: not one meta per rank, dynamic batching, or packing without a plan.
        """
        metas = list(dp_metas)
        if len(metas) != self.dp_size:
            raise ValueError(
                "Placed metadata must contain exactly one batch per DP rank "
                f"(got {len(metas)} metas for dp_size={self.dp_size})"
            )
        spa, dba = self._packing_args("train_mb_tokens")
        if dba is not None:
            raise ValueError("Placed metadata does not support dynamic batching.")
        if spa is not None and any("micro_batch_indices" not in m.extra_info for m in metas):
            raise ValueError("Placed packed metadata requires producer microbatch shapes.")
        return self._placed_metas(metas)

    def finish_train_step(self) -> dict[str, Any]:
        """Reduce gradients, step the optimizer on every rank and end the step; return its metrics."""
        if not self._train_step_active:
            raise RuntimeError(f"{self.name_prefix}: finish_train_step without begin_train_step")
        results = self._dispatch_all("finish_train_step_presharded")
        self._train_step_active = False
        return self._aggregate_train_results([{"per_step": [r]} for r in results])

    def abort_train_step(self) -> None:
        """Drop accumulated gradients on every rank (idempotent)."""
        self._dispatch_all("abort_train_step_presharded")
        self._train_step_active = False

    def data_plane_step_metrics(self, step_time_s: float) -> dict[str, float]:
        """The driver's ``get_step_metrics`` as ``data_plane/...`` plus the workers' as ``data_plane/workers/...``.

        ``{}`` without observability; ``step_time_s`` (wall time of the step) feeds ``step/frac_of_step``.
        """
        if not is_metrics_client(self.dp_client):
            return {}
        out = {f"data_plane/{k}": float(v) for k, v in self.dp_client.get_step_metrics(step_time_s).items()}
        # Workers build their clients from the same config, so they are wrapped as well.
        out.update(self._worker_store_metrics(step_time_s, "data_plane/workers"))
        return out

    def data_plane_snapshots(self) -> dict[str, Any]:
        """Cumulative data-plane stats: ``{"driver": snapshot | None, "workers": [snapshot | None per rank]}``."""
        driver = self.dp_client.snapshot() if is_metrics_client(self.dp_client) else None
        return {"driver": driver, "workers": self._dispatch_all("get_data_plane_snapshot")}

    def save_data_plane_checkpoint(
        self, checkpoint_dir: str | PathLike[str], *, metadata: Mapping[str, Any] | None = None
    ) -> None:
        """Checkpoint the driver's store (TransferQueue: the whole system) atomically, with user ``metadata``."""
        self.dp_client.save_checkpoint(checkpoint_dir, metadata=metadata)

    def load_data_plane_checkpoint(self, checkpoint_dir: str | PathLike[str]) -> dict[str, Any]:
        """Restore :meth:`save_data_plane_checkpoint` output into the driver's (clean) store; return its metadata."""
        return self.dp_client.load_checkpoint(checkpoint_dir)

    def live_partitions(self) -> Iterable[str]:
        """Partitions this policy registered and has not dropped yet."""
        return sorted(self._live_partitions)

    def shutdown(self) -> None:
        """Shut the workers (and their clients) down, then close the bootstrapping client (idempotent)."""
        try:
            super().shutdown()
        finally:
            self.dp_client.close()

