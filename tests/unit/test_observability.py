"""``MetricsDataPlaneClient`` tests.

Most tests wrap the real ``LocalDataPlaneClient``.  Two fakes are used, each only where the real
adapter cannot produce the situation deterministically:

* ``_FailingClient`` - an inner client whose every method raises a given exception; it isolates
  the wrapper's failure/timeout status handling (the Local adapter never times out).
* ``_FakeTime`` - a stand-in for the ``time`` module inside ``observability``; it isolates the
  latency histogram math from real (noisy) call durations.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from nemo_dp.data_plane import observability
from nemo_dp.data_plane.adapters import local
from nemo_dp.data_plane.interfaces import (
    DataPlaneClient,
    DataPlaneUnavailableError,
    LocalDataPlaneConfig,
)
from nemo_dp.data_plane.observability import (
    LATENCY_EDGES_MS,
    DataPlaneStats,
    MetricsDataPlaneClient,
    is_metrics_client,
    log_event,
    payload_nbytes,
)


EVENT_KEYS = {"op", "partition_id", "n_keys", "n_bytes", "wall_ms", "status"}


def _local(max_partitions: int = 4) -> Any:
    return local.LocalDataPlaneClient(LocalDataPlaneConfig(max_partitions=max_partitions))


def _wrapped(events: list[dict] | None = None, max_partitions: int = 4) -> MetricsDataPlaneClient:
    sink = events.append if events is not None else None
    return MetricsDataPlaneClient(_local(max_partitions), on_event=sink)


def _ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def _put_f32(client: DataPlaneClient, pid: str, n: int) -> list[str]:
    ids = _ids(pid + "_", n)
    client.register_partition(pid, fields=["x"], num_samples=n, consumer_tasks=["t"])
    client.put_samples(ids, pid, TensorDict({"x": torch.ones(n, dtype=torch.float32)}, [n]))
    return ids


# --- events ---------------------------------------------------------------------------------


def test_put_get_register_clear_events() -> None:
    events: list[dict] = []
    client = _wrapped(events)
    ids = _put_f32(client, "p", 4)
    assert [e["op"] for e in events] == ["register", "put"]
    reg, put = events
    assert reg == {**reg, "op": "register", "partition_id": "p", "n_keys": 4, "status": "ok"}
    assert set(put) == EVENT_KEYS
    assert put["n_keys"] == 4 and put["n_bytes"] == 16 and put["status"] == "ok"
    assert put["wall_ms"] >= 0 and put["partition_id"] == "p"

    events.clear()
    out = client.get_samples(ids, "p", ["x"])
    assert torch.equal(out["x"], torch.ones(4))
    (get,) = events
    assert get["op"] == "get" and get["n_keys"] == 4 and get["n_bytes"] == 16 > 0

    events.clear()
    assert client.list_sample_ids("p") == sorted(ids)
    client.clear_samples(ids[:1], "p")
    client.clear_samples(None, "p")
    assert [(e["op"], e["n_keys"]) for e in events] == [("list_sample_ids", 4), ("clear", 1), ("clear", 0)]
    client.close()
    client.close()


def test_task_mediated_ops_and_lifetime_events(tmp_path: Any) -> None:
    events: list[dict] = []
    client = _wrapped(events)
    _put_f32(client, "p", 4)
    events.clear()
    meta = client.claim_meta("p", "t", ["x"], batch_size=3)
    td = client.get_data(meta)
    assert client.check_consumption_status("p", ["t"]) is False
    assert td.batch_size == torch.Size([3])
    claim, get_data, check = events
    assert (claim["op"], claim["n_keys"]) == ("claim_meta", 3)
    assert (get_data["op"], get_data["n_keys"], get_data["n_bytes"]) == ("get_data", 3, 12)
    assert (check["op"], check["n_keys"], check["n_bytes"]) == ("check_consumption_status", 0, 0)

    events.clear()
    client.save_checkpoint(tmp_path / "ckpt", metadata={"step": 1})
    fresh = _wrapped(events)
    assert fresh.load_checkpoint(tmp_path / "ckpt") == {"step": 1}
    client.close()
    assert [(e["op"], e["partition_id"], e["status"]) for e in events] == [
        ("save_checkpoint", "", "ok"),
        ("load_checkpoint", "", "ok"),
        ("close", "", "ok"),
    ]
    fresh.close()


def test_inner_error_is_reraised_with_error_status() -> None:
    events: list[dict] = []
    client = _wrapped(events)
    with pytest.raises(KeyError, match="'missing'"):
        client.get_samples(["a"], "missing", ["x"])
    (event,) = events
    assert event["status"] == "error" and event["op"] == "get" and event["n_bytes"] == 0
    client.close()
    events.clear()
    with pytest.raises(RuntimeError, match="closed"):
        client.list_sample_ids("p")
    assert events[0]["status"] == "error"


class _FailingClient(DataPlaneClient):
    """Fake inner client: every method raises ``exc``.  Isolates the wrapper's status logic."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise self.exc

    register_partition = claim_meta = get_data = _fail  # type: ignore[assignment]
    check_consumption_status = _fail  # type: ignore[assignment]
    put_samples = get_samples = list_sample_ids = clear_samples = _fail  # type: ignore[assignment]
    save_checkpoint = load_checkpoint = close = _fail  # type: ignore[assignment]


