"""Timing, byte accounting and per-step metrics for any ``DataPlaneClient`` (``observability.enabled``)."""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from os import PathLike
from typing import TYPE_CHECKING, Any

import torch

from nemo_dp.data_plane.interfaces import DataPlaneClient, KVBatchMeta

if TYPE_CHECKING:  # pragma: no cover - typing only
    from tensordict import TensorDict

__all__ = [
    "LATENCY_EDGES_MS",
    "P50_MIN_CALLS",
    "P90_MIN_CALLS",
    "DataPlaneStats",
    "MetricsDataPlaneClient",
    "is_metrics_client",
    "log_event",
    "payload_nbytes",
]

_LOG = logging.getLogger(__name__)

#: Upper bucket edges (ms) of the fixed latency histogram; a last bucket runs to +inf.
LATENCY_EDGES_MS: tuple[float, ...] = (
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0,
)
#: Percentiles are only reported with at least this many calls of an op in the window.
P50_MIN_CALLS = 20
P90_MIN_CALLS = 40

_MB = 1_000_000.0

EventSink = Callable[[dict[str, Any]], None]


def log_event(event: dict[str, Any]) -> None:
    """Event sink that logs ``"data_plane_event: %s"`` at INFO."""
    _LOG.info("data_plane_event: %s", event)


def _tensor_nbytes(t: torch.Tensor) -> int:
    if t.is_nested:
        if t.layout == torch.jagged:
            values = t.values()
            return int(values.numel() * values.element_size())
        return int(sum(r.numel() * r.element_size() for r in t.unbind()))
    return int(t.numel() * t.element_size())


def payload_nbytes(td: Any) -> int:
    """``numel * element_size`` summed over a payload's top-level tensor leaves (nested: their values).

    Non-tensor leaves, ``None`` and anything that is not ``TensorDict``-like count 0.
    """
    if td is None or not hasattr(td, "keys") or not hasattr(td, "get"):
        return 0
    total = 0
    for key in td.keys():
        leaf = td.get(key)
        if isinstance(leaf, torch.Tensor):
            total += _tensor_nbytes(leaf)
    return total


@dataclass
class DataPlaneStats:
    """Cumulative counters over successful operations of one wrapper (this process only).

    ``bytes_outstanding``: put through this wrapper and not yet cleared; ``*_per_key``: ``n_bytes // n_keys``
    of successful puts and reads (``last_put_*``: of the last put with keys).
    """

    total_bytes: int = 0
    total_keys: int = 0
    total_ops: int = 0
    bytes_outstanding: int = 0
    peak_bytes_outstanding: int = 0
    max_bytes_per_key_seen: int = 0
    last_put_bytes_per_key: int = 0


@dataclass
class _OpWindow:
    calls: int = 0
    errors: int = 0
    wall_ms: float = 0.0
    max_ms: float = 0.0
    n_bytes: int = 0
    n_keys: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_EDGES_MS) + 1))

    def percentile(self, q: float) -> float:
        """Upper edge of the bucket where the cumulative count first reaches ``q * calls``."""
        target = q * self.calls
        cumulative = 0
        for i, count in enumerate(self.buckets):
            cumulative += count
            if count and cumulative >= target:
                edge = LATENCY_EDGES_MS[i] if i < len(LATENCY_EDGES_MS) else float("inf")
                return min(edge, self.max_ms)
        return self.max_ms  # pragma: no cover - unreachable when calls > 0


@dataclass
class _Call:
    op: str
    partition_id: str
    n_keys: int = 0
    n_bytes: int = 0


