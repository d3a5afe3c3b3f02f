"""Probes the step benchmarks attach to a run (observing without changing it): tensor bytes through a
worker group's dispatch methods (``RayTraffic``) and the driver's resident memory (``RssSampler``)."""

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


def _children(obj: Any) -> Any:
    """The values a traversal descends into: a mapping's values, a sequence, a KVBatchMeta's ``extra_info``."""
    if isinstance(obj, dict) or (hasattr(obj, "items") and hasattr(obj, "keys")):
        return list(obj.values())
    if isinstance(obj, (list, tuple)):
        return obj
    if hasattr(obj, "extra_info") and hasattr(obj, "sample_ids"):  # a KVBatchMeta
        return [obj.extra_info]
    return ()


def packed_bytes(obj: Any) -> int:
    """Bytes of the ``PackedTensor`` values (per-sample images) reachable from ``obj``."""
    if isinstance(obj, PackedTensor):
        return sum(int(t.numel()) * t.element_size() for t in obj.tensors if t is not None)
    return sum(packed_bytes(v) for v in _children(obj))


def tensor_bytes(obj: Any) -> tuple[int, int]:
    """(bytes of per-token tensors (dim >= 2) and ``PackedTensor``s, bytes of other tensors) reachable from ``obj``."""
    if isinstance(obj, PackedTensor):
        return packed_bytes(obj), 0
    if isinstance(obj, torch.Tensor):
        t = obj.values() if obj.is_nested else obj
        n = int(t.numel()) * t.element_size()
        return (n, 0) if obj.dim() >= 2 else (0, n)
    bulk = small = 0
    for v in _children(obj):
        b, s = tensor_bytes(v)
        bulk += b
        small += s
    return bulk, small


class RayTraffic:
    """Counts tensor bytes crossing the driver <-> worker boundary of the attached worker groups."""

    _KEYS = (
        "ray_received_bulk_bytes",
        "ray_received_per_row_bytes",
        "ray_received_pickled_bytes",
        "ray_sent_bulk_bytes",
        "ray_sent_per_row_bytes",
        "ray_received_packed_bytes",
        "ray_sent_packed_bytes",
    )

    def __init__(self, group: Any) -> None:
        self.counts = dict.fromkeys(self._KEYS, 0)
        self.groups: list[Any] = []
        self.attach(group)

    def attach(self, group: Any) -> None:
        """Count this worker group's calls too (a PPO critic's, next to the policy's)."""
        for method in ("run_sharded", "run_all", "run_rank"):
            setattr(group, method, self._wrap(getattr(group, method)))
        self.groups.append(group)

    def _count(self, direction: str, obj: Any) -> None:
        bulk, small = tensor_bytes(obj)
        self.counts[f"ray_{direction}_bulk_bytes"] += bulk
        self.counts[f"ray_{direction}_per_row_bytes"] += small
        self.counts[f"ray_{direction}_packed_bytes"] += packed_bytes(obj)

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(method: str, *args: Any, **kwargs: Any) -> Any:
            self._count("sent", [args, kwargs])
            out = fn(method, *args, **kwargs)
            self._count("received", out)
            self.counts["ray_received_pickled_bytes"] += len(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
            return out

        return call

    def take(self) -> dict[str, int]:
        """The counters since the last ``take`` (then reset)."""
        out, self.counts = self.counts, dict.fromkeys(self._KEYS, 0)
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