@pytest.mark.parametrize(
    "exc, status",
    [
        (RuntimeError("boom"), "error"),
        (ValueError("bad"), "error"),
        (TimeoutError("slow"), "timeout"),
        (DataPlaneUnavailableError("dead controller"), "timeout"),
    ],
)
def test_failure_status_and_original_exception(exc: BaseException, status: str) -> None:
    events: list[dict] = []
    client = MetricsDataPlaneClient(_FailingClient(exc), on_event=events.append)
    with pytest.raises(type(exc)) as info:
        client.put_samples(["a"], "p", TensorDict({"x": torch.zeros(1)}, [1]))
    assert info.value is exc
    (event,) = events
    assert event["status"] == status and event["op"] == "put"
    assert client.stats == DataPlaneStats()  # failures never count as successful ops
    metrics = client.get_step_metrics(1.0)
    assert metrics["step/put/calls"] == 1.0 and metrics["step/put/errors"] == 1.0
    assert metrics["step/bytes_written_mb"] == 0.0


def test_sink_exception_is_logged_and_suppressed(caplog: pytest.LogCaptureFixture) -> None:
    def bad_sink(event: dict) -> None:
        raise RuntimeError("sink broke")

    client = MetricsDataPlaneClient(_local(), on_event=bad_sink)
    with caplog.at_level(logging.ERROR, logger=observability.__name__):
        client.register_partition("p", fields=[], num_samples=1, consumer_tasks=[])
    assert client.list_sample_ids("p") == []
    assert any("event sink raised" in r.getMessage() for r in caplog.records)
    client.close()


def test_no_callback_and_log_event(caplog: pytest.LogCaptureFixture) -> None:
    client = MetricsDataPlaneClient(_local())
    assert is_metrics_client(client) and not is_metrics_client(client.inner)
    _put_f32(client, "p", 2)
    client.close()
    client.close()
    with caplog.at_level(logging.INFO, logger=observability.__name__):
        log_event({"op": "put"})
    assert [r.getMessage() for r in caplog.records] == ["data_plane_event: {'op': 'put'}"]


def test_wrapper_requires_a_client() -> None:
    with pytest.raises(TypeError, match="DataPlaneClient"):
        MetricsDataPlaneClient(object())  # type: ignore[arg-type]


def test_payload_bytes_nested_and_non_tensor() -> None:
    rows = [torch.arange(3), torch.arange(5)]
    td = TensorDict(
        {
            "tok": torch.nested.as_nested_tensor(rows, layout=torch.jagged),
            "lp": torch.zeros(2, 4, dtype=torch.bfloat16),
            "content": NonTensorStack("a", "b"),
        },
        batch_size=[2],
    )
    assert payload_nbytes(td) == 8 * 8 + 2 * 4 * 2
    assert payload_nbytes(None) == 0
    events: list[dict] = []
    client = _wrapped(events)
    client.register_partition(
        "p", fields=["tok", "lp", "content"], num_samples=2, consumer_tasks=[]
    )
    client.put_samples(["a", "b"], "p", td)
    assert events[-1]["n_bytes"] == 80
    client.get_samples(["a", "b"], "p", ["content"])
    assert events[-1]["n_bytes"] == 0  # non-tensor leaves count 0
    client.close()


# --- outstanding bytes ------------------------------------------------------------------------


def test_outstanding_bytes_lifecycle() -> None:
    client = _wrapped(max_partitions=3)
    ids = _put_f32(client, "p1", 4)  # 16 bytes
    assert client.stats.bytes_outstanding == 16
    _put_f32(client, "p2", 8)  # 32 bytes
    assert client.bytes_outstanding_by_partition() == {"p1": 16, "p2": 32}
    assert client.stats.bytes_outstanding == 48
    client.clear_samples(ids[:2], "p1")
    assert client.bytes_outstanding_by_partition() == {"p1": 8, "p2": 32}
    assert client.snapshot()["n_keys_outstanding"] == 10
    client.clear_samples(None, "p2")
    stats = client.stats
    assert stats.bytes_outstanding == 8 and stats.peak_bytes_outstanding == 48
    assert client.bytes_outstanding_by_partition() == {"p1": 8}
    snap = client.snapshot()
    assert snap["bytes_outstanding"] == 8 and snap["peak_bytes_outstanding"] == 48
    assert snap["n_keys_outstanding"] == 2
    assert snap["last_put_bytes_per_key"] == 4 and snap["max_bytes_per_key_seen"] == 4
    assert snap["total_ops"] == 6  # 2 registers, 2 puts, 2 clears
    client.close()


