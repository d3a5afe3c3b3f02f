"""TransferQueue adapter behaviour beyond the shared contract.

Runs on the session cluster (``ray_cluster`` / ``tq_session``): write-back of new columns, the
layouts the adapter returns (dense stays dense, 1-D stays ``(N,)``, ragged stays jagged, object
columns as ``NonTensorStack``), tags, dtype drift, a starved claim in another process, close
semantics and the caller's torch thread count.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import ray
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from nemo_dp.data_plane.adapters.transfer_queue import (
    CONTROLLER_NAME,
    CONTROLLER_NAMESPACE,
    STORAGE_UNIT_NAME_PREFIX,
    TQDataPlaneClient,
    tq_controller_exists,
)
from nemo_dp.data_plane.codec import pack_jagged_fields
from nemo_dp.data_plane.column_io import read_columns, write_columns

from .conftest import TQSession, tq_test_config

pytestmark = pytest.mark.timeout(180)


def _jagged(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _ids(n: int, prefix: str = "s") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def test_write_back_adds_column_and_both_read_back(tq_client: TQDataPlaneClient, tq_pid: str) -> None:
    ids = _ids(4)
    tq_client.register_partition(tq_pid, ["tokens", "adv"], 4, ["train"])
    tokens = torch.arange(20, dtype=torch.int64).view(4, 5)
    tq_client.put_samples(ids, tq_pid, TensorDict({"tokens": tokens}, batch_size=[4]))
    adv = torch.randn(4, 5)
    receipt = tq_client.put_samples(ids, tq_pid, TensorDict({"adv": adv}, batch_size=[4]))
    assert receipt.fields == ["adv"]
    out = tq_client.get_samples(ids, tq_pid, ["tokens", "adv"])
    assert torch.equal(out["tokens"], tokens)
    assert torch.equal(out["adv"], adv)
    # Overwrite an existing column with the same dtype: last write wins.
    adv2 = adv * 2
    tq_client.put_samples(ids[:2], tq_pid, TensorDict({"adv": adv2[:2]}, batch_size=[2]))
    out = tq_client.get_samples(ids, tq_pid, ["adv"])
    assert torch.equal(out["adv"][:2], adv2[:2])
    assert torch.equal(out["adv"][2:], adv[2:])
    # New ids into a live partition are allowed (num_samples is a sizing hint).
    more = ["x0", "x1"]
    tq_client.put_samples(more, tq_pid, TensorDict({"tokens": tokens[:2] + 100}, batch_size=[2]))
    assert tq_client.list_sample_ids(tq_pid) == sorted(ids + more)


def test_write_columns_lands_token_aligned_field_with_first_write_lengths(
    tq_client: TQDataPlaneClient, tq_pid: str
) -> None:
    from nemo_dp.data_plane.interfaces import KVBatchMeta

    ids = _ids(3)
    lengths = torch.tensor([2, 5, 3])
    tq_client.register_partition(tq_pid, ["input_ids", "advantages"], 3, ["train"])
    padded = torch.arange(15, dtype=torch.int64).view(3, 5)
    td = pack_jagged_fields({"input_ids": padded}, lengths=lengths, token_aligned_fields={"input_ids"})
    tq_client.put_samples(ids, tq_pid, td)
    meta = KVBatchMeta(tq_pid, "train", ids, fields=["input_ids"], sequence_lengths=lengths.tolist())
    adv = torch.randn(3, 8)  # wider than the longest row: trailing columns are dropped
    write_columns(tq_client, meta, {"advantages": adv})
    out = tq_client.get_samples(ids, tq_pid, ["advantages"])
    rows = out["advantages"].unbind()
    for i, n in enumerate(lengths.tolist()):
        assert torch.equal(rows[i], adv[i, :n])


def test_layouts_dense_1d_ragged_and_object(tq_client: TQDataPlaneClient, tq_pid: str) -> None:
    n = 5
    ids = _ids(n)
    fields = ["dense2d", "dense3d", "col_n1", "scalar", "ragged", "ragged3d", "label", "bf16"]
    tq_client.register_partition(tq_pid, fields, n, ["t"])
    dense2d = torch.randn(n, 7)
    dense3d = torch.randint(0, 100, (n, 3, 4), dtype=torch.int32)
    col_n1 = torch.arange(n, dtype=torch.int64).view(n, 1)
    scalar = torch.tensor([0.5, -1.0, 2.0, 3.5, 0.0])
    ragged_rows = [torch.arange(i + 1, dtype=torch.int64) for i in range(n)]
    ragged3d_rows = [torch.randn(i + 2, 3) for i in range(n)]
    labels = ["a", "bb", "", "ddd", "e"]
    bf16 = torch.randn(n, 4).to(torch.bfloat16)
    td = TensorDict(
        {
            "dense2d": dense2d,
            "dense3d": dense3d,
            "col_n1": col_n1,
            "scalar": scalar,
            "ragged": _jagged(ragged_rows),
            "ragged3d": _jagged(ragged3d_rows),
            "label": NonTensorStack(*labels),
            "bf16": bf16,
        },
        batch_size=[n],
    )
    tq_client.put_samples(ids, tq_pid, td)
    order = [3, 0, 4, 1, 2]
    req = [ids[i] for i in order]
    out = tq_client.get_samples(req, tq_pid, fields)
    assert out.batch_size == torch.Size([n])
    assert set(out.keys()) == set(fields)
    for name, ref in (("dense2d", dense2d), ("dense3d", dense3d), ("col_n1", col_n1), ("bf16", bf16)):
        got = out[name]
        assert not got.is_nested, name
        assert got.dtype == ref.dtype and got.shape == ref.shape, name
        assert torch.equal(got, ref[order]), name
    assert out["scalar"].shape == (n,) and not out["scalar"].is_nested
    assert torch.equal(out["scalar"], scalar[order])
    for name, rows in (("ragged", ragged_rows), ("ragged3d", ragged3d_rows)):
        got = out[name]
        assert got.is_nested, name
        for pos, i in enumerate(order):
            assert torch.equal(got.unbind()[pos], rows[i]), name
    label = out.get("label")
    assert isinstance(label, NonTensorStack)
    assert label.tolist() == [labels[i] for i in order]


def test_object_column_dicts_and_none_via_read_columns(tq_client: TQDataPlaneClient, tq_pid: str) -> None:
    from nemo_dp.data_plane.interfaces import KVBatchMeta

    ids = _ids(4)
    tq_client.register_partition(tq_pid, ["info", "reward"], 4, ["t"])
    values = np.empty(4, dtype=object)
    for i, v in enumerate([{"a": 1}, None, {"b": [1, 2]}, "text"]):
        values[i] = v
    td = pack_jagged_fields({"info": values, "reward": torch.arange(4.0)}, lengths=None)
    tq_client.put_samples(ids, tq_pid, td)
    meta = KVBatchMeta(tq_pid, "t", ids, fields=["info", "reward"])
    cols = read_columns(tq_client, meta, ["info", "reward"])
    got = cols["info"]
    assert isinstance(got, np.ndarray) and got.dtype == object and got.shape == (4,)
    assert list(got) == list(values)
    assert torch.equal(cols["reward"], torch.arange(4.0))


def test_non_tensor_data_leaf_rejected(tq_client: TQDataPlaneClient, tq_pid: str) -> None:
    tq_client.register_partition(tq_pid, ["label", "x"], 2, ["t"])
    td = TensorDict({"x": torch.zeros(2)}, batch_size=[2])
    td.set("label", NonTensorData(["a", "b"], batch_size=[2]))
    assert isinstance(td.get("label"), NonTensorData)
    with pytest.raises(TypeError, match="non-tensor"):
        tq_client.put_samples(["a", "b"], tq_pid, td)
    assert tq_client.list_sample_ids(tq_pid) == []
    # Also named as such when the field already holds tensors.
    tq_client.put_samples(["a", "b"], tq_pid, TensorDict({"label": torch.zeros(2)}, batch_size=[2]))
    td2 = TensorDict({}, batch_size=[2])
    td2.set("label", NonTensorData(["a", "b"], batch_size=[2]))
    with pytest.raises(TypeError, match="non-tensor"):
        tq_client.put_samples(["a", "b"], tq_pid, td2)
    assert torch.equal(tq_client.get_samples(["a", "b"], tq_pid, ["label"])["label"], torch.zeros(2))


def test_dtype_change_rejected_and_stored_values_unchanged(
    tq_client: TQDataPlaneClient, tq_pid: str
) -> None:
    ids = _ids(3)
    tq_client.register_partition(tq_pid, ["tokens", "label"], 3, ["t"])
    tokens = torch.arange(6, dtype=torch.int64).view(3, 2)
    tq_client.put_samples(
        ids, tq_pid, TensorDict({"tokens": tokens, "label": NonTensorStack("a", "b", "c")}, batch_size=[3])
    )
    with pytest.raises(TypeError, match="tokens") as info:
        tq_client.put_samples(ids, tq_pid, TensorDict({"tokens": tokens.float()}, batch_size=[3]))
    assert "torch.int64" in str(info.value) and "torch.float32" in str(info.value)
    # Other ids: still the same partition-wide dtype.
    with pytest.raises(TypeError, match="tokens"):
        tq_client.put_samples(["z"], tq_pid, TensorDict({"tokens": tokens[:1].int()}, batch_size=[1]))
    # Kind switch object -> tensor.
    with pytest.raises(TypeError, match="label"):
        tq_client.put_samples(ids, tq_pid, TensorDict({"label": torch.zeros(3)}, batch_size=[3]))
    assert tq_client.list_sample_ids(tq_pid) == ids
    out = tq_client.get_samples(ids, tq_pid, ["tokens", "label"])
    assert out["tokens"].dtype == torch.int64
    assert torch.equal(out["tokens"], tokens)
    assert out.get("label").tolist() == ["a", "b", "c"]


def test_dtype_registry_is_per_incarnation(tq_client: TQDataPlaneClient, tq_pid: str) -> None:
    tq_client.register_partition(tq_pid, ["x"], 1, ["t"])
    tq_client.put_samples(["a"], tq_pid, TensorDict({"x": torch.zeros(1, 2)}, batch_size=[1]))
    tq_client.clear_samples(None, tq_pid)
    tq_client.register_partition(tq_pid, ["x"], 1, ["t"])
    tq_client.put_samples(["a"], tq_pid, TensorDict({"x": torch.ones(1, 2, dtype=torch.int64)}, batch_size=[1]))
    out = tq_client.get_samples(["a"], tq_pid, ["x"])
    assert out["x"].dtype == torch.int64


def test_enums_checked_before_write(tq_client: TQDataPlaneClient, tq_pid: str) -> None:
    tq_client.register_partition(tq_pid, ["status", "x"], 2, ["t"], enums={"status": ["ok", "bad"]})
    with pytest.raises(ValueError, match="status.*'maybe'|'maybe'.*status"):
        tq_client.put_samples(
            ["a", "b"], tq_pid, TensorDict({"status": NonTensorStack("ok", "maybe")}, batch_size=[2])
        )
    assert tq_client.list_sample_ids(tq_pid) == []
    tq_client.put_samples(["a", "b"], tq_pid, TensorDict({"status": NonTensorStack("ok", "bad")}, batch_size=[2]))
    assert tq_client.get_samples(["b"], tq_pid, ["status"]).get("status").tolist() == ["bad"]
    with pytest.raises(ValueError, match="enums"):
        tq_client.register_partition(tq_pid + "_2", ["x"], 1, [], enums={"nope": ["a"]})
    with pytest.raises(ValueError, match="unique"):
        tq_client.register_partition(tq_pid + "_3", ["x"], 1, [], enums={"x": ["a", "a"]})


def test_tags_replace_and_untouched_without_tags(tq_client: TQDataPlaneClient, tq_pid: str) -> None:
    ids = _ids(2)
    tq_client.register_partition(tq_pid, ["x", "y"], 2, ["t", "u"])
    tq_client.put_samples(
        ids, tq_pid, TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2]), tags=[{"k": 1, "keep": "a"}, {"k": 2}]
    )
    tq_client.put_samples(ids, tq_pid, TensorDict({"y": torch.ones(2)}, batch_size=[2]))
    claimed = tq_client.claim_meta(tq_pid, "t", ["x", "y"], 2, timeout_s=10)
    by_id = dict(zip(claimed.sample_ids, claimed.tags or [], strict=True))
    assert by_id == {"s0": {"k": 1, "keep": "a"}, "s1": {"k": 2}}
    # A tags-only put replaces each id's tag dict.
    receipt = tq_client.put_samples(ids, tq_pid, tags=[{"k": 10}, {"k": 20, "input_lengths": 3}])
    assert receipt.fields is None and receipt.tags == [{"k": 10}, {"k": 20, "input_lengths": 3}]
    claimed = tq_client.claim_meta(tq_pid, "u", ["x"], 2, timeout_s=10)
    by_id = dict(zip(claimed.sample_ids, claimed.tags or [], strict=True))
    assert by_id == {"s0": {"k": 10}, "s1": {"k": 20, "input_lengths": 3}}
    assert claimed.sequence_lengths is None  # not every row carries input_lengths
    with pytest.raises(TypeError):
        tq_client.put_samples(ids, tq_pid, tags=[{"bad": object()}, {}])


@ray.remote(num_cpus=0, max_concurrency=2)
class _StarvedClaimer:
    """Attached client in another process that sits in a blocking claim.

    Two threads: ``wait_claiming`` answers while ``claim`` blocks, so the test starts probing
    only once the claim has begun.
    """

    def __init__(self, cfg: Any) -> None:
        self.client = TQDataPlaneClient(cfg, bootstrap=False)
        self.claiming = threading.Event()

    def wait_claiming(self, timeout_s: float) -> bool:
        return self.claiming.wait(timeout_s)

    def claim(self, pid: str, timeout_s: float) -> tuple[str, float]:
        start = time.monotonic()
        self.claiming.set()
        try:
            self.client.claim_meta(pid, "t", ["x"], 100, timeout_s=timeout_s)
        except TimeoutError as exc:
            return f"timeout: {exc}", time.monotonic() - start
        return "claimed", time.monotonic() - start

    def close(self) -> None:
        self.client.close()


def test_starved_blocking_claim_does_not_stall_other_process(
    tq_client: TQDataPlaneClient, tq_pid: str
) -> None:
    tq_client.register_partition(tq_pid, ["x"], 100, ["t"])
    tq_client.put_samples(["a", "b"], tq_pid, TensorDict({"x": torch.zeros(2)}, batch_size=[2]))
    actor = _StarvedClaimer.remote(tq_test_config())
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=120)
        pending = actor.claim.remote(tq_pid, 4.0)
        assert ray.get(actor.wait_claiming.remote(60.0), timeout=120), "the claim never started"
        worst = 0.0
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            t0 = time.monotonic()
            assert tq_client.list_sample_ids(tq_pid) == ["a", "b"]
            worst = max(worst, time.monotonic() - t0)
            ready, _ = ray.wait([pending], timeout=0)
            assert ready == [], "the claim ended before the probes did: they did not overlap it"
            time.sleep(0.1)
        assert worst < 1.0, f"list_sample_ids took {worst:.2f}s during a starved claim"
        outcome, waited = ray.get(pending, timeout=60)
        assert outcome.startswith("timeout") and tq_pid in outcome and "'t'" in outcome
        assert 3.5 <= waited < 15.0
        ray.get(actor.close.remote(), timeout=60)
    finally:
        ray.kill(actor)


def test_callers_torch_threads_unchanged(tq_client: TQDataPlaneClient, tq_pid: str) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        tq_client.register_partition(tq_pid, ["x", "r"], 8, ["t"])
        rows = [torch.randn(i + 3) for i in range(8)]
        tq_client.put_samples(
            _ids(8), tq_pid, TensorDict({"x": torch.randn(8, 64), "r": _jagged(rows)}, batch_size=[8])
        )
        assert torch.get_num_threads() == 1
        tq_client.get_samples(_ids(8), tq_pid, ["x", "r"])
        assert torch.get_num_threads() == 1
        tq_client.claim_meta(tq_pid, "t", ["x"], 8, timeout_s=10)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_close_removes_actors_and_is_idempotent(tq_session: TQSession) -> None:
    client = tq_session.client
    unit = f"{STORAGE_UNIT_NAME_PREFIX}0"
    assert tq_controller_exists()
    ray.get_actor(unit)  # resolves while the system is up
    assert client.backend_config.controller.polling_mode is True
    assert client.backend_config.backend.SimpleStorage.num_data_storage_units == 1
    client.close()
    assert not tq_controller_exists()
    with pytest.raises(ValueError):
        ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE)
    deadline = time.monotonic() + 15
    while True:
        try:
            ray.get_actor(unit)
        except ValueError:
            break
        assert time.monotonic() < deadline, "storage unit actor still resolvable after close"
        time.sleep(0.1)
    client.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        client.list_sample_ids("p")
    # The next session access bootstraps a fresh system.
    assert tq_session.client is not client
    assert tq_controller_exists()


def test_second_client_in_one_process_rejected(tq_client: TQDataPlaneClient) -> None:
    with pytest.raises(RuntimeError, match="already open"):
        TQDataPlaneClient(tq_test_config(), bootstrap=False)


def test_init_ray_guards(ray_cluster: dict[str, str]) -> None:
    from nemo_dp.data_plane.registry import ray_start_args, reserved_ray_cpus
    from nemo_dp.distributed.ray_init import init_ray

    assert reserved_ray_cpus(tq_test_config()) == 2
    assert reserved_ray_cpus(tq_test_config(num_storage_units=3)) == 4
    assert reserved_ray_cpus(None) == 0
    # The budget check fails fast, before anything touches Ray.
    with pytest.raises(ValueError) as info:
        init_ray(num_cpus=2, **ray_start_args(tq_test_config(num_storage_units=2)))
    assert "cluster.num_cpus" in str(info.value)
    assert "data_plane.simple.num_storage_units" in str(info.value)
    # The session Ray is running: a second init is refused instead of silently reused.
    with pytest.raises(RuntimeError, match="already initialised"):
        init_ray(num_cpus=2, **ray_start_args(tq_test_config()))
    assert ray_cluster["TQ_NUM_THREADS"] == "2"
    assert set(ray_cluster) >= {
        "TQ_SIMPLE_STORAGE_SEND_RECV_TIMEOUT",
        "TQ_SIMPLE_STORAGE_MAX_ATTEMPTS",
        "TQ_SIMPLE_STORAGE_PROBE_TIMEOUT",
        "TQ_DATA_UPDATE_RESPONSE_TIMEOUT",
    }
