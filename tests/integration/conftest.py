"""Session fixtures for the integration tier: one Ray cluster and one TransferQueue system.

Why this module exists: starting Ray plus the TransferQueue controller and storage unit costs
10-20 s on the shared 2-core machine, so every integration test shares one session cluster
(``ray_cluster``) and one bootstrapping data-plane client (``tq_session`` / ``tq_client``),
torn down in ``finally`` at session end (client first, then ``ray.shutdown()``).

Ray runs with ``num_cpus=2``: the TransferQueue controller and its single storage unit reserve
both logical CPUs, so every actor a test starts must request ``num_cpus=0``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nemo_dp.data_plane.interfaces import DataPlaneConfig, SimpleStorageConfig

RAY_NUM_CPUS = 2


def tq_test_config(**simple: Any) -> DataPlaneConfig:
    """The session's TransferQueue config: the adapter's defaults with one storage unit.

    Args:
        **simple: Overrides for ``data_plane.simple`` (e.g. ``storage_capacity``).

    Returns:
        A validated ``DataPlaneConfig``.
    """
    params: dict[str, Any] = {"num_storage_units": 1}
    params.update(simple)
    return DataPlaneConfig(simple=SimpleStorageConfig(**params))


class BootstrapSession:
    """Holds a backend's bootstrapping client and can replace it with a fresh, empty system.

    Tests that need a clean system (checkpoint loads, close semantics) call ``fresh()``; the
    next ``client`` access re-bootstraps if the current one was closed, so later tests always
    get a live session client.

    Args:
        bootstrap: Builds a new bootstrapping client (a new, empty system).
    """

    def __init__(self, bootstrap: Callable[[], Any]) -> None:
        self._bootstrap = bootstrap
        self._client: Any = None

    @property
    def client(self) -> Any:
        """The live bootstrapping client (created on first use or after close)."""
        if self._client is None or self._client.closed:
            self._client = self._bootstrap()
        return self._client

    def close(self) -> None:
        """Close the current client (tears the backend's actors down); idempotent."""
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None

    def fresh(self) -> Any:
        """Close the current system and bootstrap a new, empty one.

        Returns:
            The new bootstrapping client.
        """
        self.close()
        return self.client


class TQSession(BootstrapSession):
    """The session's TransferQueue system (``TQDataPlaneClient`` bootstrapping ``cfg``)."""

    def __init__(self, cfg: DataPlaneConfig) -> None:
        from nemo_dp.data_plane.adapters.transfer_queue import TQDataPlaneClient

        super().__init__(lambda: TQDataPlaneClient(cfg, bootstrap=True))


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[dict[str, str]]:
    """Ray for the whole session (``num_cpus=2``), with the TransferQueue knobs exported."""
    from nemo_dp.data_plane.registry import ray_start_args
    from nemo_dp.distributed.ray_init import init_ray, shutdown_ray

    env = init_ray(num_cpus=RAY_NUM_CPUS, **ray_start_args(tq_test_config()))
    try:
        yield env
    finally:
        shutdown_ray()


@pytest.fixture(scope="session")
def tq_session(ray_cluster: dict[str, str]) -> Iterator[TQSession]:
    """The session's TransferQueue system holder; closed before Ray shuts down."""
    session = TQSession(tq_test_config())
    try:
        yield session
    finally:
        session.close()


@pytest.fixture
def tq_client(tq_session: TQSession) -> Any:
    """The live session bootstrapping client (function-scoped view of the session system).

    The system itself lives for the whole session; this fixture only re-resolves it so that a
    test that replaced it (``tq_session.fresh()``) never leaves later tests a closed client.
    """
    return tq_session.client


@pytest.fixture
def tq_pid() -> str:
    """A partition id unique to the test (partitions are cluster-wide)."""
    return f"it_{uuid.uuid4().hex[:12]}"
