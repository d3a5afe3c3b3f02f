"""The Ray object-store data plane's metadata actor (one per cluster, holding ``StoreState``) and its lifetime.

Created and owned by the driver's bootstrapping client (not detached); ``ray`` is imported inside functions only.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from nemo_dp.data_plane.adapters.ray_store.state import StoreState

_LOG = logging.getLogger("nemo_dp.data_plane.adapters.ray_store")

#: Name and Ray namespace of the metadata actor (one per Ray cluster).
ACTOR_NAME = "nemo_dp_ray_store"
ACTOR_NAMESPACE = "nemo_dp"

_OPS = frozenset("exists is_empty register put locate list_ids claim consumed clear snapshot restore".split())
_REPLIED = (KeyError, ValueError, TypeError, RuntimeError)


class RayStoreActor:
    """Holds the cluster's :class:`StoreState`; every call is one state operation."""

    def __init__(self) -> None:
        self._state = StoreState()

    def ping(self) -> bool:
        return True

    def call(self, op: str, *args: Any) -> tuple[Any, ...]:
        """``(True, StoreState.<op>(*args))``, or ``(False, type name, message)`` for a contract error.

        Errors cross as replies so the client re-raises them with their exact type and message.  The
        actor runs one call at a time: every operation is atomic.
        """
        if op not in _OPS:
            return (False, "ValueError", f"unknown ray_store operation {op!r}")
        try:
            return (True, getattr(self._state, op)(*args))
        except _REPLIED as exc:
            return (False, type(exc).__name__, str(exc.args[0]) if exc.args else str(exc))


def actor_exists() -> bool:
    import ray

    try:
        ray.get_actor(ACTOR_NAME, namespace=ACTOR_NAMESPACE)
    except ValueError:
        return False
    return True


def _wait_ready(handle: Any, timeout_s: float, what: str) -> None:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    try:
        ray.get(handle.ping.remote(), timeout=timeout_s)
    except (GetTimeoutError, RayActorError) as exc:
        raise RuntimeError(
            f"the ray_store metadata actor {ACTOR_NAME!r} did not answer within "
            f"data_plane.timeouts.startup_s={timeout_s:g}s after {what}: {type(exc).__name__}"
        ) from exc


def _require_ray() -> None:
    import ray

    if not ray.is_initialized():
        raise RuntimeError(
            "the ray_store data plane needs a running Ray: call "
            "nemo_dp.distributed.ray_init.init_ray(...) (or ray.init) first"
        )


def create_actor(startup_s: float) -> Any:
    """Create the metadata actor and return its handle.

    Raises:
        RuntimeError: Ray is not running, the actor already exists, or it did not start within ``startup_s``.
    """
    import ray

    _require_ray()
    if actor_exists():
        raise RuntimeError(
            f"a ray_store metadata actor ({ACTOR_NAME!r} in Ray namespace {ACTOR_NAMESPACE!r}) "
            "already exists in this Ray cluster; refusing to attach silently to another run's "
            "store. Close the old bootstrap client or restart Ray."
        )
    cls = ray.remote(RayStoreActor)
    handle = cls.options(
        name=ACTOR_NAME, namespace=ACTOR_NAMESPACE, num_cpus=0, max_restarts=0, max_concurrency=1
    ).remote()
    try:
        _wait_ready(handle, startup_s, "creation")
    except RuntimeError:
        ray.kill(handle, no_restart=True)
        raise
    return handle


def attach_actor(startup_s: float) -> Any:
    """Find the running metadata actor (never creates one) and return its handle.

    Raises:
        RuntimeError: Ray is not running, no actor exists, or it does not answer within ``startup_s``.
    """
    import ray

    _require_ray()
    try:
        handle = ray.get_actor(ACTOR_NAME, namespace=ACTOR_NAMESPACE)
    except ValueError:
        raise RuntimeError(
            f"no ray_store metadata actor ({ACTOR_NAME!r} in Ray namespace "
            f"{ACTOR_NAMESPACE!r}) is running in this Ray cluster; build the driver client "
            "with bootstrap=True first"
        ) from None
    _wait_ready(handle, startup_s, "attach")
    return handle


def kill_actor(handle: Any, wait_s: float) -> None:
    """Kill the metadata actor and return once its name no longer resolves (bounded; logs)."""
    import ray

    try:
        ray.kill(handle, no_restart=True)
    except Exception as exc:  # noqa: BLE001 - close never raises
        _LOG.warning("could not kill the ray_store metadata actor: %s", exc)
        return
    deadline = time.monotonic() + wait_s
    try:
        while actor_exists():
            if time.monotonic() > deadline:
                _LOG.warning("ray_store metadata actor still resolvable %.1fs after close", wait_s)
                return
            time.sleep(0.02)
    except Exception as exc:  # noqa: BLE001 - e.g. Ray already shut down
        _LOG.warning("could not confirm the ray_store metadata actor is gone: %s", exc)
