"""The shared ``DataPlaneClient`` contract over the Ray object-store backend (``data_plane=ray``).

Runs ``tests/contract_suite.DataPlaneContract`` unchanged against ``RayStoreClient`` on the
session Ray of ``tests/integration/conftest.py``.  The store's metadata actor is one per
cluster, so this module holds one bootstrapping client at a time: ``fresh_client`` closes the
current one (killing its actor) and bootstraps a new, empty store; a closed client is replaced
on the next ``client`` access.  The last client is closed when the module finishes, before the
session shuts Ray down.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nemo_dp.data_plane.codec import materialize
from nemo_dp.data_plane.ray_store_config import RayStoreDataPlaneConfig
from tests.contract_suite import DataPlaneContract

pytestmark = pytest.mark.timeout(240)


class RayStoreSession:
    """The module's bootstrapping client, replaceable by a fresh, empty store."""

    def __init__(self) -> None:
        self.cfg = RayStoreDataPlaneConfig()
        self._client: Any = None

    @property
    def client(self) -> Any:
        """The live bootstrapping client (created on first use or after close)."""
        from nemo_dp.data_plane.adapters.ray_store import RayStoreClient

        if self._client is None or self._client.closed:
            self._client = RayStoreClient(self.cfg, bootstrap=True)
        return self._client

    def close(self) -> None:
        """Close the current client (kills the metadata actor); idempotent."""
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None

    def fresh(self) -> Any:
        """Close the current store and bootstrap a new, empty one."""
        self.close()
        return self.client


@pytest.fixture(scope="module")
def ray_store_session(ray_cluster: dict[str, str]) -> Iterator[RayStoreSession]:
    session = RayStoreSession()
    try:
        yield session
    finally:
        session.close()


class TestRayStoreContract(DataPlaneContract):
    """The contract over the Ray object-store adapter (write-back supported)."""

    supports_write_back = True

    @pytest.fixture
    def client(self, ray_store_session: RayStoreSession) -> Any:
        return ray_store_session.client

    @pytest.fixture
    def fresh_client(self, ray_store_session: RayStoreSession) -> Callable[[], Any]:
        return ray_store_session.fresh

    @pytest.fixture
    def read_table(self) -> Callable[[Any], Any]:
        return materialize
