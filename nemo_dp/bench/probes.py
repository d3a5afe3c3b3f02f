"""Probes the step benchmarks attach to a run: driver <-> worker tensor traffic and driver RSS.

They observe without changing what they observe: ``RayTraffic`` wraps a worker group's
dispatch methods and counts tensor bytes both ways; ``RssSampler`` samples this process's
resident memory on a background thread.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from typing import Any

import psutil
import torch

from nemo_dp.bench.common import MB
from nemo_dp.utils.packed_tensor import PackedTensor

__all__ = ["tensor_bytes", "packed_bytes", "RayTraffic", "RssSampler"]


def tensor_bytes(obj: Any) -> tuple[int, int]:
    """(bytes of per-token tensors (dim >= 2), bytes of other tensors) reachable from ``obj``.

    A ``PackedTensor`` (per-sample images) counts whole as bulk.
    """
    if isinstance(obj, PackedTensor):
        return sum(int(t.numel()) * t.element_size() for t in obj.tensors if t is not None), 0
    if isinstance(obj, torch.Tensor):
        t = obj.values() if obj.is_nested else obj
        n = int(t.numel()) * t.element_size()
        return (n, 0) if obj.dim() >= 2 else (0, n)
    items: Any = ()
    if isinstance(obj, dict) or (hasattr(obj, "items") and hasattr(obj, "keys")):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = obj
    elif hasattr(obj, "extra_info") and hasattr(obj, "sample_ids"):  # a KVBatchMeta
        items = [obj.extra_info]
    bulk = small = 0
    for v in items:
        b, s = tensor_bytes(v)
        bulk += b
        small += s
    return bulk, small


def packed_bytes(obj: Any) -> int:
    """Bytes of the ``PackedTensor`` values (per-sample images) reachable from ``obj``."""
    if isinstance(obj, PackedTensor):
        return sum(int(t.numel()) * t.element_size() for t in obj.tensors if t is not None)
    if isinstance(obj, dict) or (hasattr(obj, "items") and hasattr(obj, "keys")):
        return sum(packed_bytes(v) for v in list(obj.values()))
    if isinstance(obj, (list, tuple)):
        return sum(packed_bytes(v) for v in obj)
    if hasattr(obj, "extra_info") and hasattr(obj, "sample_ids"):  # a KVBatchMeta
        return packed_bytes(obj.extra_info)
    return 0


class RayTraffic:
    """Counts tensor bytes crossing the driver <-> worker boundary of the attached worker groups."""

    def __init__(self, group: Any) -> None:
        self.received_bulk = 0
        self.received_small = 0
        self.received_pickled = 0
        self.sent_bulk = 0
        self.sent_small = 0
        self.received_packed = 0
        self.sent_packed = 0
        self.groups: list[Any] = []
        self.attach(group)

    def attach(self, group: Any) -> None:
        """Count this worker group's calls too (a PPO critic's, next to the policy's)."""
        for method in ("run_sharded", "run_all", "run_rank"):
            setattr(group, method, self._wrap(getattr(group, method)))
        self.groups.append(group)

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(method: str, *args: Any, **kwargs: Any) -> Any:
            b, s = tensor_bytes([args, kwargs])
            self.sent_bulk += b
            self.sent_small += s
            self.sent_packed += packed_bytes([args, kwargs])
            out = fn(method, *args, **kwargs)
            b, s = tensor_bytes(out)
            self.received_bulk += b
            self.received_small += s
            self.received_packed += packed_bytes(out)
            self.received_pickled += len(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
            return out

        return call

    def take(self) -> dict[str, int]:
        """The counters since the last ``take`` (then reset)."""
        out = {
            "ray_received_bulk_bytes": self.received_bulk,
            "ray_received_per_row_bytes": self.received_small,
            "ray_received_pickled_bytes": self.received_pickled,
            "ray_sent_bulk_bytes": self.sent_bulk,
            "ray_sent_per_row_bytes": self.sent_small,
            "ray_received_packed_bytes": self.received_packed,
            "ray_sent_packed_bytes": self.sent_packed,
        }
        self.received_bulk = self.received_small = self.received_pickled = 0
        self.sent_bulk = self.sent_small = 0
        self.received_packed = self.sent_packed = 0
        return out


class RssSampler:
    """Peak resident memory of this (driver) process, sampled on a background thread."""

    def __init__(self, interval_s: float) -> None:
        self._proc = psutil.Process()
        self._interval = interval_s
        self._stop = threading.Event()
        self.start_rss = self._proc.memory_info().rss
        self.peak_rss = self.start_rss
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak_rss = max(self.peak_rss, self._proc.memory_info().rss)

    def stop(self) -> dict[str, float]:
        """Stop sampling; ``peak_rss_mb`` and ``rss_growth_mb`` since the start."""
        self._stop.set()
        self._thread.join()
        self.peak_rss = max(self.peak_rss, self._proc.memory_info().rss)
        return {"peak_rss_mb": self.peak_rss / MB, "rss_growth_mb": (self.peak_rss - self.start_rss) / MB}
