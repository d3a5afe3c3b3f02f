"""``Value``: the PPO critic's driver facade, a ``Policy`` over ``ValueWorker`` ranks (identical micro-batch plans)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf

from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.models.policy.policy import Policy
from nemo_dp.models.value.worker import ValueWorker

__all__ = ["Value", "critic_config"]


def critic_config(policy_cfg: Any, value_cfg: Any) -> DictConfig:
    """A new ``DictConfig``: the policy config with ``algorithm.value``'s ``lr`` and ``warmup_steps``."""
    base = policy_cfg if isinstance(policy_cfg, DictConfig) else OmegaConf.structured(policy_cfg)
    out = OmegaConf.create(OmegaConf.to_container(base, resolve=True))
    out.optimizer.lr = float(value_cfg.lr)
    out.optimizer.warmup_steps = int(value_cfg.warmup_steps)
    return out


class Value(Policy):
    """The critic: ``dp_size`` ``ValueWorker`` replicas, constructed like ``Policy`` with a ``critic_config`` node."""

    worker_class: ClassVar[type] = ValueWorker

    def __init__(self, *, name_prefix: str = "value", **kwargs: Any) -> None:
        super().__init__(name_prefix=name_prefix, **kwargs)

    def get_values(self, data: BatchedDataDict) -> BatchedDataDict:
        """Per-token values ``{"values": float32 [B, S]}`` in input order (as ``ValueWorker.get_values``)."""
        return self._per_token("get_values", data, "values")

    def init_trunk_from(self, policy_model_state: Mapping[str, Any]) -> None:
        """Start every critic replica from a policy model state's trunk (all but the LM head)."""
        self._dispatch_all("init_trunk_from", dict(policy_model_state))

    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], *, greedy: bool) -> BatchedDataDict:
        """Raises ``RuntimeError``, as do the log-prob and reference methods: a critic has no LM head."""
        raise RuntimeError(f"{self.name_prefix}: a value model cannot generate")

    def get_logprobs(self, data: BatchedDataDict) -> BatchedDataDict:
        raise RuntimeError(f"{self.name_prefix}: a value model has no log-probs; use get_values")

    def get_reference_policy_logprobs(self, data: BatchedDataDict) -> BatchedDataDict:
        raise RuntimeError(f"{self.name_prefix}: a value model has no reference policy")

    def snapshot_reference_policy(self) -> None:
        raise RuntimeError(f"{self.name_prefix}: a value model has no reference policy")
