"""The Ray object-store data plane: bulk columns in Ray's object store, metadata in one actor.

Names load on first use; the actor's process imports ``actor`` and ``state`` only, without torch or tensordict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_dp.utils.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_dp.data_plane.adapters.ray_store.actor import ACTOR_NAME, ACTOR_NAMESPACE, actor_exists
    from nemo_dp.data_plane.adapters.ray_store.checkpoint import CHECKPOINT_FORMAT, CHECKPOINT_VERSION
    from nemo_dp.data_plane.adapters.ray_store.client import RayStoreClient, build_ray_store_client

_MODULES: dict[str, tuple[str, ...]] = {
    "actor": ("ACTOR_NAME", "ACTOR_NAMESPACE", "actor_exists"),
    "checkpoint": ("CHECKPOINT_FORMAT", "CHECKPOINT_VERSION"),
    "client": ("RayStoreClient", "build_ray_store_client"),
}
_EXPORTS = {name: f"{__name__}.{module}" for module, names in _MODULES.items() for name in names}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