class MetricsDataPlaneClient(DataPlaneClient):
    """A ``DataPlaneClient`` that forwards to ``inner`` and records every call.

    Each call emits ``{"op", "partition_id", "n_keys", "n_bytes", "wall_ms", "status"}`` to ``on_event``
    (``status``: ``"ok"``, ``"error"``, or ``"timeout"`` for any ``TimeoutError``).  Inner exceptions
    are re-raised unchanged; ``on_event``'s are logged and suppressed.  Failed calls count in the
    window's calls, errors and latencies, not in bytes or :class:`DataPlaneStats`.
    """

    def __init__(self, inner: DataPlaneClient, on_event: EventSink | None = None) -> None:
        if not isinstance(inner, DataPlaneClient):
            raise TypeError(f"MetricsDataPlaneClient wraps a DataPlaneClient, got {type(inner).__name__}")
        self._inner = inner
        self._on_event = on_event
        self._lock = threading.Lock()
        self._stats = DataPlaneStats()
        self._outstanding: dict[str, dict[str, int]] = {}
        self._window: dict[str, _OpWindow] = {}
        self._window_wall_ms = 0.0
        self._window_written = 0
        self._window_read = 0

    @property
    def inner(self) -> DataPlaneClient:
        return self._inner

    @contextmanager
    def _record(self, op: str, partition_id: str) -> Iterator[_Call]:
        call = _Call(op=op, partition_id=partition_id)
        start = time.perf_counter()
        status = "ok"
        try:
            yield call
        except TimeoutError:
            status = "timeout"
            raise
        except BaseException:
            status = "error"
            raise
        finally:
            wall_ms = (time.perf_counter() - start) * 1000.0
            self._account(call, wall_ms, status)
            self._emit(call, wall_ms, status)

    def _account(self, call: _Call, wall_ms: float, status: str) -> None:
        with self._lock:
            win = self._window.setdefault(call.op, _OpWindow())
            win.calls += 1
            win.wall_ms += wall_ms
            win.max_ms = max(win.max_ms, wall_ms)
            win.buckets[bisect.bisect_left(LATENCY_EDGES_MS, wall_ms)] += 1
            self._window_wall_ms += wall_ms
            if status != "ok":
                win.errors += 1
                return
            win.n_bytes += call.n_bytes
            win.n_keys += call.n_keys
            if call.op == "put":
                self._window_written += call.n_bytes
            elif call.op in ("get", "get_data"):
                self._window_read += call.n_bytes
            st = self._stats
            st.total_ops += 1
            st.total_keys += call.n_keys
            st.total_bytes += call.n_bytes
            if call.n_keys and call.op in ("put", "get", "get_data"):
                per_key = call.n_bytes // call.n_keys
                st.max_bytes_per_key_seen = max(st.max_bytes_per_key_seen, per_key)
                if call.op == "put":
                    st.last_put_bytes_per_key = per_key

    def _emit(self, call: _Call, wall_ms: float, status: str) -> None:
        if self._on_event is None:
            return
        event = {**asdict(call), "wall_ms": wall_ms, "status": status}
        try:
            self._on_event(event)
        except Exception:  # a broken sink must never fail a data-plane call
            _LOG.exception("data-plane event sink raised; event dropped: %s", event)

    def _refresh_outstanding_locked(self) -> None:
        total = sum(sum(keys.values()) for keys in self._outstanding.values())
        self._stats.bytes_outstanding = total
        self._stats.peak_bytes_outstanding = max(self._stats.peak_bytes_outstanding, total)

    def _attribute_put(self, partition_id: str, sample_ids: Sequence[str], n_bytes: int) -> None:
        n = len(sample_ids)
        with self._lock:
            keys = self._outstanding.setdefault(partition_id, {})
            if n:
                share, remainder = divmod(n_bytes, n)
                for i, sid in enumerate(sample_ids):
                    keys[sid] = keys.get(sid, 0) + share + (1 if i < remainder else 0)
            self._refresh_outstanding_locked()

    def _release(self, partition_id: str, sample_ids: Sequence[str] | None) -> None:
        with self._lock:
            if sample_ids is None:
                self._outstanding.pop(partition_id, None)
            else:
                keys = self._outstanding.get(partition_id, {})
                for sid in sample_ids:
                    keys.pop(sid, None)
            self._refresh_outstanding_locked()

    @property
    def stats(self) -> DataPlaneStats:
        """A copy."""
        with self._lock:
            return DataPlaneStats(**asdict(self._stats))

    def snapshot(self) -> dict[str, int]:
        """``asdict(stats)`` plus ``n_keys_outstanding`` (keys put and not yet cleared)."""
        with self._lock:
            out = asdict(self._stats)
            out["n_keys_outstanding"] = sum(len(keys) for keys in self._outstanding.values())
            return out

    def bytes_outstanding_by_partition(self) -> dict[str, int]:
        """``{partition_id: bytes}`` outstanding, for partitions this wrapper put into."""
        with self._lock:
            return {pid: sum(keys.values()) for pid, keys in self._outstanding.items()}

    def get_step_metrics(self, step_time_s: float) -> dict[str, float]:
        """Metrics of the window since the previous call (then reset); ``step_time_s`` gives ``step/frac_of_step``.

        Per-op keys for every op called in the window (``rows``: keys its successful calls touched);
        ``p50_ms`` / ``p90_ms`` only with at least 20 / 40 calls.  ``ValueError`` unless ``step_time_s`` > 0.
        """
        if not step_time_s > 0:
            raise ValueError(f"get_step_metrics: step_time_s must be > 0, got {step_time_s!r}")
        with self._lock:
            window, self._window = self._window, {}
            wall_ms, self._window_wall_ms = self._window_wall_ms, 0.0
            written, self._window_written = self._window_written, 0
            read, self._window_read = self._window_read, 0
            outstanding = self._stats.bytes_outstanding
        metrics: dict[str, float] = {
            "step/wall_ms": wall_ms,
            "step/bytes_written_mb": written / _MB,
            "step/bytes_read_mb": read / _MB,
            "step/frac_of_step": wall_ms / (1000.0 * step_time_s),
            "now/bytes_outstanding_mb": outstanding / _MB,
        }
        for op, win in sorted(window.items()):
            prefix = f"step/{op}"
            metrics[f"{prefix}/calls"] = float(win.calls)
            metrics[f"{prefix}/errors"] = float(win.errors)
            metrics[f"{prefix}/wall_ms"] = win.wall_ms
            metrics[f"{prefix}/mean_ms"] = win.wall_ms / win.calls
            metrics[f"{prefix}/max_ms"] = win.max_ms
            metrics[f"{prefix}/mb"] = win.n_bytes / _MB
            metrics[f"{prefix}/rows"] = float(win.n_keys)
            for name, q, min_calls in (("p50_ms", 0.5, P50_MIN_CALLS), ("p90_ms", 0.9, P90_MIN_CALLS)):
                if win.calls >= min_calls:
                    metrics[f"{prefix}/{name}"] = win.percentile(q)
        return metrics

    def register_partition(
        self, partition_id: str, fields: Sequence[str], num_samples: int, consumer_tasks: Sequence[str],
        grpo_group_size: int | None = None, enums: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        with self._record("register", partition_id) as call:
            call.n_keys = int(num_samples) if isinstance(num_samples, int) else 0
            self._inner.register_partition(partition_id, fields, num_samples, consumer_tasks, grpo_group_size, enums)

    def claim_meta(
        self, partition_id: str, task_name: str, required_fields: Sequence[str], batch_size: int,
        dp_rank: int | None = None, blocking: bool = True, timeout_s: float = 60.0,
    ) -> KVBatchMeta:
        with self._record("claim_meta", partition_id) as call:
            meta = self._inner.claim_meta(
                partition_id, task_name, required_fields, batch_size, dp_rank, blocking, timeout_s
            )
            call.n_keys = meta.size
            return meta

    def get_data(self, meta: KVBatchMeta, select_fields: Sequence[str] | None = None) -> TensorDict:
        with self._record("get_data", meta.partition_id) as call:
            call.n_keys = meta.size
            td = self._inner.get_data(meta, select_fields)
            call.n_bytes = payload_nbytes(td)
            return td

    def check_consumption_status(self, partition_id: str, task_names: Sequence[str]) -> bool:
        with self._record("check_consumption_status", partition_id):
            return self._inner.check_consumption_status(partition_id, task_names)

    def put_samples(
        self, sample_ids: Sequence[str], partition_id: str, fields: TensorDict | None = None,
        tags: Sequence[dict] | None = None,
    ) -> KVBatchMeta:
        with self._record("put", partition_id) as call:
            ids = list(sample_ids)
            call.n_keys = len(ids)
            call.n_bytes = payload_nbytes(fields)
            receipt = self._inner.put_samples(sample_ids, partition_id, fields, tags)
            self._attribute_put(partition_id, ids, call.n_bytes)
            return receipt

    def get_samples(self, sample_ids: Sequence[str], partition_id: str, select_fields: Sequence[str]) -> TensorDict:
        with self._record("get", partition_id) as call:
            call.n_keys = len(sample_ids)
            td = self._inner.get_samples(sample_ids, partition_id, select_fields)
            call.n_bytes = payload_nbytes(td)
            return td

    def list_sample_ids(self, partition_id: str) -> list[str]:
        with self._record("list_sample_ids", partition_id) as call:
            ids = self._inner.list_sample_ids(partition_id)
            call.n_keys = len(ids)
            return ids

    def clear_samples(self, sample_ids: Sequence[str] | None, partition_id: str) -> None:
        with self._record("clear", partition_id) as call:
            ids = None if sample_ids is None else list(sample_ids)
            call.n_keys = 0 if ids is None else len(ids)
            self._inner.clear_samples(sample_ids, partition_id)
            self._release(partition_id, ids)

    def save_checkpoint(self, checkpoint_dir: str | PathLike, *, metadata: Mapping | None = None) -> None:
        with self._record("save_checkpoint", ""):
            self._inner.save_checkpoint(checkpoint_dir, metadata=metadata)

    def load_checkpoint(self, checkpoint_dir: str | PathLike) -> dict:
        with self._record("load_checkpoint", ""):
            return self._inner.load_checkpoint(checkpoint_dir)

    def close(self) -> None:
        with self._record("close", ""):
            self._inner.close()


def is_metrics_client(client: object) -> bool:
    return isinstance(client, MetricsDataPlaneClient)