def test_uneven_split_gives_remainder_to_first_keys() -> None:
    client = _wrapped()
    rows = [torch.zeros(n, dtype=torch.uint8) for n in (1, 2, 3, 4)]  # 10 bytes over 4 keys
    td = TensorDict({"b": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}, [4])
    client.register_partition("p", fields=["b"], num_samples=4, consumer_tasks=[])
    client.put_samples(["k0", "k1", "k2", "k3"], "p", td)
    assert client.stats.bytes_outstanding == 10
    client.clear_samples(["k0"], "p")  # share 2 + remainder 1
    assert client.stats.bytes_outstanding == 7
    client.clear_samples(["k3"], "p")  # share 2
    assert client.stats.bytes_outstanding == 5
    client.close()


def test_failed_put_does_not_count_outstanding() -> None:
    client = _wrapped()
    ids = _put_f32(client, "p", 2)
    with pytest.raises(ValueError):
        client.put_samples(ids, "p", TensorDict({"x": torch.ones(2)}, [2]))  # duplicate writes
    assert client.stats.bytes_outstanding == 8
    client.close()


# --- step metrics --------------------------------------------------------------------------


class _FakeTime:
    """Stand-in for ``time`` in the observability module: each call lasts the next duration."""

    def __init__(self, durations_ms: Iterable[float]) -> None:
        self._durations = list(durations_ms)
        self._now = 100.0
        self._started = False

    def perf_counter(self) -> float:
        if self._started:
            self._now += self._durations.pop(0) / 1000.0
        self._started = not self._started
        return self._now


def test_step_metrics_keys_units_and_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _wrapped()
    # register 2 ms, put 3 ms, get 5 ms, list 10 ms -> wall 20 ms
    monkeypatch.setattr(observability, "time", _FakeTime([2.0, 3.0, 5.0, 10.0]))
    ids = _put_f32(client, "p", 4)
    client.get_samples(ids, "p", ["x"])
    client.list_sample_ids("p")
    metrics = client.get_step_metrics(step_time_s=0.1)
    assert metrics["step/wall_ms"] == pytest.approx(20.0)
    assert metrics["step/frac_of_step"] == pytest.approx(20.0 / 100.0)
    assert metrics["step/bytes_written_mb"] == pytest.approx(16 / 1e6)
    assert metrics["step/bytes_read_mb"] == pytest.approx(16 / 1e6)
    assert metrics["now/bytes_outstanding_mb"] == pytest.approx(16 / 1e6)
    for op in ("register", "put", "get", "list_sample_ids"):
        for suffix in ("calls", "errors", "wall_ms", "mean_ms", "max_ms", "mb", "rows"):
            assert f"step/{op}/{suffix}" in metrics
        assert f"step/{op}/p50_ms" not in metrics and f"step/{op}/p90_ms" not in metrics
    assert metrics["step/put/wall_ms"] == pytest.approx(3.0)
    assert metrics["step/put/mb"] == pytest.approx(16 / 1e6)
    assert metrics["step/list_sample_ids/max_ms"] == pytest.approx(10.0)
    # rows: the keys each op touched in the window (register counts its num_samples).
    assert metrics["step/put/rows"] == 4.0 and metrics["step/get/rows"] == 4.0
    assert metrics["step/list_sample_ids/rows"] == 4.0 and metrics["step/register/rows"] == 4.0
    # The window resets; the outstanding level does not.
    again = client.get_step_metrics(step_time_s=1.0)
    assert again == {
        "step/wall_ms": 0.0,
        "step/bytes_written_mb": 0.0,
        "step/bytes_read_mb": 0.0,
        "step/frac_of_step": 0.0,
        "now/bytes_outstanding_mb": pytest.approx(16 / 1e6),
    }
    with pytest.raises(ValueError, match="step_time_s"):
        client.get_step_metrics(0.0)
    monkeypatch.setattr(observability, "time", time)
    client.close()


def test_percentiles_thresholds_and_clamping(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _wrapped()
    client.register_partition("p", fields=[], num_samples=1, consumer_tasks=[])

    def run(durations: list[float]) -> dict[str, float]:
        monkeypatch.setattr(observability, "time", _FakeTime(durations))
        for _ in durations:
            client.list_sample_ids("p")
        return client.get_step_metrics(1.0)

    client.get_step_metrics(1.0)
    m = run([3.0] * 19)
    assert "step/list_sample_ids/p50_ms" not in m
    m = run([3.0] * 20)  # bucket (2.5, 5] -> edge 5, clamped to max 3
    assert m["step/list_sample_ids/p50_ms"] == pytest.approx(3.0) and "step/list_sample_ids/p90_ms" not in m
    m = run([0.05] * 30 + [30.0] * 10)
    assert m["step/list_sample_ids/p50_ms"] == pytest.approx(0.1)  # upper edge of the first bucket
    assert m["step/list_sample_ids/p90_ms"] == pytest.approx(30.0)  # edge 50 clamped to max 30
    m = run([7000.0] * 40)  # the open (+inf) bucket reports max_ms
    assert m["step/list_sample_ids/p90_ms"] == pytest.approx(7000.0)
    assert m["step/list_sample_ids/mean_ms"] == pytest.approx(7000.0)
    monkeypatch.setattr(observability, "time", time)
    client.close()


def test_histogram_edges_are_the_contract_edges() -> None:
    assert LATENCY_EDGES_MS == (
        0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000,
    )
