"""The measured backends of the data-plane benchmark (the raw TransferQueue one is in ``launchers/bench.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from nemo_dp.bench.common import MEMCPY, Payload, verify_roundtrip
from nemo_dp.data_plane.interfaces import DataPlaneClient

__all__ = ["timed", "Backend", "MemcpyBackend", "ClientBackend", "RayObjectStoreBackend", "make_reader_actor"]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Run ``fn``; return ``(milliseconds, result)``."""
    start = time.perf_counter()
    result = fn()
    return (time.perf_counter() - start) * 1000.0, result


class Backend:
    """One measured backend: ``once`` runs one repetition and returns ``{op: ms}``."""

    name: str

    def once(self, payload: Payload, tag: str, verify: bool) -> dict[str, float]:
        """One repetition on ``payload``; with ``verify`` the read is checked against it."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the backend holds."""


class MemcpyBackend(Backend):
    """``torch.clone`` of every buffer of the payload: one memory copy, the physical floor."""

    name = MEMCPY

    def once(self, payload: Payload, tag: str, verify: bool) -> dict[str, float]:
        buffers = payload.tensors()
        ms, copies = timed(lambda: [t.clone() for t in buffers])
        if verify and not all(torch.equal(a, b) for a, b in zip(copies, buffers)):
            raise RuntimeError("memcpy: clone differs")
        return {"copy": ms}


class ClientBackend(Backend):
    """A ``DataPlaneClient``: register, put (timed), get (timed), drop the partition."""

    def __init__(self, name: str, client: DataPlaneClient) -> None:
        self.name = name
        self.client = client

    def once(self, payload: Payload, tag: str, verify: bool) -> dict[str, float]:
        pid = f"bench_{self.name}_{tag}"
        fields = list(payload.td.keys())
        ids = payload.sample_ids
        self.client.register_partition(pid, fields=fields, num_samples=payload.rows, consumer_tasks=[])
        try:
            put_ms, _ = timed(lambda: self.client.put_samples(ids, pid, payload.td))
            get_ms, out = timed(lambda: self.client.get_samples(ids, pid, fields))
            if verify:
                verify_roundtrip(payload, out, self.name)
            del out
        finally:
            self.client.clear_samples(None, pid)
        return {"put": put_ms, "get": get_ms}

    def close(self) -> None:
        self.client.close()


class RayObjectStoreBackend(Backend):
    """``ray.put``/``ray.get`` in the driver, plus ``ray.get`` timed in a ``num_cpus=0`` actor."""

    def __init__(self, name: str, reader: Any, as_numpy: bool) -> None:
        import ray

        self.ray = ray
        self.name = name
        self.reader = reader
        self.as_numpy = as_numpy

    def once(self, payload: Payload, tag: str, verify: bool) -> dict[str, float]:
        value = payload.numpy_dict() if self.as_numpy else payload.td
        put_ms, ref = timed(lambda: self.ray.put(value))
        get_ms, out = timed(lambda: self.ray.get(ref))
        if verify:
            verify_roundtrip(payload, out, self.name)
        del out
        # The ref travels boxed in a list so that Ray does not resolve it before the actor times it.
        actor_s = self.ray.get(self.reader.timed_get.remote([ref]))
        del ref
        return {"put": put_ms, "get": get_ms, "get_actor": actor_s * 1000.0}


def make_reader_actor() -> Any:
    """A ``num_cpus=0`` actor timing ``ray.get`` of a boxed ref in another process."""
    import ray

    @ray.remote(num_cpus=0)
    class ObjectReader:
        def timed_get(self, boxed: list) -> float:
            start = time.perf_counter()
            value = ray.get(boxed[0])
            elapsed = time.perf_counter() - start
            del value
            return elapsed

    return ObjectReader.remote()
