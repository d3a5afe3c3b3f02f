"""Turn a ``data_plane`` config into its dataclass, its environment knobs and its client.

Backend decisions come from the registry (``nemo_dp.data_plane.registry``); there is no no-op
client and no fallback.  ``select_sync_trainer`` and ``make_policy_factory`` are re-exported
from :mod:`nemo_dp.algorithms.selection` (imported on first use).
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

#: Names of the data-plane API that nemo_dp.algorithms.selection defines.
_SELECTION_NAMES = ("select_sync_trainer", "make_policy_factory")


def __getattr__(name: str) -> Any:
    if name in _SELECTION_NAMES:
        from nemo_dp.algorithms import selection

        return getattr(selection, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_ABSENT = object()


def _get(node: Any, key: str) -> Any:
    """``node.key`` of a ``data_plane`` node or ``_ABSENT``; a ``???`` value raises instead."""
    return cfg_get(node, key, _ABSENT, where="data_plane", strict=True)


def data_plane_kind(cfg: Any) -> str:
    """Classify a ``data_plane`` config without fully validating it.

    Args:
        cfg: ``None``, a config dataclass, a ``DictConfig`` or a plain mapping.

    Returns:
        ``"disabled"`` (``None``, ``enabled`` false or absent), ``"local"`` or
        ``"transfer_queue"``.

    Raises:
        ValueError: Enabled with an unknown or missing ``impl`` (``"unknown data_plane impl"``).
        TypeError: ``cfg`` is of an unsupported type, or ``enabled`` is not a bool.
    """
    if not data_plane_enabled(cfg):
        return DISABLED
    impl = _get(cfg, "impl")
    if impl is _ABSENT:
        impl = None
    if impl not in registry.enabled_kinds():
        raise ValueError(
            f"unknown data_plane impl: {impl!r} (data_plane.impl; legal: "
            f"{sorted(registry.enabled_kinds())})"
        )
    return str(impl)


def data_plane_enabled(cfg: Any) -> bool:
    """Whether a ``data_plane`` config (in any form of :func:`data_plane_kind`) asks for a data plane.

    ``False`` for ``None`` or ``enabled`` false/absent.
    """
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
    """Turn any accepted ``data_plane`` form into its config dataclass (a dataclass is returned as is).

    Returns ``DisabledDataPlaneConfig()`` for a disabled ``None`` or mapping; otherwise the
    dataclass selected by ``impl``, validated by its schema.

    Raises:
        ValueError: Unknown ``impl`` (``"unknown data_plane impl: ..."``), or a key is unknown,
            missing or invalid (the message names ``data_plane.<key>``).
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


# --- clients and environment ---


def data_plane_supports_checkpointing(cfg: Any) -> bool:
    """Whether the configured backend can save and load data-plane checkpoints.

    ``True`` for ``impl: local`` and for ``impl: transfer_queue`` with ``backend: simple``;
    ``False`` when disabled.
    """
    dp_cfg = coerce_data_plane_config(cfg)
    if not dp_cfg.enabled:
        return False
    return bool(registry.backend_for_config(dp_cfg).supports_checkpointing(dp_cfg))


def maybe_configure_data_plane_env(cfg: Any) -> dict[str, str]:
    """Export the backend's environment knobs before Ray and the backend start.

    Call on the driver before ``ray.init`` and pass the result to
    ``ray.init(runtime_env={"env_vars": ...})``.  Returns ``{}`` for a disabled or local data plane
    (environment untouched); for TransferQueue the effective values of all ``TQ_*`` knobs.

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
    """Build the data-plane client a config asks for.

    Args:
        bootstrap: TransferQueue only: create the backend (driver) or attach to it (workers).
        checkpointing: TransferQueue only: require checkpoint support.

    Returns:
        A ``LocalDataPlaneClient`` or ``TQDataPlaneClient``, wrapped in
        ``MetricsDataPlaneClient`` when ``observability.enabled``.

    Raises:
        ValueError: The data plane is disabled (use the legacy trainer), ``impl`` is unknown,
            the config is invalid, or ``checkpointing`` is asked of a backend without it.
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
    client: DataPlaneClient = spec.client()(
        dp_cfg, bootstrap=bootstrap, checkpointing=checkpointing
    )
    if dp_cfg.observability.enabled:
        from nemo_dp.data_plane.observability import MetricsDataPlaneClient, log_event

        sink = log_event if dp_cfg.observability.log_events else None
        return MetricsDataPlaneClient(client, on_event=sink)
    return client
