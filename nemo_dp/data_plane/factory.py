"""Turn a ``data_plane`` config into its dataclass, its environment knobs and its client (no fallback).

``select_sync_trainer`` and ``make_policy_factory`` are lazily re-exported from :mod:`nemo_dp.algorithms.selection`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nemo_dp.data_plane import registry
from nemo_dp.data_plane.interfaces import (
    DataPlaneClient,
    DataPlaneConfig,
    DisabledDataPlaneConfig,
    LocalDataPlaneConfig,
)
from nemo_dp.utils.config_access import cfg_get

__all__ = [
    "data_plane_enabled",
    "data_plane_kind",
    "coerce_data_plane_config",
    "build_data_plane_client",
    "data_plane_supports_checkpointing",
    "maybe_configure_data_plane_env",
    "select_sync_trainer",
    "make_policy_factory",
]

DISABLED = registry.DISABLED

_SELECTION_NAMES = ("select_sync_trainer", "make_policy_factory")


def __getattr__(name: str) -> Any:
    if name in _SELECTION_NAMES:
        from nemo_dp.algorithms import selection

        return getattr(selection, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_ABSENT = object()


def _get(node: Any, key: str) -> Any:
    """``node.key`` or ``_ABSENT``; a ``???`` value raises."""
    return cfg_get(node, key, _ABSENT, where="data_plane", strict=True)


def data_plane_kind(cfg: Any) -> str:
    """The backend kind of a ``data_plane`` config (``None``, dataclass, ``DictConfig``, mapping), not fully validated.

    Raises:
        ValueError: Enabled with an unknown or missing ``impl`` (``"unknown data_plane impl"``).
        TypeError: ``cfg`` is of an unsupported type, or ``enabled`` is not a bool.
    """
    if not data_plane_enabled(cfg):
        return DISABLED
    impl = _get(cfg, "impl")
    impl = None if impl is _ABSENT else impl
    if impl not in registry.enabled_kinds():
        raise ValueError(
            f"unknown data_plane impl: {impl!r} (data_plane.impl; legal: {sorted(registry.enabled_kinds())})"
        )
    return str(impl)


def data_plane_enabled(cfg: Any) -> bool:
    """Whether a ``data_plane`` config (any form) has ``enabled`` true; ``TypeError`` if it is not a bool."""
    if cfg is None or type(cfg) is DisabledDataPlaneConfig:
        return False
    enabled = _get(cfg, "enabled")
    if enabled is _ABSENT or enabled is None:
        return False
    if not isinstance(enabled, bool):
        raise TypeError(f"data_plane.enabled must be a bool, got {enabled!r}")
    return enabled


def _convert_mapping(cfg: Mapping, schema: type) -> Any:
    container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), container)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        where = f"data_plane.{key}" if key else "data_plane"
        message = (getattr(exc, "msg", None) or str(exc)).splitlines()[0]
        raise ValueError(f"invalid {where}: {message}") from exc


def coerce_data_plane_config(cfg: Any) -> DataPlaneConfig | LocalDataPlaneConfig | DisabledDataPlaneConfig:
    """The validated config dataclass of any accepted ``data_plane`` form (a dataclass is returned as is).

    Raises:
        ValueError: Unknown ``impl``, or a key is unknown, missing or invalid (names ``data_plane.<key>``).
        TypeError: ``cfg`` is of an unsupported type.
    """
    if type(cfg) in registry.schema_types():
        return cfg
    if cfg is not None and not isinstance(cfg, Mapping):
        raise TypeError(
            "data_plane config must be None, a mapping, a DictConfig or one of DataPlaneConfig / "
            f"LocalDataPlaneConfig / DisabledDataPlaneConfig, got {type(cfg).__name__}"
        )
    kind = data_plane_kind(cfg)
    if kind == DISABLED:
        return DisabledDataPlaneConfig()
    assert cfg is not None
    return _convert_mapping(cfg, registry.backend(kind).schema)


def data_plane_supports_checkpointing(cfg: Any) -> bool:
    """Whether the configured backend can save and load data-plane checkpoints (``False`` when disabled)."""
    dp_cfg = coerce_data_plane_config(cfg)
    if not dp_cfg.enabled:
        return False
    return bool(registry.backend_for_config(dp_cfg).supports_checkpointing(dp_cfg))


def maybe_configure_data_plane_env(cfg: Any) -> dict[str, str]:
    """Export the backend's environment knobs (driver, before ``ray.init``); return them (``{}``: none).

    Raises:
        ValueError: Unknown ``impl`` or invalid config.
        RuntimeError: A knob is missing and ``transfer_queue`` is already imported.
    """
    dp_cfg = coerce_data_plane_config(cfg)
    if not dp_cfg.enabled:
        return {}
    configure = registry.backend_for_config(dp_cfg).configure_env
    return {} if configure is None else dict(configure(dp_cfg))


def build_data_plane_client(cfg: Any, *, bootstrap: bool = True, checkpointing: bool = False) -> DataPlaneClient:
    """Build the client a config asks for, wrapped in ``MetricsDataPlaneClient`` when ``observability.enabled``.

    ``bootstrap`` creates a cluster-wide backend (driver) or attaches to it (workers).

    Raises:
        ValueError: The data plane is disabled, ``impl`` is unknown, the config is invalid, or
            ``checkpointing`` is asked of a backend without it.
    """
    if not data_plane_enabled(cfg):
        raise ValueError(
            "build_data_plane_client: the data plane is disabled (data_plane is None or "
            "enabled: false), so there is no client to build. Use the legacy trainer, which "
            "never engages the data plane (select_sync_trainer picks it for this config)."
        )
    dp_cfg = coerce_data_plane_config(cfg)
    spec = registry.backend_for_config(dp_cfg)
    if checkpointing and not spec.supports_checkpointing(dp_cfg):
        raise ValueError(
            f"data_plane={spec.option} ({spec.describe(dp_cfg)}) does not support data-plane "
            "checkpoints (checkpointing=True)"
        )
    if spec.configure_env is not None:
        spec.configure_env(dp_cfg)  # knobs before the backend library is imported
    client: DataPlaneClient = spec.client()(dp_cfg, bootstrap=bootstrap, checkpointing=checkpointing)
    if dp_cfg.observability.enabled:
        from nemo_dp.data_plane.observability import MetricsDataPlaneClient, log_event

        sink = log_event if dp_cfg.observability.log_events else None
        return MetricsDataPlaneClient(client, on_event=sink)
    return client
