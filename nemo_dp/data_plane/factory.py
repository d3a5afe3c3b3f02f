"""The one place that turns a ``data_plane`` config into a client, a trainer and a policy factory.

Launchers never branch on the data plane themselves: they call :func:`select_sync_trainer` and
:func:`make_policy_factory` with the same config, so the trainer and the policy class cannot
drift apart, and they build clients only through :func:`build_data_plane_client`.

Every backend-specific decision comes from the backend registry
(``nemo_dp.data_plane.registry``) and every algorithm-specific one from the algorithm registry
(``nemo_dp.config.algorithm_registry``); this module compares no kind strings of its own.  The
algorithm table sits in a higher layer, so it is resolved from a ``"module:attr"`` string on
first use, exactly like the trainers it names; importing this module loads neither it, nor an
adapter, nor Ray or TransferQueue.  There is no no-op client and no fallback: a disabled config
never yields a client.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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

__all__ = [
    "DATA_PLANE_KINDS",
    "TRAINER_REGISTRY",
    "POLICY_CLASS_PATH",
    "TrainerSelection",
    "TrainerNotAvailableError",
    "data_plane_enabled",
    "data_plane_kind",
    "coerce_data_plane_config",
    "build_data_plane_client",
    "data_plane_supports_checkpointing",
    "maybe_configure_data_plane_env",
    "validate_trainer_selection",
    "select_sync_trainer",
    "describe_selection",
    "make_policy_factory",
]

DISABLED = registry.DISABLED

#: Data-plane kinds a trainer can be registered for ("disabled" = legacy trainer).
DATA_PLANE_KINDS: tuple[str, ...] = tuple(registry.BACKENDS)

#: Where the algorithm table lives (a higher layer, so resolved on first use, never imported here
#: at module level).
_ALGORITHMS_TARGET = "nemo_dp.config.algorithm_registry:ALGORITHMS"

#: The data-plane policy class built by :func:`make_policy_factory`.
POLICY_CLASS_PATH = "nemo_dp.models.policy.tq_policy:TQPolicy"

# (algorithm, kind) -> "module:function", built from the algorithm registry on first use and
# rebuilt only when an algorithm is registered later (tests may patch entries of this dict).
_TRAINER_TABLE: dict[tuple[str, str], str] = {}
_TRAINER_TABLE_KEY: tuple[Any, ...] | None = None


def _algorithms() -> Mapping[str, Any]:
    module_name, _, attr = _ALGORITHMS_TARGET.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _trainer_table() -> dict[tuple[str, str], str]:
    global _TRAINER_TABLE_KEY
    algorithms = _algorithms()
    key = tuple(id(spec) for spec in algorithms.values())
    if key != _TRAINER_TABLE_KEY:
        _TRAINER_TABLE.clear()
        _TRAINER_TABLE.update(
            {
                (name, kind): target
                for name, spec in algorithms.items()
                for kind, target in spec.trainers.items()
            }
        )
        _TRAINER_TABLE_KEY = key
    return _TRAINER_TABLE


def __getattr__(name: str) -> Any:
    # ``TRAINER_REGISTRY`` is resolved lazily so that importing the factory never imports a
    # higher layer; it is the same dict the selection functions read.
    if name == "TRAINER_REGISTRY":
        return _trainer_table()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TrainerNotAvailableError(ImportError):
    """A legal (algorithm, data plane) pair whose trainer module or function does not exist."""


@dataclass(frozen=True)
class TrainerSelection:
    """The resolved trainer choice for one config (nothing imported yet).

    Attributes:
        algorithm: ``algorithm`` name (``sft``, ``grpo``, ``ppo``).
        data_plane: Data-plane kind (``disabled``, ``local``, ``transfer_queue``).
        target: ``"module:function"`` of the trainer.
        label: Label for the progress line.
    """

    algorithm: str
    data_plane: str
    target: str
    label: str
    mode: str = "synchronous"

    @property
    def progress_line(self) -> str:
        """The single line :func:`select_sync_trainer` prints."""
        if not registry.backend(self.data_plane).enabled:
            return f"Running {self.mode} {self.label} training (legacy)"
        return f"Running {self.mode} {self.label} training (data plane: {self.data_plane})"


# ---------------------------------------------------------------------------------------------
# config access
# ---------------------------------------------------------------------------------------------

_ABSENT = object()


def _get(node: Any, key: str, full_key: str) -> Any:
    """``node[key]`` / ``node.key`` or ``_ABSENT``; a ``???`` value raises instead of hiding."""
    if isinstance(node, DictConfig):
        if key in node.keys() and OmegaConf.is_missing(node, key):
            raise ValueError(f"{full_key} is a mandatory value that was not set (???)")
        return node[key] if key in node else _ABSENT
    if isinstance(node, Mapping):
        return node[key] if key in node else _ABSENT
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return getattr(node, key) if hasattr(node, key) else _ABSENT
    raise TypeError(
        f"{full_key.rsplit('.', 1)[0] or full_key}: expected a mapping, DictConfig or config "
        f"dataclass, got {type(node).__name__}"
    )


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
    if cfg is None or type(cfg) is DisabledDataPlaneConfig:
        return DISABLED
    enabled = _get(cfg, "enabled", "data_plane.enabled")
    if enabled is _ABSENT or enabled is None:
        return DISABLED
    if not isinstance(enabled, bool):
        raise TypeError(f"data_plane.enabled must be a bool, got {enabled!r}")
    if not enabled:
        return DISABLED
    impl = _get(cfg, "impl", "data_plane.impl")
    if impl is _ABSENT:
        impl = None
    if impl not in registry.enabled_kinds():
        raise ValueError(
            f"unknown data_plane impl: {impl!r} (data_plane.impl; legal: "
            f"{sorted(registry.enabled_kinds())})"
        )
    return str(impl)


def data_plane_enabled(cfg: Any) -> bool:
    """Whether a ``data_plane`` config asks for a data plane.

    Args:
        cfg: ``None``, a config dataclass, a ``DictConfig`` or a plain mapping.

    Returns:
        ``False`` for ``None`` or ``enabled`` false/absent; ``True`` otherwise.
    """
    if cfg is None or type(cfg) is DisabledDataPlaneConfig:
        return False
    enabled = _get(cfg, "enabled", "data_plane.enabled")
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


def coerce_data_plane_config(
    cfg: Any,
) -> DataPlaneConfig | LocalDataPlaneConfig | DisabledDataPlaneConfig:
    """Turn any accepted ``data_plane`` form into its config dataclass.

    Args:
        cfg: ``None``, a config dataclass (returned as is), a ``DictConfig`` or a mapping.

    Returns:
        ``DisabledDataPlaneConfig()`` for a disabled config given as ``None`` or a mapping;
        otherwise the dataclass selected by ``impl``, validated by its schema.

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


