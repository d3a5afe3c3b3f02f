"""What the data-plane benchmark's pieces share: backend names, its config schema, payloads."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from nemo_dp.bench import bench_fail

__all__ = [
    "MEMCPY",
    "LOCAL",
    "TQ_ADAPTER",
    "RAY_STORE",
    "TQ_RAW",
    "RAY_TD",
    "RAY_NUMPY",
    "ALL_BACKENDS",
    "ALL_PAYLOADS",
    "MIB",
    "MB",
    "DataPlaneBenchConfig",
    "Payload",
    "make_payload",
    "verify_roundtrip",
]

MEMCPY = "memcpy"
LOCAL = "local"
TQ_ADAPTER = "transfer_queue"
TQ_RAW = "tq_raw"
RAY_TD = "ray_tensordict"
RAY_NUMPY = "ray_numpy"
RAY_STORE = "ray_store"
ALL_BACKENDS: tuple[str, ...] = (MEMCPY, LOCAL, TQ_ADAPTER, TQ_RAW, RAY_TD, RAY_NUMPY, RAY_STORE)
ALL_PAYLOADS: tuple[str, ...] = ("dense", "jagged")
MIB = 1 << 20
MB = 1e6


@dataclass
class DataPlaneBenchConfig:
    """``bench`` for ``bench=data_plane`` (schema of ``conf_bench/bench/data_plane.yaml``)."""

    name: str = "data_plane"
    backends: list[str] = field(default_factory=lambda: list(ALL_BACKENDS))
    payloads: list[str] = field(default_factory=lambda: list(ALL_PAYLOADS))
    sizes_mib: list[float] = field(default_factory=lambda: [1.0, 64.0, 256.0])
    reps: int = 5
    large_reps: int = 3
    large_from_mib: float = 256.0
    warmup: int = 1
    dense_rows: int = 512
    jagged_min_len: int = 100
    jagged_max_len: int = 1500
    seed: int = 0
    num_cpus: int = 2
    output_file: str = "bench_data_plane.json"

    def __post_init__(self) -> None:
        for key, legal in (("backends", ALL_BACKENDS), ("payloads", ALL_PAYLOADS)):
            values = getattr(self, key)
            unknown = [v for v in values if v not in legal]
            if unknown or not values:
                bench_fail(key, f"unknown or empty {unknown or values}; legal: {list(legal)}")
            if key == "backends" and len(set(values)) != len(values):
                bench_fail("backends", f"duplicates in {values}")
        if not self.sizes_mib or any(not (s > 0 and math.isfinite(s)) for s in self.sizes_mib):
            bench_fail("sizes_mib", f"need positive sizes, got {self.sizes_mib}")
        for key in ("reps", "large_reps", "dense_rows", "jagged_min_len", "num_cpus"):
            if getattr(self, key) < 1:
                bench_fail(key, f"must be >= 1, got {getattr(self, key)}")
        if self.warmup < 0:
            bench_fail("warmup", f"must be >= 0, got {self.warmup}")
        if self.jagged_max_len < self.jagged_min_len:
            bench_fail("jagged_max_len", f"must be >= jagged_min_len={self.jagged_min_len}")
        if not self.output_file or "/" in self.output_file:
            bench_fail("output_file", f"must be a plain file name, got {self.output_file!r}")


@dataclass
class Payload:
    """The same bytes in every shape a backend takes (TensorDict, flat buffers, numpy views)."""

    kind: str
    size_mib: float
    td: TensorDict
    rows: int
    nbytes: int
    sample_ids: list[str]

    def tensors(self) -> list[torch.Tensor]:
        """The flat buffers that hold the payload (what a memory copy has to move)."""
        return [t.values() if t.is_nested else t for t in map(self.td.get, self.td.keys())]

    def numpy_dict(self) -> dict[str, np.ndarray]:
        """Zero-copy numpy views (values/offsets for jagged columns) for Ray's object store."""
        out: dict[str, np.ndarray] = {}
        for key in self.td.keys():
            t = self.td.get(key)
            if t.is_nested:
                out[f"{key}.values"] = t.values().numpy()
                out[f"{key}.offsets"] = t.offsets().numpy()
            else:
                out[key] = t.numpy()
        return out


def make_payload(kind: str, size_mib: float, bench: DataPlaneBenchConfig) -> Payload:
    """A ``dense`` or ``jagged`` payload of about ``size_mib`` MiB (shapes, seed from ``bench``; ids ``row{i}``)."""
    gen = torch.Generator().manual_seed(bench.seed)
    target = int(size_mib * MIB)
    if kind == "dense":
        rows = bench.dense_rows
        cols = max(1, target // (4 * rows))
        td = TensorDict({"x": torch.randn(rows, cols, generator=gen)}, batch_size=[rows])
    else:
        per_token = 8 + 4  # int64 token + float32 logprob
        mean_len = (bench.jagged_min_len + bench.jagged_max_len) / 2
        estimate = max(1, int(target / (per_token * mean_len)) + 16)
        lengths = torch.randint(bench.jagged_min_len, bench.jagged_max_len + 1, (estimate,), generator=gen)
        cum = torch.cumsum(lengths, 0)
        rows = min(max(1, int(torch.searchsorted(cum, target // per_token).item()) + 1), estimate)
        lengths = lengths[:rows]
        offsets = torch.zeros(rows + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(lengths, 0)
        total = int(offsets[-1].item())
        tokens = torch.randint(0, 32_000, (total,), generator=gen, dtype=torch.int64)
        logprobs = -torch.rand(total, generator=gen)
        td = TensorDict(
            {
                "tokens": torch.nested.nested_tensor_from_jagged(tokens, offsets),
                "logprobs": torch.nested.nested_tensor_from_jagged(logprobs, offsets.clone()),
            },
            batch_size=[rows],
        )
    payload = Payload(kind, size_mib, td, rows, 0, [f"row{i}" for i in range(rows)])
    payload.nbytes = sum(t.numel() * t.element_size() for t in payload.tensors())
    return payload


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.values() if t.is_nested else t.reshape(-1)


def verify_roundtrip(payload: Payload, out: Any, backend: str) -> None:
    """RuntimeError unless a read returned the payload's rows, fields and values (a fast wrong answer is no result)."""
    if isinstance(out, dict):  # numpy dict from Ray
        ref = payload.numpy_dict()
        if set(out) != set(ref) or not all(np.array_equal(out[k], ref[k]) for k in ref):
            raise RuntimeError(f"{backend}: numpy round trip differs from the payload")
        return
    if out.batch_size[0] != payload.rows or set(out.keys()) != set(payload.td.keys()):
        raise RuntimeError(
            f"{backend}: read returned {out.batch_size[0]} rows / fields {sorted(out.keys())}, "
            f"expected {payload.rows} / {sorted(payload.td.keys())}"
        )
    for key in payload.td.keys():
        if not torch.equal(_flat(out.get(key)), _flat(payload.td.get(key))):
            raise RuntimeError(f"{backend}: field {key!r} differs from the payload")
