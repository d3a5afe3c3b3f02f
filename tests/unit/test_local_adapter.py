"""Local-adapter behaviour beyond the shared contract.

One batch per partition, the partition limit, generation-checked metas, whole-column
non-tensor reads, the factory path, thread safety and blocking claims woken by other threads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import NonTensorData, NonTensorStack, TensorDict

from nemo_dp.data_plane.adapters.local import (
    LocalDataPlaneClient,
    is_local_batch_meta,
    local_batch_to_tensordict,
)
from nemo_dp.data_plane.codec import materialize, materialize_local
from nemo_dp.data_plane.factory import build_data_plane_client
from nemo_dp.data_plane.interfaces import KVBatchMeta, LocalDataPlaneConfig
from nemo_dp.data_plane.schema import LOCAL_PARTITION_GENERATION
from tests.contract_suite import run_in_threads

pytestmark = pytest.mark.timeout(120)


def make_client(max_partitions: int = 2) -> LocalDataPlaneClient:
    return LocalDataPlaneClient(LocalDataPlaneConfig(max_partitions=max_partitions))


@pytest.fixture
def client() -> Iterator[LocalDataPlaneClient]:
    c = make_client(4)
    try:
        yield c
    finally:
        c.close()


def td_x(n: int, offset: float = 0.0) -> TensorDict:
    return TensorDict({"x": torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + offset}, batch_size=(n,))


# --- one complete batch per partition ---------------------------------------------------


def test_second_put_is_a_duplicate_write(client: LocalDataPlaneClient) -> None:
    client.register_partition("p", ["x", "y"], 3, ["t"])
    client.put_samples(["a", "b", "c"], "p", td_x(3))
    with pytest.raises(ValueError, match="duplicate writes"):
        client.put_samples(["a", "b", "c"], "p", TensorDict({"y": torch.zeros(3)}, batch_size=(3,)))
    with pytest.raises(ValueError, match="duplicate writes"):
        client.put_samples(["d", "e", "f"], "p", td_x(3))
    with pytest.raises(ValueError, match="duplicate writes"):
        client.put_samples(["a", "b", "c"], "p", None, tags=[{}, {}, {}])
    client.clear_samples(["a", "b"], "p")
    with pytest.raises(ValueError, match="duplicate writes"):
        client.put_samples(["a", "b", "c"], "p", td_x(3))
    assert client.list_sample_ids("p") == ["c"]


def test_put_must_carry_exactly_num_samples_rows(client: LocalDataPlaneClient) -> None:
    client.register_partition("p", ["x"], 3, ["t"])
    for n in (2, 4):
        with pytest.raises(ValueError, match="exactly 3 rows"):
            client.put_samples([f"r{i}" for i in range(n)], "p", td_x(n))
    assert client.list_sample_ids("p") == []
    client.put_samples(["a", "b", "c"], "p", td_x(3))
    assert client.list_sample_ids("p") == ["a", "b", "c"]


def test_tags_only_put_is_the_one_put(client: LocalDataPlaneClient) -> None:
    client.register_partition("p", ["x"], 2, ["t"])
    receipt = client.put_samples(["a", "b"], "p", None, tags=[{"input_lengths": 3}, {"input_lengths": 1}])
    assert receipt.fields is None and receipt.sequence_lengths == [3, 1]
    assert client.list_sample_ids("p") == ["a", "b"]
    with pytest.raises(KeyError, match="x"):
        client.get_samples(["a"], "p", ["x"])
    with pytest.raises(ValueError, match="duplicate writes"):
        client.put_samples(["a", "b"], "p", td_x(2))


# --- partition limit --------------------------------------------------------------------


def test_partition_limit() -> None:
    c = make_client(2)
    c.register_partition("p1", ["x"], 1, ["t"])
    c.register_partition("p2", ["x"], 1, ["t"])
    with pytest.raises(RuntimeError, match="partition limit") as ei:
        c.register_partition("p3", ["x"], 1, ["t"])
    assert "clear" in str(ei.value)
    # dropping the partition frees its slot
    c.clear_samples(None, "p1")
    c.register_partition("p3", ["x"], 1, ["t"])
    assert c.list_sample_ids("p3") == []
    # the "already registered" check wins over the limit for a live id
    with pytest.raises(ValueError, match="already registered"):
        c.register_partition("p2", ["x"], 1, ["t"])


def test_clearing_every_row_by_ids_drops_the_partition_and_frees_its_slot() -> None:
    """Issue 10 item 3: as in the reference, a partition whose last row is cleared is gone."""
    c = make_client(2)
    c.register_partition("p1", ["x"], 2, ["t"])
    c.register_partition("p2", ["x"], 1, ["t"])
    c.put_samples(["a", "b"], "p1", td_x(2))
    c.clear_samples([], "p1")  # a no-op, not an emptying clear
    c.clear_samples(["a"], "p1")
    assert c.list_sample_ids("p1") == ["b"]  # rows left: still live, slot still held
    with pytest.raises(RuntimeError, match="partition limit"):
        c.register_partition("p3", ["x"], 1, ["t"])
    c.clear_samples(["b"], "p1")  # the last row
    with pytest.raises(KeyError, match="'p1'"):
        c.get_samples(["b"], "p1", ["x"])
    with pytest.raises(KeyError, match="'p1'"):
        c.clear_samples(None, "p1")  # already gone
    c.register_partition("p3", ["x"], 1, ["t"])  # the slot is free
    c.put_samples(["z"], "p3", td_x(1))
    c.clear_samples(["z"], "p3")
    c.register_partition("p1", ["x"], 1, ["t"])  # and the id may be registered again
    assert c.list_sample_ids("p1") == []
    # a registered, never-written partition is not dropped by an empty explicit clear
    c.clear_samples([], "p2")
    assert c.list_sample_ids("p2") == [] and c.claim_meta("p2", "t", ["x"], 1, blocking=False).size == 0


# --- generations ------------------------------------------------------------------------


def test_stale_meta_is_rejected_by_get_data_only() -> None:
    c = make_client(1)
    c.register_partition("p", ["x"], 2, ["t"])
    old = c.put_samples(["a", "b"], "p", td_x(2))
    assert is_local_batch_meta(old)
    g_old = old.extra_info[LOCAL_PARTITION_GENERATION]
    assert torch.equal(c.get_data(old)["x"], td_x(2)["x"])
    c.clear_samples(None, "p")
    c.register_partition("p", ["x"], 2, ["t"])
    new = c.put_samples(["a", "b"], "p", td_x(2, offset=10.0))
    g_new = new.extra_info[LOCAL_PARTITION_GENERATION]
    assert g_new > g_old
    with pytest.raises(ValueError) as ei:
        c.get_data(old)
    assert str(ei.value) == f"Stale local metadata for partition 'p': generation {g_old}, expected {g_new}."
    # a meta without the key is stale too
    with pytest.raises(ValueError, match="Stale local metadata"):
        c.get_data(KVBatchMeta("p", "t", ["a"], fields=["x"]))
    # the generation is checked before field resolution
    with pytest.raises(ValueError, match="Stale local metadata"):
        c.get_data(KVBatchMeta("p", "t", ["a"], fields=None))
    # get_samples by ids does not check generations
    assert torch.equal(c.get_samples(["a", "b"], "p", ["x"])["x"], td_x(2, offset=10.0)["x"])
    assert torch.equal(c.get_data(new)["x"], td_x(2, offset=10.0)["x"])


def test_every_returned_meta_carries_the_generation(client: LocalDataPlaneClient) -> None:
    client.register_partition("p", ["x"], 2, ["t", "u"])
    client.register_partition("q", ["x"], 2, ["t"])
    receipt = client.put_samples(["a", "b"], "p", td_x(2))
    gen = receipt.extra_info[LOCAL_PARTITION_GENERATION]
    claim = client.claim_meta("p", "t", ["x"], 2)
    empty = client.claim_meta("p", "t", ["x"], 1, blocking=False)
    assert claim.extra_info == {LOCAL_PARTITION_GENERATION: gen}
    assert empty.extra_info == {LOCAL_PARTITION_GENERATION: gen}
    q_receipt = client.put_samples(["a", "b"], "q", td_x(2))
    assert q_receipt.extra_info[LOCAL_PARTITION_GENERATION] != gen
    assert not is_local_batch_meta(KVBatchMeta("p", None, ["a"]))
    with pytest.raises(TypeError):
        is_local_batch_meta({"extra_info": {}})  # type: ignore[arg-type]


# --- non-tensor columns -----------------------------------------------------------------


def test_non_tensor_columns_come_back_as_one_non_tensor_data() -> None:
    c = make_client()
    batch = {
        "x": torch.arange(6).reshape(3, 2),
        "text": ["alpha", "beta", "gamma"],
        "obj": np.array([{"k": 1}, None, [1, 2]], dtype=object),
    }
    td = local_batch_to_tensordict(batch, batch_size=3)
    c.register_partition("p", list(td.keys()), 3, ["t"])
    c.put_samples(["a", "b", "c"], "p", td)
    out = c.get_samples(["c", "a"], "p", ["x", "text", "obj"])
    assert isinstance(out.get("text"), NonTensorData)
    assert isinstance(out.get("obj"), NonTensorData)
    assert out.get("text").data == ["gamma", "alpha"]
    table = materialize_local(out)
    assert table["text"] == ["gamma", "alpha"]
    assert table["obj"] == [[1, 2], {"k": 1}]
    assert torch.equal(table["x"], batch["x"][[2, 0]])
    with pytest.raises(TypeError, match="materialize_local"):
        materialize(out)
    # reads hand out copies: mutating a read object does not reach the store
    table["obj"][1]["k"] = 99
    assert materialize_local(c.get_samples(["a"], "p", ["obj"]))["obj"] == [{"k": 1}]
    # a NonTensorStack column is accepted too and read back the same way
    c.register_partition("q", ["s"], 2, ["t"])
    c.put_samples(["a", "b"], "q", TensorDict({"s": NonTensorStack.from_list(["u", "v"])}, batch_size=(2,)))
    out = c.get_samples(["b", "a"], "q", ["s"])
    assert isinstance(out.get("s"), NonTensorData) and out.get("s").data == ["v", "u"]


def test_put_deep_copies_objects_and_rejects_bad_whole_columns(client: LocalDataPlaneClient) -> None:
    client.register_partition("p", ["o"], 2, ["t"])
    rows = [{"k": [1]}, {"k": [2]}]
    with pytest.raises(TypeError, match="'o'"):
        client.put_samples(["a", "b"], "p", TensorDict({"o": NonTensorData("ab", batch_size=(2,))}, batch_size=(2,)))
    with pytest.raises(ValueError, match="'o'"):
        client.put_samples(["a", "b"], "p", TensorDict({"o": NonTensorData([1, 2, 3], batch_size=(2,))}, batch_size=(2,)))
    assert client.list_sample_ids("p") == []
    client.put_samples(["a", "b"], "p", TensorDict({"o": NonTensorData(rows, batch_size=(2,))}, batch_size=(2,)))
    rows[0]["k"].append(5)
    assert materialize_local(client.get_samples(["a", "b"], "p", ["o"]))["o"] == [{"k": [1]}, {"k": [2]}]


def test_local_batch_to_tensordict() -> None:
    ids = torch.arange(8).reshape(4, 2)
    td = local_batch_to_tensordict({"ids": ids, "text": ("a", "b", "c", "d")}, batch_size=4)
    assert tuple(td.batch_size) == (4,)
    assert td.get("ids") is ids  # tensors become leaves as they are; the put copies
    assert isinstance(td.get("text"), NonTensorData) and list(td.get("text").data) == ["a", "b", "c", "d"]
    with pytest.raises(ValueError) as ei:
        local_batch_to_tensordict({"x": torch.zeros(3)}, batch_size=4)
    assert str(ei.value) == "Local field 'x' has batch size 3, expected 4."
    with pytest.raises(ValueError) as ei:
        local_batch_to_tensordict({"x": ["a"]}, batch_size=2)
    assert str(ei.value) == "Local field 'x' has batch size 1, expected 2."
    with pytest.raises(ValueError):
        local_batch_to_tensordict({"x": torch.tensor(1.0)}, batch_size=1)
    with pytest.raises(ValueError):
        local_batch_to_tensordict({}, batch_size=-1)
    empty = local_batch_to_tensordict({}, batch_size=0)
    assert tuple(empty.batch_size) == (0,)


# --- factory ----------------------------------------------------------------------------


def test_factory_builds_a_local_client() -> None:
    c = build_data_plane_client(LocalDataPlaneConfig(max_partitions=1))
    try:
        assert isinstance(c, LocalDataPlaneClient)
        c.register_partition("p", [], 1, [])
        with pytest.raises(RuntimeError, match="partition limit"):
            c.register_partition("q", [], 1, [])
    finally:
        c.close()


# --- threads --------------------------------------------------------------------------------


def _signal_when_waiting(client: LocalDataPlaneClient) -> threading.Event:
    """An event set when a claim on ``client`` starts waiting on its condition variable.

    Wraps the client's private condition (test-only hook): the main thread can then act on a
    claimer that is certainly blocked, instead of sleeping and hoping it got there.
    """
    waiting = threading.Event()
    cond = client._changed
    original = cond.wait

    def wait(timeout: float | None = None) -> bool:
        waiting.set()
        return original(timeout)

    cond.wait = wait  # type: ignore[method-assign]
    return waiting


def test_blocking_claim_is_satisfied_by_a_put_from_another_thread(client: LocalDataPlaneClient) -> None:
    client.register_partition("p", ["x"], 3, ["t"])
    result: list[KVBatchMeta] = []
    errors: list[BaseException] = []

    def claimer() -> None:
        try:
            result.append(client.claim_meta("p", "t", ["x"], 3, blocking=True, timeout_s=30.0))
        except BaseException as exc:
            errors.append(exc)

    waiting = _signal_when_waiting(client)
    th = threading.Thread(target=claimer)
    th.start()
    assert waiting.wait(30) and th.is_alive()  # really waiting
    client.put_samples(["a", "b", "c"], "p", td_x(3))
    th.join(30)
    assert not th.is_alive() and errors == []
    assert result[0].sample_ids == ["a", "b", "c"]  # stored order, oldest first


def test_waiting_claim_fails_when_partition_dropped_or_client_closed(client: LocalDataPlaneClient) -> None:
    client.register_partition("p", ["x"], 1, ["t"])
    errors: list[BaseException] = []

    def claimer(c: LocalDataPlaneClient, pid: str) -> None:
        try:
            c.claim_meta(pid, "t", ["x"], 1, timeout_s=30.0)
        except BaseException as exc:
            errors.append(exc)

    waiting = _signal_when_waiting(client)
    th = threading.Thread(target=claimer, args=(client, "p"))
    th.start()
    assert waiting.wait(30)
    client.clear_samples(None, "p")
    th.join(10)
    assert not th.is_alive()
    assert isinstance(errors[0], KeyError) and "'p'" in str(errors[0])

    other = make_client(1)
    other.register_partition("q", ["x"], 1, ["t"])
    waiting = _signal_when_waiting(other)
    th = threading.Thread(target=claimer, args=(other, "q"))
    th.start()
    assert waiting.wait(30)
    other.close()
    th.join(10)
    assert not th.is_alive()
    assert isinstance(errors[1], RuntimeError) and str(errors[1]) == "Local data-plane client is closed."


def test_many_threads_register_put_read_drop() -> None:
    c = make_client(4)

    def worker(w: int) -> None:
        for k in range(15):
            pid = f"w{w}_b{k}"
            n = 3 + (k % 3)
            c.register_partition(pid, ["x", "s"], n, ["train"])
            x = torch.full((n, 4), float(w * 100 + k))
            ids = [f"{pid}_row{i}" for i in range(n)]
            td = TensorDict({"x": x, "s": NonTensorStack.from_list(ids)}, batch_size=(n,))
            receipt = c.put_samples(ids, pid, td)
            meta = c.claim_meta(pid, "train", ["x", "s"], n, timeout_s=5.0)
            table = materialize_local(c.get_data(meta))
            assert torch.equal(table["x"], x)
            assert table["s"] == ids
            assert c.get_data(receipt, ["s"]).get("s").data == ids
            assert c.check_consumption_status(pid, ["train"]) is True
            c.clear_samples(None, pid)

    run_in_threads(worker, 4)
    c.close()


def test_concurrent_first_puts_accept_exactly_one(client: LocalDataPlaneClient) -> None:
    client.register_partition("p", ["x"], 2, ["t"])
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def putter(i: int) -> None:
        barrier.wait()
        try:
            client.put_samples(["a", "b"], "p", td_x(2, offset=float(i)))
            outcomes.append(f"ok{i}")
        except ValueError as exc:
            assert "duplicate writes" in str(exc)
            outcomes.append("dup")

    run_in_threads(putter, 4, join_s=30)
    winners = [o for o in outcomes if o.startswith("ok")]
    assert len(winners) == 1 and outcomes.count("dup") == 3
    offset = float(winners[0][2:])
    assert torch.equal(client.get_samples(["a", "b"], "p", ["x"])["x"], td_x(2, offset=offset)["x"])


# --- storage details -------------------------------------------------------------------------


def test_reads_never_alias_the_store(client: LocalDataPlaneClient) -> None:
    client.register_partition("p", ["x", "r"], 4, ["t"])
    x = torch.arange(12.0).reshape(4, 3)
    rows = [torch.arange(k, dtype=torch.int32) for k in (1, 3, 2, 4)]
    r = torch.nested.nested_tensor(rows, layout=torch.jagged)
    client.put_samples(["a", "b", "c", "d"], "p", TensorDict({"x": x, "r": r}, batch_size=(4,)))
    for order in (["a", "b", "c", "d"], ["b", "c"], ["d", "a"]):
        first = client.get_samples(order, "p", ["x", "r"])
        second = client.get_samples(order, "p", ["x", "r"])
        assert first["x"].data_ptr() != second["x"].data_ptr()
        assert first.get("r").values().data_ptr() != second.get("r").values().data_ptr()
        first["x"].fill_(-1)
        first.get("r").values().fill_(-1)
        want_rows = [rows["abcd".index(s)] for s in order]
        assert torch.equal(second["x"], x[["abcd".index(s) for s in order]])
        assert [t.tolist() for t in client.get_samples(order, "p", ["r"]).get("r").unbind()] == [
            t.tolist() for t in want_rows
        ]
        assert first["x"].is_contiguous()


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_non_contiguous_and_holey_jagged_inputs(client: LocalDataPlaneClient) -> None:
    client.register_partition("p", ["t", "j", "s"], 3, ["u"])
    base = torch.arange(12.0).reshape(4, 3)
    transposed = base.t()  # (3, 4), not contiguous
    holey = torch.nested.nested_tensor_from_jagged(
        torch.arange(10), torch.tensor([0, 3, 7, 10]), lengths=torch.tensor([2, 1, 3])
    )
    strided_nested = torch.nested.nested_tensor([torch.ones(2, 2), torch.zeros(1, 2), torch.ones(3, 2)])
    td = TensorDict({"t": transposed, "j": holey, "s": strided_nested}, batch_size=(3,))
    client.put_samples(["a", "b", "c"], "p", td)
    out = client.get_samples(["c", "a", "b"], "p", ["t", "j", "s"])
    assert torch.equal(out["t"], transposed[[2, 0, 1]])
    assert [r.tolist() for r in out.get("j").unbind()] == [[7, 8, 9], [0, 1], [3]]
    assert [tuple(r.shape) for r in out.get("s").unbind()] == [(3, 2), (2, 2), (1, 2)]


def test_claim_lengths_fall_back_to_the_input_lengths_column(client: LocalDataPlaneClient) -> None:
    client.register_partition("p", ["x", "input_lengths"], 3, ["t"])
    td = TensorDict({"x": torch.zeros(3, 2), "input_lengths": torch.tensor([4, 2, 7], dtype=torch.int32)}, batch_size=(3,))
    receipt = client.put_samples(["a", "b", "c"], "p", td, tags=[{"k": 1}, {"k": 2}, {"k": 3}])
    assert receipt.sequence_lengths == [4, 2, 7]
    client.clear_samples(["a"], "p")
    meta = client.claim_meta("p", "t", ["x"], 2)
    assert meta.sample_ids == ["b", "c"]
    assert meta.sequence_lengths == [2, 7]
    assert meta.tags == [{"k": 2}, {"k": 3}]


def test_enum_fields_must_be_object_columns(client: LocalDataPlaneClient) -> None:
    client.register_partition("p", ["status"], 2, ["t"], enums={"status": ["ok", "bad"]})
    with pytest.raises(TypeError, match="status"):
        client.put_samples(["a", "b"], "p", TensorDict({"status": torch.zeros(2)}, batch_size=(2,)))
    with pytest.raises(ValueError, match="None"):
        client.put_samples(["a", "b"], "p", local_batch_to_tensordict({"status": ["ok", None]}, batch_size=2))
    client.put_samples(["a", "b"], "p", local_batch_to_tensordict({"status": ["bad", "ok"]}, batch_size=2))
    assert materialize_local(client.get_samples(["b", "a"], "p", ["status"]))["status"] == ["ok", "bad"]
    with pytest.raises(TypeError):
        client.register_partition("q", ["s"], 1, ["t"], enums={"s": "ok"})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        client.register_partition("q", ["s"], 1, ["t"], enums={"s": ["ok", 3]})  # type: ignore[list-item]


def test_reserved_prefix_and_closed_message() -> None:
    c = make_client()
    with pytest.raises(ValueError, match="reserved"):
        c.register_partition("__nemo_dp_registry__", ["x"], 1, ["t"])
    assert c.list_sample_ids("__nemo_dp_registry__") == []
    c.close()
    with pytest.raises(RuntimeError) as ei:
        c.list_sample_ids("p")
    assert str(ei.value) == "Local data-plane client is closed."
    with pytest.raises(TypeError):
        LocalDataPlaneClient({"impl": "local"})  # type: ignore[arg-type]


# --- reads of arbitrary row selections (contiguous-run fast path vs gather) -------------------


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=12),
    data=st.data(),
)
def test_any_selection_reads_back_exactly(lengths: list[int], data: st.DataObject) -> None:
    n = len(lengths)
    ids = [f"r{i}" for i in range(n)]
    dense = torch.arange(n * 3, dtype=torch.int64).reshape(n, 3)
    rows = [torch.arange(k, dtype=torch.float32) + 10 * i for i, k in enumerate(lengths)]
    c = make_client(1)
    c.register_partition("p", ["d", "j", "o"], n, ["t"])
    td = TensorDict(
        {
            "d": dense,
            "j": torch.nested.nested_tensor(rows, layout=torch.jagged),
            "o": NonTensorStack.from_list([{"i": i} for i in range(n)]),
        },
        batch_size=(n,),
    )
    c.put_samples(ids, "p", td)
    cleared = data.draw(st.lists(st.sampled_from(ids), unique=True, max_size=n - 1))
    if cleared:
        c.clear_samples(cleared, "p")
    live = [i for i in range(n) if ids[i] not in cleared]
    picked = data.draw(st.lists(st.sampled_from(live), unique=True, min_size=1))
    out = c.get_samples([ids[i] for i in picked], "p", ["d", "j", "o"])
    assert torch.equal(out["d"], dense[picked])
    assert [r.tolist() for r in out.get("j").unbind()] == [rows[i].tolist() for i in picked]
    assert out.get("o").data == [{"i": i} for i in picked]
    c.close()


# --- issue 10 item 2: materialize_local is part of the adapter module (reference API) ---------


def test_materialize_local_is_importable_from_the_local_adapter(client: LocalDataPlaneClient) -> None:
    from nemo_dp.data_plane.adapters import local

    assert "materialize_local" in local.__all__
    assert local.materialize_local is materialize_local
    client.register_partition("p", ["x", "s"], 2, ["t"])
    client.put_samples(["a", "b"], "p", local_batch_to_tensordict({"x": torch.ones(2, 3), "s": ["u", "v"]}, batch_size=2))
    out = local.materialize_local(client.get_samples(["b", "a"], "p", ["x", "s"]))
    assert out["s"] == ["v", "u"] and torch.equal(out["x"], torch.ones(2, 3))