# ---------------------------------------------------------------------------------------------
# clients and environment
# ---------------------------------------------------------------------------------------------


def data_plane_supports_checkpointing(cfg: Any) -> bool:
    """Whether the configured backend can save and load data-plane checkpoints.

    Args:
        cfg: Any accepted ``data_plane`` form.

    Returns:
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
    ``ray.init(runtime_env={"env_vars": ...})``.

    Args:
        cfg: Any accepted ``data_plane`` form.

    Returns:
        ``{}`` for a disabled or local data plane (environment untouched); for TransferQueue the
        effective values of all ``TQ_*`` knobs.

    Raises:
        ValueError: Unknown ``impl`` or invalid config.
        RuntimeError: A knob is missing and ``transfer_queue`` is already imported.
    """
    dp_cfg = coerce_data_plane_config(cfg)
    if not dp_cfg.enabled:
        return {}
    configure = registry.backend_for_config(dp_cfg).configure_env
    return {} if configure is None else dict(configure(dp_cfg))


def build_data_plane_client(
    cfg: Any, *, bootstrap: bool = True, checkpointing: bool = False
) -> DataPlaneClient:
    """Build the data-plane client a config asks for.

    Args:
        cfg: Any accepted ``data_plane`` form.
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


# ---------------------------------------------------------------------------------------------
# trainer and policy selection
# ---------------------------------------------------------------------------------------------


#: The algorithm of a config without an ``algorithm`` node: the reference factory reads only
#: ``data_plane`` and always selects GRPO (label "GRPO"), so such configs keep working here.
DEFAULT_ALGORITHM = "grpo"


def _algorithm_name(master_config: Any) -> str:
    algorithm = _get(master_config, "algorithm", "algorithm")
    if algorithm is _ABSENT or algorithm is None:
        return DEFAULT_ALGORITHM
    if not isinstance(algorithm, str):
        algorithm = _get(algorithm, "name", "algorithm.name")
        if algorithm is _ABSENT:
            raise ValueError("algorithm.name is missing from the config")
    if not isinstance(algorithm, str) or not algorithm:
        raise ValueError(f"algorithm.name must be a non-empty string, got {algorithm!r}")
    return algorithm


def _master_data_plane(master_config: Any) -> Any:
    dp = _get(master_config, "data_plane", "data_plane")
    return None if dp is _ABSENT else dp


def _legal_data_planes(algorithm: str) -> list[str]:
    table = _trainer_table()
    return [kind for kind in DATA_PLANE_KINDS if (algorithm, kind) in table]


def _illegal_reason(spec: Any, kind: str) -> str | None:
    """Why ``spec`` cannot run on backend ``kind``, derived from the backend's capabilities."""
    backend = registry.backend(kind)
    needs_transport = spec is not None and spec.requires_cross_process
    if needs_transport and backend.enabled and not backend.cross_process:
        return "a process-local store cannot carry rollout data between processes"
    return None


