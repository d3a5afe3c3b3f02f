"""The shared ``DataPlaneClient`` contract over the Ray object-store backend (``data_plane=ray``).

Runs ``tests/contract_suite.DataPlaneContract`` unchanged against ``RayStoreClient`` on the
session Ray of ``tests/integration/conftest.py``.  The store's metadata actor is one per
cluster, so this module holds one bootstrapping client at a time: ``fresh_client`` closes the
current one (killing its actor) and bootstraps a new, empty store; a closed client is replaced
on the next ``client`` access.  The last client is closed when the module finishes, before the
session shuts Ray down.

Two tests beyond the contract cover what only this backend has: rows written by another process
(an attached client in a ``num_cpus=0`` actor, as in a policy worker) are readable and writable
back by the driver; columns of a put above the inline threshold live in the object store and
become a ``DataPlaneUnavailableError`` once that writer (the objects' owner) is gone, while a
small put's columns (carried inline by the metadata actor) stay readable; a dead metadata actor
is a ``DataPlaneUnavailableError`` too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nemo_dp.data_plane.codec import materialize
from nemo_dp.data_plane.ray_store_config import RayStoreDataPlaneConfig
from tests.contract_suite import SessionContract

from .conftest import BootstrapSession

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ray_store_session(ray_cluster: dict[str, str]) -> Iterator[BootstrapSession]:
    """The module's bootstrapping Ray-store client, replaceable by a fresh, empty store."""
    from nemo_dp.data_plane.adapters.ray_store import RayStoreClient

    session = BootstrapSession(lambda: RayStoreClient(RayStoreDataPlaneConfig(), bootstrap=True))
    try:
        yield session
    finally:
        session.close()


class TestRayStoreContract(SessionContract):
    """The contract over the Ray object-store adapter."""

    old_checkpoint = (1, "tensors.pt")

    @pytest.fixture
    def session(self, ray_store_session: BootstrapSession) -> BootstrapSession:
        return ray_store_session


# ---------------------------------------------------------------------------------------------
# beyond the shared contract: processes and faults
# ---------------------------------------------------------------------------------------------


class _Writer:
    """A ``num_cpus=0`` actor with an attached client (what a policy worker holds)."""

    def __init__(self) -> None:
        from nemo_dp.data_plane.adapters.ray_store import RayStoreClient

        self.client = RayStoreClient(RayStoreDataPlaneConfig(), bootstrap=False)

    def put(self, pid: str, n: int) -> list[str]:
        import torch
        from tensordict import TensorDict

        ids = [f"w{i}" for i in range(n)]
        rows = [torch.arange(i + 1, dtype=torch.int64) for i in range(n)]
        td = TensorDict(
            {
                "x": torch.arange(n * 3, dtype=torch.float32).reshape(n, 3),
                "r": torch.nested.nested_tensor(rows, layout=torch.jagged),
            },
            batch_size=(n,),
        )
        self.client.put_samples(ids, pid, td)
        return ids

    def put_big(self, pid: str, ids: list[str]) -> int:
        """One column above the inline threshold (it goes through the object store)."""
        import torch
        from tensordict import TensorDict

        from nemo_dp.data_plane.adapters.ray_store.client import INLINE_MAX_BYTES

        width = INLINE_MAX_BYTES // (4 * len(ids)) + 1
        big = torch.ones(len(ids), width, dtype=torch.float32)
        self.client.put_samples(ids, pid, TensorDict({"big": big}, batch_size=(len(ids),)))
        return width


def _call_until_it_raises(call: Callable[[], Any], *, pause_s: float, within_s: float = 60.0) -> None:
    """Call ``call`` every ``pause_s`` until it raises (returns after ``within_s`` if it never does).

    A killed actor takes a moment to be gone (``ray.kill`` only sends the kill): calls made in
    that moment may still succeed.  Wrap this in ``pytest.raises`` to expect the error.
    """
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        call()
        time.sleep(pause_s)


@pytest.mark.timeout(240)
def test_rows_cross_processes_and_a_dead_writer_is_an_unavailable_error(
    ray_store_session: BootstrapSession,
) -> None:
    import ray
    import torch
    from tensordict import TensorDict

    from nemo_dp.data_plane.interfaces import DataPlaneUnavailableError

    client = ray_store_session.client
    pid = "xproc"
    client.register_partition(pid, ["x", "r", "lp", "big"], 4, ["t"])
    writer = ray.remote(num_cpus=0)(_Writer).remote()
    try:
        ids = ray.get(writer.put.remote(pid, 4), timeout=120)
        width = ray.get(writer.put_big.remote(pid, ids), timeout=120)
        assert torch.equal(client.get_samples(ids, pid, ["big"]).get("big"), torch.ones(4, width))
        table = materialize(client.get_samples(ids[::-1], pid, ["x", "r"]))
        assert torch.equal(table["x"], torch.arange(12, dtype=torch.float32).reshape(4, 3).flip(0))
        assert table["r"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 0], [0, 1, 0, 0], [0, 0, 0, 0]]
        # the driver writes a column back onto the worker's rows
        client.put_samples(ids, pid, TensorDict({"lp": torch.ones(4)}, batch_size=(4,)))
        assert client.claim_meta(pid, "t", ["x", "lp"], 4, blocking=False).size == 4
    finally:
        ray.kill(writer, no_restart=True)
    # the big column's object was owned by the writer process: reading it now fails loudly
    with pytest.raises(DataPlaneUnavailableError, match=pid):
        _call_until_it_raises(lambda: client.get_samples(ids, pid, ["big"]), pause_s=0.5)
    # the small put's columns travelled inline and live in the metadata actor: still readable
    table = materialize(client.get_samples(ids, pid, ["x", "r"]))
    assert torch.equal(table["x"], torch.arange(12, dtype=torch.float32).reshape(4, 3))
    # the driver's own column is unaffected
    assert torch.equal(client.get_samples(ids, pid, ["lp"]).get("lp"), torch.ones(4))
    client.clear_samples(None, pid)


@pytest.mark.timeout(240)
def test_a_dead_metadata_actor_is_an_unavailable_error(ray_store_session: BootstrapSession) -> None:
    import ray

    from nemo_dp.data_plane.adapters.ray_store import ACTOR_NAME, ACTOR_NAMESPACE
    from nemo_dp.data_plane.interfaces import DataPlaneUnavailableError

    client = ray_store_session.fresh()
    client.register_partition("gone", ["x"], 1, ["t"])
    ray.kill(ray.get_actor(ACTOR_NAME, namespace=ACTOR_NAMESPACE), no_restart=True)
    # ray.kill only sends the kill (the name can go before the actor stops answering): call until it fails.
    with pytest.raises(DataPlaneUnavailableError, match="metadata actor"):
        _call_until_it_raises(lambda: client.list_sample_ids("gone"), pause_s=0.05)
    ray_store_session.close()  # close still succeeds (the actor is already gone)
