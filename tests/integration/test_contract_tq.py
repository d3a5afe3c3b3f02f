"""The shared ``DataPlaneClient`` contract over TransferQueue.

Runs ``tests/contract_suite.DataPlaneContract`` unchanged against ``TQDataPlaneClient`` on the
session cluster.  ``fresh_client`` closes the current session system and bootstraps a new,
empty one (a clean client in an empty cluster-wide registry); whatever client is left live
afterwards stays the session client, and a closed one is replaced on the next access.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nemo_dp.data_plane.codec import materialize
from tests.contract_suite import DataPlaneContract

from .conftest import TQSession

pytestmark = pytest.mark.timeout(240)


class TestTQContract(DataPlaneContract):
    """The contract over the TransferQueue adapter (write-back supported)."""

    supports_write_back = True
    old_checkpoint = (1, "tq/controller_state.pkl")

    @pytest.fixture
    def client(self, tq_session: TQSession) -> Any:
        return tq_session.client

    @pytest.fixture
    def fresh_client(self, tq_session: TQSession) -> Callable[[], Any]:
        return tq_session.fresh

    @pytest.fixture
    def read_table(self) -> Callable[[Any], Any]:
        return materialize