def validate_trainer_selection(master_config: Any, *, label: str | None = None) -> TrainerSelection:
    """Resolve (algorithm, data plane) to a registered trainer without importing it.

    The launcher calls this at compose time, before any process starts; :func:`select_sync_trainer`
    uses the same lookup.

    Args:
        master_config: Root config (``DictConfig``, dataclass or mapping) with an optional
            ``algorithm`` (a name or a node with ``name``; absent = ``"grpo"``, as in the
            reference) and an optional ``data_plane`` entry.
        label: Progress-line label; defaults to the algorithm name upper-cased.

    Returns:
        The selection.

    Raises:
        ValueError: Unknown algorithm, unknown ``data_plane.impl``, or an illegal pair (naming
            ``algorithm`` and ``data_plane`` and listing the legal data planes).
    """
    algorithm = _algorithm_name(master_config)
    kind = data_plane_kind(_master_data_plane(master_config))
    legal = _legal_data_planes(algorithm)
    if not legal:
        known = sorted({alg for alg, _ in _trainer_table()})
        raise ValueError(
            f"unknown algorithm {algorithm!r} (algorithm.name); known algorithms: {known}"
        )
    spec = _algorithms().get(algorithm)
    if label is None and spec is not None:
        label = spec.display_label
    # A mode switched on (e.g. asynchronous GRPO) decides the trainer, and its own error names
    # its switch, before the algorithm's default trainer table is consulted.
    mode_name, target = "synchronous", None
    for mode in spec.modes if spec is not None else ():
        if not _import_target(mode.selector, f"the {mode.name} mode selector of {algorithm!r}")(
            master_config
        ):
            continue
        target = mode.trainers.get(kind)
        if target is None:
            choices = ", ".join(
                f"{k} (data_plane={registry.backend(k).option})" for k in mode.trainers
            )
            raise ValueError(
                f"{mode.switch_key}=true cannot run with data_plane={kind!r}. Legal data planes "
                f"for {mode.name} {algorithm!r}: {choices}; or set {mode.switch_key}=false."
            )
        mode_name = mode.name
        break
    if target is None:
        target = _trainer_table().get((algorithm, kind))
    if target is None:
        reason = _illegal_reason(spec, kind)
        choices = ", ".join(f"{k} (data_plane={registry.backend(k).option})" for k in legal)
        raise ValueError(
            f"algorithm={algorithm!r} cannot run with data_plane={kind!r}"
            + (f": {reason}" if reason else "")
            + f". Legal data planes for algorithm {algorithm!r}: {choices}."
        )
    return TrainerSelection(
        algorithm=algorithm,
        data_plane=kind,
        target=target,
        label=label if label is not None else algorithm.upper(),
        mode=mode_name,
    )


