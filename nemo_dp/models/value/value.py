"""``Value``: the driver-side facade over the PPO critic's own worker group.

Subclasses ``Policy`` (same sharding, dispatch and aggregation) with ``ValueWorker``; adds
``get_values`` and refuses generation and log-probs.  Its config has the policy's batching keys,
so both models get identical micro-batch plans.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf

from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.models.policy.policy import Policy
from nemo_dp.models.value.worker import ValueWorker

__all__ = ["Value", "critic_config"]


def critic_config(policy_cfg: Any, value_cfg: Any) -> DictConfig:
    """A new ``DictConfig``: the policy config with ``algorithm.value``'s ``lr`` and ``warmup_steps``.

    The inputs are not modified.
    """
    base = policy_cfg if isinstance(policy_cfg, DictConfig) else OmegaConf.structured(policy_cfg)
    out = OmegaConf.create(OmegaConf.to_container(base, resolve=True))
    out.optimizer.lr = float(value_cfg.lr)
    out.optimizer.warmup_steps = int(value_cfg.warmup_steps)
    return out


class Value(Policy):
    """The critic: ``dp_size`` ``ValueWorker`` replicas, each with its own optimizer.

    Constructed like ``Policy`` (``cluster``, ``config`` = a ``critic_config`` node,
    ``vocab_size``, ``pad_id``, ``eos_id``, ``seed``, ``name_prefix``).
    """

    worker_class: ClassVar[type] = ValueWorker

    def __init__(self, *, name_prefix: str = "value", **kwargs: Any) -> None:
        super().__init__(name_prefix=name_prefix, **kwargs)

    # --- the critic's API -------------------------------------------------------------------
    def get_values(self, data: BatchedDataDict) -> BatchedDataDict:
        """Per-token values ``{"values": float32 [B, S]}`` in input order (value of the prefix ``tokens < t``).

        Reads ``input_ids`` and ``input_lengths``; 0 at column 0 and beyond a row's length.
        """
        return self._per_token("get_values", data, "values")

    def init_trunk_from(self, policy_model_state: Mapping[str, Any]) -> None:
        """Start every critic replica from a policy model's trunk (all but the LM head).

        ``policy_model_state`` is e.g. ``policy.state_dict()["weights"]["model"]``.
        """
        self._dispatch_all("init_trunk_from", dict(policy_model_state))

    # train(data, loss_fn), reset_optimizer, state_dict, load_state_dict, weights_checksums
    # and shutdown are inherited unchanged.

    # --- what a critic does not do ----------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], *, greedy: bool) -> BatchedDataDict:
        """Not available: a critic has no language-model head; raises ``RuntimeError``."""
        raise RuntimeError(f"{self.name_prefix}: a value model cannot generate")

    def get_logprobs(self, data: BatchedDataDict) -> BatchedDataDict:
        """Not available (use :meth:`get_values`); raises ``RuntimeError``."""
        raise RuntimeError(f"{self.name_prefix}: a value model has no log-probs; use get_values")

    def get_reference_policy_logprobs(self, data: BatchedDataDict) -> BatchedDataDict:
        """Not available; raises ``RuntimeError``."""
        raise RuntimeError(f"{self.name_prefix}: a value model has no reference policy")

    def snapshot_reference_policy(self) -> None:
        """Not available; raises ``RuntimeError``."""
        raise RuntimeError(f"{self.name_prefix}: a value model has no reference policy")
