"""``algorithm.async_rollout``: the switch and knobs of asynchronous GRPO (``docs/async_grpo.md``); no Ray import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_dp.utils.config_checks import Checked, at_least_field, positive_field
from nemo_dp.utils.config_access import cfg_get

__all__ = [
    "AsyncRolloutConfig",
    "async_rollout_enabled",
    "coerce_async_rollout_config",
    "validate_async_rollout_selection",
]

_KEY = "algorithm.async_rollout"


@dataclass
class AsyncRolloutConfig(Checked, key=_KEY):
    """``algorithm.async_rollout`` of GRPO: ``max_staleness`` 0 reproduces ``grpo_train_sync`` exactly;
    ``torch_threads`` 0 = ``policy.torch_threads``."""

    enabled: bool = False
    max_staleness: int = at_least_field(1, 0)
    num_rollout_workers: int = at_least_field(1, 1)
    importance_ratio_cap: float = at_least_field(2.0, 1.0)
    claim_poll_interval_s: float = positive_field(0.02)
    claim_timeout_s: float = positive_field(600.0)
    torch_threads: int = at_least_field(0, 0)


def async_rollout_enabled(master_config: Any) -> bool:
    """``algorithm.name == "grpo"`` and ``algorithm.async_rollout.enabled`` (``TypeError`` if that is no bool)."""
    algo = cfg_get(master_config, "algorithm", None)
    if algo is None or isinstance(algo, str) or cfg_get(algo, "name", None) != "grpo":
        return False
    enabled = cfg_get(cfg_get(algo, "async_rollout", None), "enabled", None)
    if enabled is None:
        return False
    if not isinstance(enabled, bool):
        raise TypeError(f"{_KEY}.enabled must be a bool, got {enabled!r}")
    return enabled


def validate_async_rollout_selection(master_config: Any) -> bool:
    """Whether asynchronous GRPO is selected, checking that it can run.

    Raises:
        ValueError: Enabled on a data plane that carries no rows between processes, or together
            with ``algorithm.dynamic_sampling.enabled``.
    """
    if not async_rollout_enabled(master_config):
        return False
    from nemo_dp.config.algorithm_registry import algorithm
    from nemo_dp.data_plane.factory import data_plane_kind
    from nemo_dp.data_plane.registry import backend

    kind = data_plane_kind(cfg_get(master_config, "data_plane", None))
    legal = [
        kind_ for mode in algorithm("grpo").modes if mode.switch_key == f"{_KEY}.enabled" for kind_ in mode.trainers
    ]
    if kind not in legal:
        options = " or ".join(f"data_plane={backend(k).option}" for k in legal)
        raise ValueError(
            f"{_KEY}.enabled=true needs {options}: rollout actors and the trainer exchange "
            f"samples through the store; this config has data_plane {kind!r}. Set "
            f"{options} or {_KEY}.enabled=false."
        )
    ds = cfg_get(cfg_get(master_config, "algorithm", None), "dynamic_sampling", None)
    if ds is not None and bool(cfg_get(ds, "enabled", None)):
        raise ValueError(
            f"{_KEY}.enabled=true does not support algorithm.dynamic_sampling.enabled=true "
            "(a streamed batch is trained as generated); disable one of them"
        )
    return True


def coerce_async_rollout_config(node: Any) -> AsyncRolloutConfig:
    """``algorithm.async_rollout`` (``None`` = defaults) as a validated dataclass (``ValueError`` naming a bad key)."""
    if isinstance(node, AsyncRolloutConfig):
        return node
    if node is None:
        return AsyncRolloutConfig()
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)
    values = dict(node)
    known = set(AsyncRolloutConfig.__dataclass_fields__)
    unknown = sorted(k for k in values if k not in known)
    if unknown:
        raise ValueError(f"{_KEY}.{unknown[0]}: unknown key; legal keys: {sorted(known)}")
    return AsyncRolloutConfig(**values)