def _import_target(target: str, what: str) -> Any:
    module_name, _, attr = target.partition(":")
    if importlib.util.find_spec(module_name) is None:
        raise TrainerNotAvailableError(
            f"{what} ({target}) is not available: module {module_name!r} does not exist"
        )
    module = importlib.import_module(module_name)
    if not hasattr(module, attr):
        raise TrainerNotAvailableError(
            f"{what} ({target}) is not available: {module_name!r} has no attribute {attr!r}"
        )
    return getattr(module, attr)


def select_sync_trainer(master_config: Any, *, label: str | None = None) -> Callable[..., Any]:
    """Pick and import the trainer for (algorithm, data plane); print exactly one line.

    Args:
        master_config: Root config with ``algorithm`` and an optional ``data_plane``.
        label: Label for the progress line; defaults to the algorithm name upper-cased.

    Returns:
        The trainer function.

    Raises:
        ValueError: As :func:`validate_trainer_selection`.
        TrainerNotAvailableError: The pair is legal but its trainer module or function is missing.
    """
    selection = validate_trainer_selection(master_config, label=label)
    trainer = _import_target(
        selection.target,
        f"the trainer for algorithm={selection.algorithm!r} with "
        f"data_plane={selection.data_plane!r}",
    )
    print(selection.progress_line, flush=True)
    return trainer


def describe_selection(master_config: Any) -> dict[str, str]:
    """Strings naming the backend, trainer and policy factory a config selects (for logs).

    Args:
        master_config: Root config with ``algorithm`` and an optional ``data_plane``.

    Returns:
        ``{"backend": ..., "trainer": ..., "policy_factory": ...}``.

    Raises:
        ValueError: As :func:`validate_trainer_selection`.
    """
    selection = validate_trainer_selection(master_config)
    spec = registry.backend(selection.data_plane)
    dp_cfg = coerce_data_plane_config(_master_data_plane(master_config))
    backend = spec.describe(dp_cfg)
    policy = POLICY_CLASS_PATH if spec.enabled else "plain policy (no data plane)"
    return {"backend": backend, "trainer": selection.target, "policy_factory": policy}


def make_policy_factory(cfg: Any) -> Callable[..., Any] | None:
    """The policy constructor that matches a ``data_plane`` config.

    Args:
        cfg: Any accepted ``data_plane`` form.

    Returns:
        ``None`` when disabled (build the plain policy); otherwise ``_make_policy(**kwargs)``
        returning ``TQPolicy(**kwargs, dp_cfg=cfg)`` with ``cfg`` passed through unchanged.

    Raises:
        ValueError: Unknown ``impl`` or invalid config (checked now, not at first call).
    """
    if not data_plane_enabled(cfg):
        return None
    coerce_data_plane_config(cfg)  # validate eagerly; the policy gets cfg exactly as given

    def _make_policy(**kwargs: Any) -> Any:
        policy_cls = _import_target(POLICY_CLASS_PATH, "the data-plane policy class")
        return policy_cls(**kwargs, dp_cfg=cfg)

    return _make_policy
