"""Runs the adapter-independent contract suite (``tests/contract_suite.py``) on the Local adapter."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from tensordict import TensorDict

from nemo_dp.data_plane.adapters.local import LocalDataPlaneClient
from nemo_dp.data_plane.codec import materialize_local
from nemo_dp.data_plane.interfaces import DataPlaneClient, LocalDataPlaneConfig
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from tests.contract_suite import DataPlaneContract


class TestLocalContract(DataPlaneContract):
    """The shared contract on ``LocalDataPlaneClient`` (one put per partition)."""

    supports_write_back = False
    old_checkpoint = (2, "tensors.pt")

    @pytest.fixture
    def client(self) -> Iterator[DataPlaneClient]:
        c = LocalDataPlaneClient(LocalDataPlaneConfig(max_partitions=8))
        try:
            yield c
        finally:
            c.close()

    @pytest.fixture
    def fresh_client(self) -> Iterator[Callable[[], DataPlaneClient]]:
        made: list[LocalDataPlaneClient] = []

        def factory() -> DataPlaneClient:
            c = LocalDataPlaneClient(LocalDataPlaneConfig(max_partitions=8))
            made.append(c)
            return c

        try:
            yield factory
        finally:
            for c in made:
                c.close()

    @pytest.fixture
    def read_table(self) -> Callable[[TensorDict], BatchedDataDict]:
        return materialize_local
