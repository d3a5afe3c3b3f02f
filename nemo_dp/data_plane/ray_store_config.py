"""Config schema of the Ray object-store data plane (``data_plane=ray``), loadable without Ray or torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nemo_dp.data_plane.interfaces import ObservabilityConfig, coerce_nodes
from nemo_dp.utils.config_checks import fail

__all__ = ["RAY_STORE_KIND", "RayStoreTimeoutsConfig", "RayStoreDataPlaneConfig"]

#: ``data_plane.impl`` of this backend (its registry kind).
RAY_STORE_KIND = "ray_store"


def _require_positive(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        fail(key, f"must be a number > 0, got {value!r}")


@dataclass
class RayStoreTimeoutsConfig:
    """``data_plane.timeouts``: bounds that turn a dead metadata actor or lost object into errors.

    Attributes:
        actor_s: Bound of every call to the metadata actor (register, claim, locate, clear).
        data_s: Bound of fetching a read's column objects from Ray's object store.
        startup_s: Bound of creating (driver) or finding (workers) the metadata actor.
    """

    actor_s: float = 15.0
    data_s: float = 60.0
    startup_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("actor_s", "data_s", "startup_s"):
            _require_positive(f"data_plane.timeouts.{name}", getattr(self, name))


@dataclass
class RayStoreDataPlaneConfig:
    """``data_plane`` for the Ray object-store backend; ``claim_meta_poll_interval_s`` is a blocking claim's sleep."""

    enabled: bool = True
    impl: str = RAY_STORE_KIND
    claim_meta_poll_interval_s: float = 0.02
    timeouts: RayStoreTimeoutsConfig = field(default_factory=RayStoreTimeoutsConfig)
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)

    def __post_init__(self) -> None:
        if self.enabled is not True:
            fail("data_plane.enabled", f"must be true for data_plane=ray, got {self.enabled!r}")
        if self.impl != RAY_STORE_KIND:
            fail("data_plane.impl", f"must be {RAY_STORE_KIND!r} for this schema, got {self.impl!r}")
        _require_positive("data_plane.claim_meta_poll_interval_s", self.claim_meta_poll_interval_s)
        coerce_nodes(self, timeouts=RayStoreTimeoutsConfig, observability=ObservabilityConfig)
