"""``TQValue``: the PPO critic's driver facade over the data plane, borrowing the policy's driver client."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from nemo_dp.data_plane.driver_mixin import TQDriverMixin
from nemo_dp.data_plane.factory import coerce_data_plane_config
from nemo_dp.data_plane.interfaces import DataPlaneClient, KVBatchMeta
from nemo_dp.data_plane.schema import DP_VALUE_TRAIN_FIELDS, VALUE_SEED_FIELDS
from nemo_dp.data_plane.worker_mixin import TQWorkerMixin
from nemo_dp.models.value.value import Value
from nemo_dp.models.value.worker import ValueWorker

__all__ = ["TQValue", "TQValueWorker", "TASK_VALUES", "TASK_VALUE_TRAIN"]

#: Task names of the critic's dispatches (tags on the dispatched metas; nothing claims them).
TASK_VALUES = "values"
TASK_VALUE_TRAIN = "value_train"


class TQValueWorker(TQWorkerMixin, ValueWorker):
    """A ``ValueWorker`` with the ``*_presharded`` entrypoints (``get_values_presharded`` writes ``values``)."""


class TQValue(TQDriverMixin, Value):
    """The data-plane PPO critic facade; ``dp_cfg`` and ``dp_client`` (never closed here) are the policy's."""

    worker_class: ClassVar[type] = TQValueWorker

    def __init__(self, *args: Any, dp_cfg: Any, dp_client: DataPlaneClient, **kwargs: Any) -> None:
        self.dp_cfg = dp_cfg
        self.dp_client = dp_client
        worker_dp_cfg = coerce_data_plane_config(dp_cfg)
        super().__init__(*args, **kwargs)
        try:
            self._dispatch_all("setup_data_plane", worker_dp_cfg)
        except BaseException:
            self.shutdown()
            raise

    @classmethod
    def from_policy(cls, policy: Any, **kwargs: Any) -> TQValue:
        """A critic (``kwargs`` for ``Value``) sharing a ``TQPolicy``'s data plane (else ``ValueError``)."""
        if not hasattr(policy, "dp_cfg") or not hasattr(policy, "dp_client"):
            raise ValueError(
                f"TQValue.from_policy: expected a data-plane policy exposing dp_cfg and dp_client "
                f"(TQPolicy), got {type(policy).__name__}"
            )
        return cls(dp_cfg=policy.dp_cfg, dp_client=policy.dp_client, **kwargs)

    def _shard_isolated(self, meta: KVBatchMeta, fields: Sequence[str], task_name: str, gbs: int | None) -> list:
        """Fresh isolated copy (own pad target) sharded over the critic's ranks (``gbs`` None: log-prob plan)."""
        isolated = self._isolated_meta(meta, fields=list(fields), task_name=task_name)
        key = "logprob_mb_tokens" if gbs is None else "train_mb_tokens"
        return self._shard_meta(isolated, batch_size=gbs, mb_tokens_key=key)

    def get_values_from_meta(self, meta: KVBatchMeta) -> None:
        """Critic values of ``meta``'s rows (holding ``VALUE_SEED_FIELDS``), stored as ``values``."""
        shards = self._shard_isolated(meta, VALUE_SEED_FIELDS, TASK_VALUES, None)
        self._dispatch_sharded("get_values_presharded", shards)

    def train_from_meta(self, meta: KVBatchMeta, loss_fn: Any, eval_mode: bool = False, gbs: int | None = None,
                        mbs: int | None = None, train_fields: Sequence[str] = DP_VALUE_TRAIN_FIELDS) -> dict[str, Any]:
        """Like ``Value.train`` on ``meta``'s rows (in epoch order); workers fetch ``train_fields`` from the store."""
        gbs = int(gbs or self.cfg.train_global_batch_size)
        shards = self._shard_isolated(meta, train_fields, TASK_VALUE_TRAIN, gbs)
        results = self._dispatch_sharded(
            "train_presharded", shards, loss_fn=loss_fn, eval_mode=eval_mode, gbs=gbs, mbs=mbs
        )
        return self._aggregate_train_results(results)

    def data_plane_worker_metrics(self, step_time_s: float) -> dict[str, float]:
        """The critic workers' per-step store metrics as ``data_plane/critic_workers/...`` (``{}`` without them)."""
        return self._worker_store_metrics(step_time_s, "data_plane/critic_workers")
