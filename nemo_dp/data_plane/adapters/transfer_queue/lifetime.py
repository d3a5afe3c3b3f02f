"""Lifetime of the TransferQueue system: bootstrap, attach, the event-loop thread, teardown.

``transfer_queue`` and ``ray`` are imported inside functions.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import threading
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from nemo_dp.data_plane.interfaces import DataPlaneConfig

if TYPE_CHECKING:  # pragma: no cover - typing only
    from types import ModuleType

_LOG = logging.getLogger("nemo_dp.data_plane.adapters.transfer_queue")

#: Name and Ray namespace of the library's controller actor (TransferQueue 0.1.11).
CONTROLLER_NAME = "TransferQueueController"
CONTROLLER_NAMESPACE = "transfer_queue"
#: Storage units are named ``<prefix><rank>`` in the bootstrapping job's namespace.
STORAGE_UNIT_NAME_PREFIX = "TransferQueueStorageUnit#"

_T = TypeVar("_T")

# At most one open client per process: the library keeps one client per process.
OPEN_LOCK = threading.Lock()
_OPEN_CLIENT: Any = None


def open_client() -> Any:
    return _OPEN_CLIENT


def set_open_client(client: Any) -> None:
    """Record (or with ``None`` forget) this process's open client; hold ``OPEN_LOCK``."""
    global _OPEN_CLIENT
    _OPEN_CLIENT = client


def load_library() -> ModuleType:
    """Import the library (lazily: its knobs are read at import)."""
    import transfer_queue

    return transfer_queue


def library_interface() -> ModuleType:
    """The library's ``interface`` module (process-level client and controller handles)."""
    import transfer_queue.interface

    return transfer_queue.interface


def tq_controller_exists() -> bool:
    """Whether the library's named controller actor resolves."""
    import ray

    try:
        ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE)
    except ValueError:
        return False
    return True


class LoopThread:
    """One asyncio event loop on a daemon thread; the only thread that awaits the library."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Awaitable[_T], timeout: float) -> concurrent.futures.Future[_T]:
        async def bounded() -> _T:
            return await asyncio.wait_for(coro, timeout)

        return asyncio.run_coroutine_threadsafe(bounded(), self.loop)

    def stop(self, join_timeout: float = 5.0) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(join_timeout)
        if self._thread.is_alive():
            _LOG.warning("TransferQueue adapter loop thread did not stop within %.1fs", join_timeout)
            return
        self.loop.close()


def _bounded(target: Any, name: str, timeout_s: float) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``target(outcome)`` on a daemon thread for at most ``timeout_s``; errors go to ``outcome["error"]``."""
    outcome: dict[str, Any] = {}

    def _run() -> None:
        try:
            target(outcome)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=_run, name=name, daemon=True)
    worker.start()
    worker.join(timeout_s)
    return worker, outcome


def _readonly(conf: Any) -> Any:
    from omegaconf import OmegaConf

    backend_config = copy.deepcopy(conf)
    OmegaConf.set_readonly(backend_config, True)
    return backend_config


def start_system(cfg: DataPlaneConfig, *, startup_s: float, controller_s: float) -> Any:
    """Create the library's controller and storage units; return the merged read-only ``DictConfig``.

    Raises:
        RuntimeError: A controller already exists; too few Ray CPUs; start-up failed or
            exceeded ``startup_s`` (the actors it created are removed first).
    """
    import ray

    tq = load_library()
    n_units = int(cfg.simple.num_storage_units)
    if tq_controller_exists():
        raise RuntimeError(
            f"a TransferQueue controller ({CONTROLLER_NAME!r} in Ray namespace "
            f"{CONTROLLER_NAMESPACE!r}) already exists in this Ray cluster; refusing to "
            "attach silently to a system with possibly different settings (e.g. a previous "
            "multirun job did not close its data plane). Close the old bootstrap client "
            "or restart Ray."
        )
    total_cpus = float(ray.cluster_resources().get("CPU", 0.0))
    if total_cpus < 1 + n_units:
        raise RuntimeError(
            f"the Ray cluster has {total_cpus:g} logical CPUs, but the TransferQueue controller "
            f"and data_plane.simple.num_storage_units={n_units} storage units reserve "
            f"{1 + n_units}: the library's start-up would deadlock waiting for CPUs. Lower "
            "num_storage_units or start Ray with more logical CPUs."
        )
    conf = {
        "controller": {"polling_mode": True},
        "backend": {
            "storage_backend": "SimpleStorage",
            "SimpleStorage": {
                "total_storage_size": int(cfg.simple.storage_capacity),
                "num_data_storage_units": n_units,
            },
        },
    }
    worker, outcome = _bounded(lambda out: out.update(conf=tq.init(conf)), "nemo-dp-tq-bootstrap", startup_s)
    if worker.is_alive() or "error" in outcome:
        timed_out = worker.is_alive()
        remove_system_actors(n_units)
        worker.join(controller_s)
        reset_library(tq, kill=True)
        if timed_out:
            raise RuntimeError(
                f"TransferQueue bootstrap did not finish within data_plane.timeouts.startup_s="
                f"{startup_s:g}s; its controller and storage actors were removed"
            )
        raise RuntimeError(f"TransferQueue bootstrap failed: {outcome['error']}") from outcome["error"]
    return _readonly(outcome["conf"])


