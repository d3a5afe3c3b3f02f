"""The shared ``DataPlaneClient`` contract over TransferQueue.

Runs ``tests/contract_suite.DataPlaneContract`` unchanged against ``TQDataPlaneClient`` on the
session cluster.  ``fresh_client`` closes the current session system and bootstraps a new,
empty one (a clean client in an empty cluster-wide registry); whatever client is left live
afterwards stays the session client, and a closed one is replaced on the next access.
"""

from __future__ import annotations

import pytest

from tests.contract_suite import SessionContract

from .conftest import TQSession

pytestmark = pytest.mark.timeout(240)


class TestTQContract(SessionContract):
    """The contract over the TransferQueue adapter."""

    old_checkpoint = (1, "tq/controller_state.pkl")

    @pytest.fixture
    def session(self, tq_session: TQSession) -> TQSession:
        return tq_session
