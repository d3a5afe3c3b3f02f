"""The Ray object-store data plane: bulk columns in Ray's object store, metadata in one actor.

Why this package exists: TransferQueue stores and ships one tensor per row per field, so its
cost grows with rows; this backend stores each tensor column of a put once, in one object in
Ray's object store per put (dense columns as one buffer, jagged columns as one
``values``/``offsets`` pair), and keeps only metadata (partitions, rows, per-task claims, tags, chunk refs) in one
small named actor.  A put or a read is one actor round trip plus object-store traffic for the
columns it touches; on one node reads map the shared-memory buffers and copy only their rows.
A small put (tensor columns up to ``client.INLINE_MAX_BYTES``) skips the object store: its
columns ride in the actor call and come back in the read's reply, so it costs one round trip.
It serves the same contract (write-back included) as the TransferQueue adapter.

Modules, one job each: ``client`` (``RayStoreClient``: puts, reads, claims over the actor),
``actor`` (the metadata actor and its lifetime), ``state`` (the metadata itself, plain Python;
``state_snapshot`` its checkpoint half),
``columns`` (column payloads and row gathers), ``validation`` (caller-side checks) and
``checkpoint`` (typed, pickle-free checkpoints saved by the bootstrapping client).

Ray is imported inside functions only. The package's names load on first use: the metadata
actor's process imports ``actor`` and ``state`` only, without torch or tensordict.  Objects are
owned by the process that put them and stay readable while it lives (inline columns live in the
actor; see ``client``).
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