def attach(*, startup_s: float) -> Any:
    """Attach to the running controller (never creates one); return the read-only ``DictConfig`` in force.

    Raises:
        RuntimeError: No controller runs, or attaching failed or exceeded ``startup_s``.
    """
    import ray

    missing = (
        f"no TransferQueue controller ({CONTROLLER_NAME!r} in Ray namespace "
        f"{CONTROLLER_NAMESPACE!r}) is running in this Ray cluster; build the driver client "
        "with bootstrap=True first"
    )
    if not tq_controller_exists():
        raise RuntimeError(missing)
    interface = library_interface()

    def _connect(outcome: dict[str, Any]) -> None:
        # The library's private attach path: unlike init() it never creates a new system.
        outcome["ok"] = interface._init_from_existing()
        if outcome["ok"]:
            outcome["conf"] = ray.get(interface._TQ_CONTROLLER.get_config.remote())

    worker, outcome = _bounded(_connect, "nemo-dp-tq-attach", startup_s)
    if worker.is_alive():
        raise RuntimeError(
            f"attaching to the TransferQueue controller did not finish within "
            f"data_plane.timeouts.startup_s={startup_s:g}s"
        )
    if "error" in outcome:
        reset_library(load_library(), kill=False)
        raise RuntimeError(f"attaching to TransferQueue failed: {outcome['error']}") from outcome["error"]
    if not outcome["ok"]:
        reset_library(load_library(), kill=False)
        raise RuntimeError(missing)
    return _readonly(outcome["conf"])


def remove_system_actors(n_units: int) -> None:
    """Kill the controller and ``n_units`` storage actors if they exist (best effort)."""
    import ray

    names: list[tuple[str, str | None]] = [(CONTROLLER_NAME, CONTROLLER_NAMESPACE)]
    names += [(f"{STORAGE_UNIT_NAME_PREFIX}{i}", None) for i in range(n_units)]
    for name, namespace in names:
        try:
            handle = ray.get_actor(name, namespace=namespace)
        except ValueError:
            continue
        try:
            ray.kill(handle)
        except Exception as exc:  # noqa: BLE001 - best effort clean-up
            _LOG.warning("could not kill %s: %s", name, exc)


def reset_library(tq: ModuleType, *, kill: bool) -> None:
    """Drop the library's process-level handles: ``kill=True`` through ``tq.close()`` (which kills the actors
    this process created), ``kill=False`` closing only this process's client (the library's close would
    kill the shared controller even from an attached process).
    """
    interface = library_interface()
    if kill:
        try:
            tq.close()
        except Exception as exc:  # noqa: BLE001 - logged, close never raises
            _LOG.warning("TransferQueue close failed: %s", exc)
        return
    client = interface._TQ_CLIENT
    interface._TQ_CLIENT = None
    interface._TQ_CONTROLLER = None
    if client is not None:
        try:
            client.close()
        except Exception as exc:  # noqa: BLE001 - logged, close never raises
            _LOG.warning("TransferQueue client close failed: %s", exc)


def wait_controller_gone(timeout_s: float) -> None:
    """Return once the named controller no longer resolves (at most ``timeout_s``; logs)."""
    deadline = time.monotonic() + timeout_s
    try:
        while tq_controller_exists():
            if time.monotonic() > deadline:
                _LOG.warning(
                    "TransferQueue controller %r still resolvable %.1fs after close", CONTROLLER_NAME, timeout_s
                )
                return
            time.sleep(0.05)
    except Exception as exc:  # noqa: BLE001 - e.g. Ray already shut down; close never raises
        _LOG.warning("could not confirm the TransferQueue controller is gone: %s", exc)
