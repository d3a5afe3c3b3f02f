"""The one table of data-plane backends (:class:`BackendSpec`), each registered here exactly once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from nemo_dp.data_plane.interfaces import (
    DataPlaneConfig,
    DisabledDataPlaneConfig,
    LocalDataPlaneConfig,
)
from nemo_dp.data_plane.ray_store_config import RAY_STORE_KIND, RayStoreDataPlaneConfig
from nemo_dp.utils.imports import resolve_target

__all__ = [
    "CheckpointScope",
    "BackendSpec",
    "BACKENDS",
    "DISABLED",
    "backend",
    "backend_for_config",
    "backend_for_option",
    "cross_process_options",
    "enabled_kinds",
    "register_backend",
    "ray_start_args",
    "reserved_ray_cpus",
    "ray_cpu_reservation",
    "schema_types",
]

#: ``"none"``: no data-plane checkpoint; ``"process"``: every process saves its own store;
#: ``"cluster"``: one store shared by the cluster, saved once by the client that created it.
CheckpointScope = Literal["none", "process", "cluster"]

#: Kind of the disabled backend (legacy trainers, no store).
DISABLED = "disabled"


@dataclass(frozen=True)
class BackendSpec:
    """Everything the rest of the tree may know about one backend; the callables take the validated config.

    Attributes:
        kind: Internal kind, equal to the config's ``impl`` value (``"disabled"`` for none).
        option: The Hydra option of group ``data_plane`` that selects it (``data_plane=tq``).
        client_target: ``"module:attr"`` of ``(cfg, *, bootstrap, checkpointing) -> DataPlaneClient``,
            resolved only when used; ``None`` for the disabled backend.
        checkpoint_subdir: Where a cluster-wide store is saved in the training checkpoint (``None``:
            per-process stores save under ``dp{rank}``).
        reserved_cpus: Logical Ray CPUs the backend's own actors reserve; ``reserved_by`` names
            those actors and config keys (for Ray start-up's budget error).
        max_live_batches: Live partitions a colocated loader may hold (``None``: no bound of the store's own).
        configure_env: Exports environment knobs before Ray and the backend start (``None``: none).
    """

    kind: str
    option: str
    schema: type
    client_target: str | None
    checkpoint_scope: CheckpointScope = "none"
    checkpoint_subdir: str | None = None
    cross_process: bool = False
    supports_checkpointing: Callable[[Any], bool] = field(default=lambda cfg: False)
    reserved_cpus: Callable[[Any], int] = field(default=lambda cfg: 0)
    reserved_by: Callable[[Any], str] = field(default=lambda cfg: "no data-plane actors")
    max_live_batches: Callable[[Any], int | None] = field(default=lambda cfg: None)
    configure_env: Callable[[Any], dict[str, str]] | None = None
    describe: Callable[[Any], str] = field(default=lambda cfg: "")

    @property
    def enabled(self) -> bool:
        """Whether this backend has a store (all but ``disabled``)."""
        return self.client_target is not None

    def client(self) -> Callable[..., Any]:
        """Import the client constructor; ``ValueError`` when disabled, ``ImportError`` naming a bad target."""
        if self.client_target is None:
            raise ValueError(f"data_plane={self.option}: this backend has no client")
        return resolve_target(self.client_target, f"the client constructor of backend {self.kind!r}")


def _tq_configure_env(cfg: DataPlaneConfig) -> dict[str, str]:
    from nemo_dp.data_plane.adapters.transfer_queue_env import configure_engine_env

    return configure_engine_env(cfg)


#: Live batches a colocated loader keeps in TransferQueue or the Ray object-store backend (active +
#: one prefetched); those stores have no partition bound of their own.
LOADER_LIVE_BATCHES = 2


BACKENDS: dict[str, BackendSpec] = {}


def register_backend(spec: BackendSpec) -> BackendSpec:
    """Add ``spec`` to :data:`BACKENDS` and return it; ``ValueError`` if its kind, option or schema is taken."""
    for other in BACKENDS.values():
        if spec.kind == other.kind or spec.option == other.option or spec.schema is other.schema:
            raise ValueError(
                f"backend {spec.kind!r} (data_plane={spec.option}) clashes with the registered backend "
                f"{other.kind!r} (data_plane={other.option}): kind, option and schema must be unique"
            )
    BACKENDS[spec.kind] = spec
    return spec


for _spec in (
    BackendSpec(
        kind=DISABLED, option="disabled", schema=DisabledDataPlaneConfig, client_target=None,
        describe=lambda cfg: "none (data plane disabled)",
    ),
    BackendSpec(
        kind="local", option="local", schema=LocalDataPlaneConfig,
        client_target="nemo_dp.data_plane.adapters.local:build_local_client",
        checkpoint_scope="process", cross_process=False, supports_checkpointing=lambda cfg: True,
        max_live_batches=lambda cfg: int(cfg.max_partitions),
        describe=lambda cfg: "local (process-local store)",
    ),
    BackendSpec(
        kind="transfer_queue", option="tq", schema=DataPlaneConfig,
        client_target="nemo_dp.data_plane.adapters.transfer_queue:TQDataPlaneClient",
        checkpoint_scope="cluster", checkpoint_subdir="tq", cross_process=True,
        supports_checkpointing=lambda cfg: cfg.backend == "simple",
        # The controller and every storage unit are Ray actors reserving one logical CPU each.
        reserved_cpus=lambda cfg: 1 + int(cfg.simple.num_storage_units),
        reserved_by=lambda cfg: (
            "the TransferQueue controller and each of data_plane.simple.num_storage_units="
            f"{int(cfg.simple.num_storage_units)} storage units reserve 1 logical CPU"
        ),
        max_live_batches=lambda cfg: LOADER_LIVE_BATCHES,
        configure_env=_tq_configure_env,
        describe=lambda cfg: f"transfer_queue (backend: {cfg.backend})",
    ),
    BackendSpec(
        kind=RAY_STORE_KIND, option="ray", schema=RayStoreDataPlaneConfig,
        client_target="nemo_dp.data_plane.adapters.ray_store:build_ray_store_client",
        checkpoint_scope="cluster", checkpoint_subdir="ray_store", cross_process=True,
        supports_checkpointing=lambda cfg: True,
        # The metadata actor asks for num_cpus=0; the columns live in Ray's object store.
        reserved_by=lambda cfg: "the ray_store metadata actor reserves 0 logical CPUs",
        max_live_batches=lambda cfg: LOADER_LIVE_BATCHES,
        describe=lambda cfg: "ray_store (Ray object store + metadata actor)",
    ),
):
    register_backend(_spec)


def backend(kind: str) -> BackendSpec:
    """The backend registered under ``kind``; ``ValueError`` (listing the kinds) if none."""
    spec = BACKENDS.get(kind)
    if spec is None:
        raise ValueError(f"unknown data-plane backend kind {kind!r}; registered: {sorted(BACKENDS)}")
    return spec


def backend_for_option(option: str) -> BackendSpec:
    """The backend selected by ``data_plane=<option>``; ``ValueError`` (listing the options) if none."""
    for spec in BACKENDS.values():
        if spec.option == option:
            return spec
    legal = sorted(spec.option for spec in BACKENDS.values())
    raise ValueError(f"unknown data_plane option {option!r}; legal: {legal}")


def backend_for_config(cfg: Any) -> BackendSpec:
    """The backend whose schema ``cfg`` (a config dataclass) is; ``TypeError`` if none."""
    for spec in BACKENDS.values():
        if type(cfg) is spec.schema:
            return spec
    raise TypeError(
        f"{type(cfg).__name__} is not a registered data-plane schema ({[s.schema.__name__ for s in BACKENDS.values()]})"
    )


def schema_types() -> tuple[type, ...]:
    return tuple(spec.schema for spec in BACKENDS.values())


def enabled_kinds() -> tuple[str, ...]:
    """Kinds of the backends that have a store (the legal ``impl`` values)."""
    return tuple(kind for kind, spec in BACKENDS.items() if spec.enabled)


def cross_process_options() -> str:
    """E.g. ``"data_plane=tq or data_plane=ray"``: the options whose store carries rows between processes."""
    return " or ".join(f"data_plane={s.option}" for s in BACKENDS.values() if s.cross_process)


def ray_cpu_reservation(data_plane_cfg: Any) -> tuple[int, str]:
    """``(reserved_cpus, reserved_by)`` of the backend's own actors for a config in any accepted form.

    Exports nothing (unlike :func:`ray_start_args`), so preflight can call it.

    Raises:
        ValueError: The config is invalid (names the key).
    """
    from nemo_dp.data_plane.factory import coerce_data_plane_config

    dp_cfg = coerce_data_plane_config(data_plane_cfg)
    if not getattr(dp_cfg, "enabled", False):
        return 0, "no data-plane actors"
    spec = backend_for_config(dp_cfg)
    return int(spec.reserved_cpus(dp_cfg)), spec.reserved_by(dp_cfg)


def reserved_ray_cpus(data_plane_cfg: Any) -> int:
    """Like :func:`ray_cpu_reservation`, but only the CPU count (0 when disabled)."""
    return ray_cpu_reservation(data_plane_cfg)[0]


def ray_start_args(data_plane_cfg: Any) -> dict[str, Any]:
    """Export the backend's environment knobs; return ``init_ray`` / ``ray_session`` keyword arguments.

    ``{"reserved_cpus": int, "reserved_by": str, "worker_env": dict[str, str]}``: plain values, so
    the distributed layer never imports the data plane.

    Raises:
        ValueError: The config is invalid (names the key).
        RuntimeError: A knob is missing while the backend library is already imported.
    """
    from nemo_dp.data_plane.factory import coerce_data_plane_config, maybe_configure_data_plane_env

    dp_cfg = coerce_data_plane_config(data_plane_cfg)
    reserved, reserved_by = ray_cpu_reservation(dp_cfg)
    return {
        "reserved_cpus": reserved,
        "reserved_by": reserved_by,
        "worker_env": dict(maybe_configure_data_plane_env(dp_cfg)),
    }
