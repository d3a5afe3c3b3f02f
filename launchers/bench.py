"""Benchmarks for nemo_dp, configured with Hydra: ``python launchers/bench.py bench=data_plane``.

Why it exists: the data plane is only worth its complexity if moving a step's tensors through
it costs about what copying them costs.  ``bench=data_plane`` measures, side by side in one
run and on the same bytes, put and get throughput of

* ``memcpy`` - an in-process ``torch.clone`` of the payload's tensors (the physical floor);
* ``local`` - the Local adapter (``LocalDataPlaneClient``) through ``build_data_plane_client``;
* ``transfer_queue`` - the TransferQueue adapter through ``build_data_plane_client``;
* ``tq_raw`` - the raw library calls ``transfer_queue.kv_batch_put/kv_batch_get`` on the same
  data and system, to isolate the adapter's overhead.  Only
  ``nemo_dp/data_plane/adapters/transfer_queue.py`` may import ``transfer_queue`` inside the
  ``nemo_dp`` package; this launcher lives outside the package and imports it lazily, for this
  one measurement only;
* ``ray_tensordict`` / ``ray_numpy`` - Ray's object store with the TensorDict (pickled, copied)
  and with a dict of numpy buffers (zero-copy), read in the driver and in a ``num_cpus=0`` actor.

Payloads are ``dense`` (``float32[rows, cols]``) and ``jagged`` (int64 tokens plus float32
logprobs, row lengths in ``[jagged_min_len, jagged_max_len]``) at the configured sizes.  The
table (min/median ms, MB/s, throughput relative to one memory copy, time relative to raw
TransferQueue) is printed and written as JSON into Hydra's output directory.  Other benchmarks
(``bench=grpo_step``, ``bench=sft_step``) plug into :data:`BENCHES` by ``bench.name``.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDict

from nemo_dp.data_plane.factory import build_data_plane_client, coerce_data_plane_config
from nemo_dp.data_plane.interfaces import (
    DataPlaneClient,
    DataPlaneConfig,
    LocalDataPlaneConfig,
    register_data_plane_configs,
)

_LOG = logging.getLogger("nemo_dp.bench")

MEMCPY = "memcpy"
LOCAL = "local"
TQ_ADAPTER = "transfer_queue"
TQ_RAW = "tq_raw"
RAY_TD = "ray_tensordict"
RAY_NUMPY = "ray_numpy"
ALL_BACKENDS: tuple[str, ...] = (MEMCPY, LOCAL, TQ_ADAPTER, TQ_RAW, RAY_TD, RAY_NUMPY)
ALL_PAYLOADS: tuple[str, ...] = ("dense", "jagged")
_NEEDS_TQ = {TQ_ADAPTER, TQ_RAW}
_NEEDS_RAY = {TQ_ADAPTER, TQ_RAW, RAY_TD, RAY_NUMPY}
_MIB = 1 << 20
_MB = 1e6


# ---------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------


@dataclass
class DataPlaneBenchConfig:
    """``bench`` for ``bench=data_plane`` (schema of ``conf/bench/data_plane.yaml``)."""

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
        def fail(key: str, message: str) -> None:
            raise ValueError(f"bench.{key}: {message}")

        unknown = [b for b in self.backends if b not in ALL_BACKENDS]
        if unknown or not self.backends:
            fail(
                "backends",
                f"unknown or empty {unknown or self.backends}; legal: {list(ALL_BACKENDS)}",
            )
        if len(set(self.backends)) != len(self.backends):
            fail("backends", f"duplicates in {self.backends}")
        unknown = [p for p in self.payloads if p not in ALL_PAYLOADS]
        if unknown or not self.payloads:
            fail(
                "payloads",
                f"unknown or empty {unknown or self.payloads}; legal: {list(ALL_PAYLOADS)}",
            )
        if not self.sizes_mib or any(not (s > 0 and math.isfinite(s)) for s in self.sizes_mib):
            fail("sizes_mib", f"need positive sizes, got {self.sizes_mib}")
        for key in ("reps", "large_reps", "dense_rows", "jagged_min_len", "num_cpus"):
            if getattr(self, key) < 1:
                fail(key, f"must be >= 1, got {getattr(self, key)}")
        if self.warmup < 0:
            fail("warmup", f"must be >= 0, got {self.warmup}")
        if self.jagged_max_len < self.jagged_min_len:
            fail("jagged_max_len", f"must be >= jagged_min_len={self.jagged_min_len}")
        if not self.output_file or "/" in self.output_file:
            fail("output_file", f"must be a plain file name, got {self.output_file!r}")


def register_bench_configs() -> None:
    """Store the bench schemas (group ``bench``) and the data-plane schemas in the ConfigStore."""
    register_data_plane_configs()
    ConfigStore.instance().store(group="bench", name="data_plane_schema", node=DataPlaneBenchConfig)
    ConfigStore.instance().store(group="bench", name="grpo_step_schema", node=GrpoStepBenchConfig)
    ConfigStore.instance().store(group="bench", name="sft_step_schema", node=SftStepBenchConfig)


# ---------------------------------------------------------------------------------------------
# payloads
# ---------------------------------------------------------------------------------------------


@dataclass
class Payload:
    """The same bytes in the three shapes the backends take."""

    kind: str
    size_mib: float
    td: TensorDict
    rows: int
    nbytes: int
    sample_ids: list[str]

    def tensors(self) -> list[torch.Tensor]:
        """The flat buffers that hold the payload (what a memory copy has to move)."""
        out = []
        for key in self.td.keys():
            t = self.td.get(key)
            out.append(t.values() if t.is_nested else t)
        return out

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
    """Build a ``dense`` or ``jagged`` payload of about ``size_mib`` MiB of tensor bytes.

    Args:
        kind: ``"dense"`` or ``"jagged"``.
        size_mib: Target size.
        bench: Shapes and seed.

    Returns:
        The payload (sample ids ``row{i}``).
    """
    gen = torch.Generator().manual_seed(bench.seed)
    target = int(size_mib * _MIB)
    if kind == "dense":
        rows = bench.dense_rows
        cols = max(1, target // (4 * rows))
        td = TensorDict({"x": torch.randn(rows, cols, generator=gen)}, batch_size=[rows])
    else:
        per_token = 8 + 4  # int64 token + float32 logprob
        mean_len = (bench.jagged_min_len + bench.jagged_max_len) / 2
        estimate = max(1, int(target / (per_token * mean_len)) + 16)
        lengths = torch.randint(
            bench.jagged_min_len, bench.jagged_max_len + 1, (estimate,), generator=gen
        )
        cum = torch.cumsum(lengths, 0)
        rows = max(1, int(torch.searchsorted(cum, target // per_token).item()) + 1)
        rows = min(rows, estimate)
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
    """Check that a read returned the payload's bytes (a fast wrong answer is not a result).

    Raises:
        RuntimeError: Rows, fields or values differ.
    """
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


# ---------------------------------------------------------------------------------------------
# backends
# ---------------------------------------------------------------------------------------------


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
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
        ms, copies = _timed(lambda: [t.clone() for t in buffers])
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
        self.client.register_partition(
            pid, fields=fields, num_samples=payload.rows, consumer_tasks=[]
        )
        try:
            put_ms, _ = _timed(lambda: self.client.put_samples(ids, pid, payload.td))
            get_ms, out = _timed(lambda: self.client.get_samples(ids, pid, fields))
            if verify:
                verify_roundtrip(payload, out, self.name)
            del out
        finally:
            self.client.clear_samples(None, pid)
        return {"put": put_ms, "get": get_ms}

    def close(self) -> None:
        self.client.close()


class RawTransferQueueBackend(Backend):
    """The library's own ``kv_batch_put``/``kv_batch_get`` on the adapter's running system.

    Lives in the launcher, not in ``nemo_dp``: inside the package only the TransferQueue adapter
    may import the library.  Requires the adapter client to have bootstrapped the system.
    """

    name = TQ_RAW

    def __init__(self) -> None:
        import transfer_queue  # deliberate: raw-library baseline for the adapter overhead

        self.tq = transfer_queue

    def once(self, payload: Payload, tag: str, verify: bool) -> dict[str, float]:
        pid = f"bench_raw_{tag}"
        fields = list(payload.td.keys())
        keys = payload.sample_ids
        put_ms, _ = _timed(
            lambda: self.tq.kv_batch_put(keys=keys, partition_id=pid, fields=payload.td)
        )
        try:
            get_ms, out = _timed(
                lambda: self.tq.kv_batch_get(keys=keys, partition_id=pid, select_fields=fields)
            )
            if verify:
                verify_roundtrip(payload, out, self.name)
            del out
        finally:
            self.tq.kv_clear(keys=keys, partition_id=pid)
        return {"put": put_ms, "get": get_ms}


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
        put_ms, ref = _timed(lambda: self.ray.put(value))
        get_ms, out = _timed(lambda: self.ray.get(ref))
        if verify:
            verify_roundtrip(payload, out, self.name)
        del out
        # The ref travels boxed in a list so that Ray does not resolve it before the actor times it.
        actor_s = self.ray.get(self.reader.timed_get.remote([ref]))
        del ref
        return {"put": put_ms, "get": get_ms, "get_actor": actor_s * 1000.0}


def _make_reader_actor() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class ObjectReader:
        """Times ``ray.get`` of a boxed object ref inside a separate worker process."""

        def timed_get(self, boxed: list) -> float:
            start = time.perf_counter()
            value = ray.get(boxed[0])
            elapsed = time.perf_counter() - start
            del value
            return elapsed

    return ObjectReader.remote()


# ---------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------


@dataclass
class Row:
    """Summary of one (payload, size, backend, op)."""

    payload: str
    size_mib: float
    nbytes: int
    rows: int
    backend: str
    op: str
    reps: int
    min_ms: float
    median_ms: float
    mb_per_s: float
    tput_vs_memcpy: float | None = None
    time_vs_tq_raw: float | None = None
    tput_vs_memcpy_min: float | None = None
    time_vs_tq_raw_min: float | None = None
    times_ms: list[float] = field(default_factory=list)


def summarize(payload: Payload, backend: str, times: dict[str, list[float]]) -> list[Row]:
    """One :class:`Row` per op of a backend's timings on ``payload``."""
    rows = []
    for op, samples in times.items():
        median = statistics.median(samples)
        rows.append(
            Row(
                payload=payload.kind,
                size_mib=payload.size_mib,
                nbytes=payload.nbytes,
                rows=payload.rows,
                backend=backend,
                op=op,
                reps=len(samples),
                min_ms=min(samples),
                median_ms=median,
                mb_per_s=payload.nbytes / _MB / (median / 1000.0) if median > 0 else math.inf,
                times_ms=list(samples),
            )
        )
    return rows


def add_ratios(rows: list[Row]) -> None:
    """``tput_vs_memcpy`` = memcpy median / op median; ``time_vs_tq_raw`` = op / raw TQ op.

    The ``*_min`` twins use the minima, the better estimate of the intrinsic cost when other
    processes share the cores.
    """
    by_key = {(r.payload, r.size_mib, r.backend, r.op): r for r in rows}
    for r in rows:
        copy = by_key.get((r.payload, r.size_mib, MEMCPY, "copy"))
        if copy is not None and r.median_ms > 0 and r.min_ms > 0:
            r.tput_vs_memcpy = copy.median_ms / r.median_ms
            r.tput_vs_memcpy_min = copy.min_ms / r.min_ms
        raw = by_key.get((r.payload, r.size_mib, TQ_RAW, r.op))
        if raw is not None and raw.median_ms > 0 and raw.min_ms > 0:
            r.time_vs_tq_raw = r.median_ms / raw.median_ms
            r.time_vs_tq_raw_min = r.min_ms / raw.min_ms


def evaluate_targets(rows: list[Row]) -> list[dict[str, Any]]:
    """The data-plane targets at 64 MiB (reported, never asserted)."""
    by_key = {(r.payload, r.size_mib, r.backend, r.op): r for r in rows}
    targets: list[dict[str, Any]] = []
    for op in ("put", "get"):
        r = by_key.get(("dense", 64.0, LOCAL, op))
        value = r.tput_vs_memcpy if r is not None else None
        value_min = r.tput_vs_memcpy_min if r is not None else None
        targets.append(
            {
                "target": f"local {op} throughput >= 0.7x one memory copy (dense 64 MiB)",
                "value": value,
                "met": None if value is None else value >= 0.7,
                "value_min": value_min,
                "met_min": None if value_min is None else value_min >= 0.7,
            }
        )
    for payload in ("dense", "jagged"):
        for op in ("put", "get"):
            r = by_key.get((payload, 64.0, TQ_ADAPTER, op))
            value = r.time_vs_tq_raw if r is not None else None
            value_min = r.time_vs_tq_raw_min if r is not None else None
            targets.append(
                {
                    "target": (
                        f"transfer_queue adapter {op} <= 1.10x raw library time "
                        f"({payload} 64 MiB)"
                    ),
                    "value": value,
                    "met": None if value is None else value <= 1.10,
                    "value_min": value_min,
                    "met_min": None if value_min is None else value_min <= 1.10,
                }
            )
    return targets


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(rows: list[Row]) -> str:
    """The printed result table (one line per row)."""
    header = (
        f"{'payload':<8}{'MiB':>7}{'rows':>7}  {'backend':<16}{'op':<10}{'n':>3}"
        f"{'min ms':>10}{'med ms':>10}{'MB/s':>10}{'x memcpy':>10}{'(min)':>8}{'/ tq_raw':>10}"
        f"{'(min)':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.payload:<8}{r.size_mib:>7g}{r.rows:>7}  {r.backend:<16}{r.op:<10}{r.reps:>3}"
            f"{r.min_ms:>10.2f}{r.median_ms:>10.2f}{r.mb_per_s:>10.0f}"
            f"{_fmt(r.tput_vs_memcpy, '.2f'):>10}{_fmt(r.tput_vs_memcpy_min, '.2f'):>8}"
            f"{_fmt(r.time_vs_tq_raw, '.2f'):>10}{_fmt(r.time_vs_tq_raw_min, '.2f'):>8}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the data-plane bench
# ---------------------------------------------------------------------------------------------


def _setup_backends(
    bench: DataPlaneBenchConfig,
    tq_cfg: Any,
    local_cfg: Any,
    opened: list[Backend],
    errors: dict[str, str],
) -> dict[str, Backend]:
    """Create the selected backends; a backend that fails to start is recorded in ``errors``."""
    backends: dict[str, Backend] = {}
    selected = set(bench.backends)
    if MEMCPY in selected:
        backends[MEMCPY] = MemcpyBackend()
    if LOCAL in selected:
        backends[LOCAL] = ClientBackend(LOCAL, build_data_plane_client(local_cfg))
        opened.append(backends[LOCAL])
    if selected & _NEEDS_TQ:
        try:
            tq_client = build_data_plane_client(tq_cfg, bootstrap=True)
        except Exception as exc:  # recorded per backend, reported, and fails the run at the end
            for name in sorted(selected & _NEEDS_TQ):
                errors[name] = f"TransferQueue bootstrap failed: {type(exc).__name__}: {exc}"
        else:
            tq_backend = ClientBackend(TQ_ADAPTER, tq_client)
            # Closed last among backends: its close tears down the controller (raw calls first).
            opened.append(tq_backend)
            if TQ_ADAPTER in selected:
                backends[TQ_ADAPTER] = tq_backend
            if TQ_RAW in selected:
                try:
                    backends[TQ_RAW] = RawTransferQueueBackend()
                except Exception as exc:
                    errors[TQ_RAW] = f"{type(exc).__name__}: {exc}"
    if selected & {RAY_TD, RAY_NUMPY}:
        reader = _make_reader_actor()
        if RAY_TD in selected:
            backends[RAY_TD] = RayObjectStoreBackend(RAY_TD, reader, as_numpy=False)
        if RAY_NUMPY in selected:
            backends[RAY_NUMPY] = RayObjectStoreBackend(RAY_NUMPY, reader, as_numpy=True)
    return backends


def run_data_plane_bench(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    """Measure every selected backend on every payload and size; write the JSON report.

    Args:
        cfg: The composed root config (``bench``, ``data_plane``, ``local_data_plane``).
        output_dir: Where the JSON goes (Hydra's run directory).

    Returns:
        The report that was written.

    Raises:
        RuntimeError: Any backend failed (after the report with the errors was written).
    """
    bench = OmegaConf.to_object(cfg.bench)
    assert isinstance(bench, DataPlaneBenchConfig)
    selected = set(bench.backends)
    local_cfg = coerce_data_plane_config(cfg.local_data_plane) if LOCAL in selected else None
    if local_cfg is not None and not isinstance(local_cfg, LocalDataPlaneConfig):
        raise ValueError("local_data_plane must be the 'local' data_plane option")
    tq_cfg = coerce_data_plane_config(cfg.data_plane) if selected & _NEEDS_TQ else None
    if tq_cfg is not None and not (isinstance(tq_cfg, DataPlaneConfig) and tq_cfg.enabled):
        raise ValueError(
            f"backends {sorted(selected & _NEEDS_TQ)} need data_plane=tq (enabled TransferQueue)"
        )

    rows: list[Row] = []
    errors: dict[str, str] = {}
    opened: list[Backend] = []
    ray_started = False
    try:
        if selected & _NEEDS_RAY:
            from nemo_dp.distributed.ray_init import init_ray

            init_ray(num_cpus=bench.num_cpus, data_plane_cfg=tq_cfg)
            ray_started = True
        backends = _setup_backends(bench, tq_cfg, local_cfg, opened, errors)
        for kind in bench.payloads:
            for size in bench.sizes_mib:
                payload = make_payload(kind, size, bench)
                reps = bench.large_reps if size >= bench.large_from_mib else bench.reps
                print(
                    f"[bench] {kind} {size:g} MiB: {payload.rows} rows, "
                    f"{payload.nbytes / _MB:.1f} MB, {reps} reps",
                    flush=True,
                )
                times: dict[str, dict[str, list[float]]] = {}
                # Repetition-major order: every backend sees the same load drift on this shared
                # machine instead of one backend getting all the quiet seconds.
                for i in range(bench.warmup + reps):
                    for name in bench.backends:
                        backend = backends.get(name)
                        if backend is None or name in errors:
                            continue
                        tag = f"{kind}_{size:g}_{i}"
                        try:
                            sample = backend.once(payload, tag, verify=i == bench.warmup)
                        except Exception as exc:  # one broken backend must not hide the others
                            _LOG.exception("backend %s failed on %s %g MiB", name, kind, size)
                            errors[name] = f"{kind} {size:g} MiB: {type(exc).__name__}: {exc}"
                            continue
                        if i >= bench.warmup:
                            for op, ms in sample.items():
                                times.setdefault(name, {}).setdefault(op, []).append(ms)
                for name in bench.backends:
                    if name in times and name not in errors:
                        rows.extend(summarize(payload, name, times[name]))
                del payload
                gc.collect()
    finally:
        for backend in reversed(opened):
            try:
                backend.close()
            except Exception:
                _LOG.exception("closing backend %s failed", backend.name)
        if ray_started:
            from nemo_dp.distributed.ray_init import shutdown_ray

            shutdown_ray()

    add_ratios(rows)
    report = {
        "bench": "data_plane",
        "config": OmegaConf.to_container(cfg, resolve=True),
        "host": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
        },
        "columns": {
            "tput_vs_memcpy": "memcpy median ms / op median ms (1.0 = as fast as one copy)",
            "time_vs_tq_raw": "op median ms / raw TransferQueue median ms of the same op",
            "tput_vs_memcpy_min": "memcpy min ms / op min ms",
            "time_vs_tq_raw_min": "op min ms / raw TransferQueue min ms of the same op",
        },
        "results": [asdict(r) for r in rows],
        "targets": evaluate_targets(rows),
        "errors": errors,
    }
    out_path = output_dir / bench.output_file
    out_path.write_text(json.dumps(report, indent=2))
    print(format_table(rows), flush=True)
    for t in report["targets"]:
        verdict = {True: "met", False: "NOT met", None: "not measured"}
        print(
            f"[target] {t['target']}: median {_fmt(t['value'], '.2f')} -> {verdict[t['met']]}; "
            f"min {_fmt(t['value_min'], '.2f')} -> {verdict[t['met_min']]}",
            flush=True,
        )
    print(f"[bench] report: {out_path}", flush=True)
    if errors:
        for name, message in errors.items():
            print(f"[bench] ERROR {name}: {message}", flush=True)
        raise RuntimeError(f"bench backends failed: {sorted(errors)} (details in {out_path})")
    return report


# ---------------------------------------------------------------------------------------------
# bench=grpo_step: legacy vs data-plane GRPO trainer, side by side
# ---------------------------------------------------------------------------------------------

GRPO_STEP_TRAINERS: tuple[str, ...] = ("disabled", "tq")


@dataclass
class GrpoStepBenchConfig:
    """``bench`` for ``bench=grpo_step`` (schema of ``conf/bench/grpo_step.yaml``)."""

    name: str = "grpo_step"
    samples_per_step: list[int] = field(default_factory=lambda: [32, 128])
    group_size: int = 8
    warmup_steps: int = 1
    measured_steps: int = 3
    backends: list[str] = field(default_factory=lambda: list(GRPO_STEP_TRAINERS))
    train_overrides: list[str] = field(default_factory=list)
    backend_overrides: dict[str, list[str]] = field(
        default_factory=lambda: {"disabled": [], "tq": ["data_plane.observability.enabled=true"]}
    )
    rss_sample_interval_s: float = 0.005
    target_bulk_ratio: float = 0.05
    num_cpus: int = 2
    output_file: str = "bench_grpo_step.json"

    def __post_init__(self) -> None:
        def fail(key: str, message: str) -> None:
            raise ValueError(f"bench.{key}: {message}")

        if not self.samples_per_step or any(s < 1 for s in self.samples_per_step):
            fail("samples_per_step", f"need positive sizes, got {self.samples_per_step}")
        if self.group_size < 1 or any(s % self.group_size for s in self.samples_per_step):
            fail("group_size", f"must be >= 1 and divide every samples_per_step {self.samples_per_step}")
        unknown = [d for d in self.backends if d not in GRPO_STEP_TRAINERS]
        if unknown or not self.backends or len(set(self.backends)) != len(self.backends):
            fail("backends", f"need distinct options of {list(GRPO_STEP_TRAINERS)}, got {self.backends}")
        for key in ("measured_steps", "num_cpus"):
            if getattr(self, key) < 1:
                fail(key, f"must be >= 1, got {getattr(self, key)}")
        missing = [d for d in self.backends if d not in self.backend_overrides]
        if missing:
            fail("backend_overrides", f"no entry for {missing}")
        if self.warmup_steps < 0:
            fail("warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        if not self.rss_sample_interval_s > 0:
            fail("rss_sample_interval_s", f"must be > 0, got {self.rss_sample_interval_s}")
        if not self.output_file or "/" in self.output_file:
            fail("output_file", f"must be a plain file name, got {self.output_file!r}")


def _tensor_bytes(obj: Any) -> tuple[int, int]:
    """(bytes of per-token tensors (dim >= 2), bytes of other tensors) reachable from ``obj``."""
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
        b, s = _tensor_bytes(v)
        bulk += b
        small += s
    return bulk, small


class _RayTraffic:
    """Counts tensor bytes crossing the driver <-> worker boundary of one worker group."""

    def __init__(self, group: Any) -> None:
        self.received_bulk = 0
        self.received_small = 0
        self.received_pickled = 0
        self.sent_bulk = 0
        self.sent_small = 0
        self._group = group
        for method in ("run_sharded", "run_all", "run_rank"):
            setattr(group, method, self._wrap(getattr(group, method)))

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        import pickle

        def call(method: str, *args: Any, **kwargs: Any) -> Any:
            b, s = _tensor_bytes([args, kwargs])
            self.sent_bulk += b
            self.sent_small += s
            out = fn(method, *args, **kwargs)
            b, s = _tensor_bytes(out)
            self.received_bulk += b
            self.received_small += s
            self.received_pickled += len(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
            return out

        return call

    def take(self) -> dict[str, int]:
        out = {
            "ray_received_bulk_bytes": self.received_bulk,
            "ray_received_per_row_bytes": self.received_small,
            "ray_received_pickled_bytes": self.received_pickled,
            "ray_sent_bulk_bytes": self.sent_bulk,
            "ray_sent_per_row_bytes": self.sent_small,
        }
        self.received_bulk = self.received_small = self.received_pickled = 0
        self.sent_bulk = self.sent_small = 0
        return out


class _RssSampler:
    """Peak resident memory of this (driver) process, sampled on a background thread."""

    def __init__(self, interval_s: float) -> None:
        import threading

        import psutil

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
        self._stop.set()
        self._thread.join()
        self.peak_rss = max(self.peak_rss, self._proc.memory_info().rss)
        return {"peak_rss_mb": self.peak_rss / _MB, "rss_growth_mb": (self.peak_rss - self.start_rss) / _MB}


def _timed_trainer_run(
    train_cfg: DictConfig, ray_env: dict[str, str], run_dir: Path, rss_interval_s: float
) -> tuple[list[tuple[int, float, dict[str, int], dict[str, Any]]], dict[str, float]]:
    """Run the trainer ``train_cfg`` selects from a fresh start, timing every logged step.

    Args:
        train_cfg: The composed training config.
        ray_env: Environment for the Ray workers.
        run_dir: Metrics directory of the run.
        rss_interval_s: Driver RSS sampling interval.

    Returns:
        ``(marks, memory)``: one ``(step, perf_counter, Ray traffic since the previous mark,
        logged record)`` per logged step (step 0 = the trainer's start), and the driver's
        ``peak_rss_mb`` / ``rss_growth_mb``.
    """
    from nemo_dp.algorithms.trainer_common import Checkpointer, RunLogger, build_trainer_inputs
    from nemo_dp.data.tokenizer import CharTokenizer
    from nemo_dp.data_plane.factory import make_policy_factory, select_sync_trainer
    from nemo_dp.distributed.worker_group import RayCluster
    from nemo_dp.models.policy import Policy

    class StepClock(RunLogger):
        """Timestamps every logged step and snapshots the Ray traffic counters there."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.marks: list[tuple[int, float, dict[str, int], dict[str, Any]]] = []
            self.traffic: _RayTraffic | None = None

        def start(self, total_steps: int, start_step: int) -> None:
            super().start(total_steps, start_step)
            assert self.traffic is not None
            self.traffic.take()
            self.marks.append((0, time.perf_counter(), {}, {}))

        def log_step(self, step: int, metrics: Any) -> dict[str, Any]:
            record = super().log_step(step, metrics)
            if step > 0:
                assert self.traffic is not None
                self.marks.append((step, time.perf_counter(), self.traffic.take(), dict(record)))
            return record

    tok = CharTokenizer()
    trainer = select_sync_trainer(train_cfg)
    factory = make_policy_factory(train_cfg.data_plane)
    kwargs = {
        "cluster": RayCluster(env_vars=dict(ray_env)),
        "config": train_cfg.policy,
        "vocab_size": tok.vocab_size,
        "pad_id": tok.pad_id,
        "eos_id": tok.eos_id,
        "seed": int(train_cfg.seed),
    }
    gc.collect()
    rss = _RssSampler(rss_interval_s)
    policy = Policy(**kwargs) if factory is None else factory(**kwargs)
    try:
        clock = StepClock(run_dir, metrics_file="metrics.jsonl", plot_file="curves.png", plot=False,
                          progress_bar=False, label=run_dir.name)
        clock.traffic = _RayTraffic(policy.worker_group)
        inputs = build_trainer_inputs(train_cfg)
        trainer(
            policy,
            train_cfg,
            train_loader=inputs.train_loader,
            val_problems=inputs.val_problems,
            tokenizer=tok,
            env=inputs.env,
            logger=clock,
            checkpointer=Checkpointer(run_dir / "ckpt", enabled=False, save_period=0, keep_last=1),
            start_state=None,
        )
    finally:
        policy.shutdown()
        memory = rss.stop()
    return clock.marks, memory


def _grpo_step_run(
    train_cfg: DictConfig, ray_env: dict[str, str], bench: GrpoStepBenchConfig, run_dir: Path
) -> dict[str, Any]:
    """Run one trainer for warmup + measured (+1 validation) steps; per-step costs."""
    marks, memory = _timed_trainer_run(train_cfg, ray_env, run_dir, bench.rss_sample_interval_s)
    # Steps warmup+1 .. warmup+measured (the last step, which validates, is not measured).
    steps = []
    for (s0, t0, _, _), (s1, t1, traffic, record) in zip(marks, marks[1:]):
        if bench.warmup_steps < s1 <= bench.warmup_steps + bench.measured_steps:
            store_read = int(round(float(record.get("data_plane/step/bytes_read_mb", 0.0)) * _MB))
            store_written = int(round(float(record.get("data_plane/step/bytes_written_mb", 0.0)) * _MB))
            steps.append(
                {
                    "step": s1,
                    "step_time_s": t1 - t0,
                    "time/generation_s": record["time/generation_s"],
                    "time/logprobs_s": record["time/logprobs_s"],
                    "time/train_s": record["time/train_s"],
                    "driver_store_wall_ms": float(record.get("data_plane/step/wall_ms", 0.0)),
                    "workers_store_wall_ms_sum": float(record.get("data_plane/workers/step/wall_ms", 0.0)),
                    "workers_store_wall_ms_max_rank": float(
                        record.get("data_plane/workers/step/max_rank_wall_ms", 0.0)
                    ),
                    "driver_store_read_bytes": store_read,
                    "driver_store_written_bytes": store_written,
                    **traffic,
                    "driver_bulk_received_bytes": traffic["ray_received_bulk_bytes"] + store_read,
                    "driver_tensor_received_bytes": traffic["ray_received_bulk_bytes"]
                    + traffic["ray_received_per_row_bytes"]
                    + store_read,
                }
            )
    mean = {k: statistics.fmean(float(s[k]) for s in steps) for k in steps[0] if k != "step"}
    return {"steps": steps, "mean": mean, **memory}


def run_grpo_step_bench(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    """Legacy vs data-plane GRPO step at two batch sizes; write the JSON report.

    Each trainer is selected exactly as the launcher selects it (``select_sync_trainer`` and
    ``make_policy_factory`` on a composed ``conf/config.yaml``), on one Ray for the whole bench.

    Args:
        cfg: The composed bench root config (``bench`` is a ``GrpoStepBenchConfig``).
        output_dir: Where the JSON goes.

    Returns:
        The report that was written.
    """
    from hydra import compose

    from nemo_dp.config import register_configs, validate_config
    from nemo_dp.distributed.ray_init import init_ray, shutdown_ray

    bench = OmegaConf.to_object(cfg.bench)
    assert isinstance(bench, GrpoStepBenchConfig)
    register_configs(Path(__file__).resolve().parents[1] / "recipes")

    def train_config(data_plane: str, samples: int) -> DictConfig:
        overrides = [
            "~recipe",
            f"data_plane={data_plane}",
            f"algorithm.num_generations_per_prompt={bench.group_size}",
            f"algorithm.num_prompts_per_step={samples // bench.group_size}",
            f"policy.train_global_batch_size={samples}",
            f"algorithm.max_steps={bench.warmup_steps + bench.measured_steps + 1}",
            "algorithm.val_at_start=false",
            "algorithm.val_period=0",
            "algorithm.warm_start.enabled=false",
            "checkpointing.enabled=false",
            "logger.plot=false",
            "logger.progress_bar=false",
            *bench.train_overrides,
            *bench.backend_overrides[data_plane],
        ]
        train_cfg = compose("config", overrides=overrides)
        validate_config(train_cfg)
        return train_cfg

    tq_cfg = train_config("tq", bench.samples_per_step[0]).data_plane
    results: list[dict[str, Any]] = []
    ray_env = init_ray(num_cpus=bench.num_cpus, data_plane_cfg=tq_cfg)
    try:
        for samples in bench.samples_per_step:
            for dp in bench.backends:
                print(f"[bench] grpo_step: {samples} samples/step, data_plane={dp}", flush=True)
                run = _grpo_step_run(train_config(dp, samples), ray_env, bench, output_dir / f"{dp}_{samples}")
                results.append({"samples_per_step": samples, "data_plane": dp, **run})
    finally:
        shutdown_ray()

    comparisons = []
    for samples in bench.samples_per_step:
        by_dp = {r["data_plane"]: r for r in results if r["samples_per_step"] == samples}
        if {"disabled", "tq"} <= set(by_dp):
            legacy, tq = by_dp["disabled"]["mean"], by_dp["tq"]["mean"]
            bulk_ratio = tq["driver_bulk_received_bytes"] / max(1.0, legacy["driver_bulk_received_bytes"])
            comparisons.append(
                {
                    "samples_per_step": samples,
                    "step_time_ratio_tq_over_legacy": tq["step_time_s"] / legacy["step_time_s"],
                    "legacy_step_time_s": legacy["step_time_s"],
                    "tq_step_time_s": tq["step_time_s"],
                    "legacy_driver_bulk_received_bytes": legacy["driver_bulk_received_bytes"],
                    "tq_driver_bulk_received_bytes": tq["driver_bulk_received_bytes"],
                    "driver_bulk_ratio_tq_over_legacy": bulk_ratio,
                    "bulk_target_met": bulk_ratio <= bench.target_bulk_ratio,
                    "legacy_driver_tensor_received_bytes": legacy["driver_tensor_received_bytes"],
                    "tq_driver_tensor_received_bytes": tq["driver_tensor_received_bytes"],
                    "driver_tensor_ratio_tq_over_legacy": tq["driver_tensor_received_bytes"]
                    / max(1.0, legacy["driver_tensor_received_bytes"]),
                    "legacy_ray_received_pickled_bytes": legacy["ray_received_pickled_bytes"],
                    "tq_ray_received_pickled_bytes": tq["ray_received_pickled_bytes"],
                    "ray_pickled_ratio_tq_over_legacy": tq["ray_received_pickled_bytes"]
                    / max(1.0, legacy["ray_received_pickled_bytes"]),
                    "legacy_ray_sent_bulk_bytes": legacy["ray_sent_bulk_bytes"],
                    "tq_ray_sent_bulk_bytes": tq["ray_sent_bulk_bytes"],
                    "tq_driver_store_written_bytes": tq["driver_store_written_bytes"],
                    "tq_driver_store_wall_ms": tq["driver_store_wall_ms"],
                    "tq_workers_store_wall_ms_max_rank": tq["workers_store_wall_ms_max_rank"],
                    "tq_extra_time_s": tq["step_time_s"] - legacy["step_time_s"],
                    "time_split_legacy_s": {k: legacy[f"time/{k}_s"] for k in ("generation", "logprobs", "train")},
                    "time_split_tq_s": {k: tq[f"time/{k}_s"] for k in ("generation", "logprobs", "train")},
                    "legacy_peak_rss_mb": by_dp["disabled"]["peak_rss_mb"],
                    "tq_peak_rss_mb": by_dp["tq"]["peak_rss_mb"],
                    "legacy_rss_growth_mb": by_dp["disabled"]["rss_growth_mb"],
                    "tq_rss_growth_mb": by_dp["tq"]["rss_growth_mb"],
                }
            )
    report = {
        "bench": "grpo_step",
        "config": OmegaConf.to_container(cfg, resolve=True),
        "columns": {
            "driver_bulk_received_bytes": "per step: per-token (dim >= 2) tensor bytes Ray returned "
            "to the driver + bytes the driver read from the store (observability counters)",
            "driver_tensor_received_bytes": "as above plus 1-D per-row tensors (driver_carry)",
            "ray_received_pickled_bytes": "per step: pickled size of everything Ray returned "
            "to the driver (metas, carries, metrics included)",
            "ray_sent_bulk_bytes": "per step: per-token tensor bytes the driver shipped to workers",
            "step_time_s": "wall time between consecutive logged steps (validation step excluded)",
        },
        "runs": results,
        "comparisons": comparisons,
    }
    out_path = output_dir / bench.output_file
    out_path.write_text(json.dumps(report, indent=2, default=str))
    for c in comparisons:
        print(
            f"[grpo_step] {c['samples_per_step']} samples/step: step time legacy "
            f"{c['legacy_step_time_s']:.3f} s, tq {c['tq_step_time_s']:.3f} s "
            f"(ratio {c['step_time_ratio_tq_over_legacy']:.2f}); driver bulk received legacy "
            f"{c['legacy_driver_bulk_received_bytes'] / 1e3:.1f} kB, tq "
            f"{c['tq_driver_bulk_received_bytes'] / 1e3:.1f} kB (ratio "
            f"{c['driver_bulk_ratio_tq_over_legacy']:.3f}, target <= {bench.target_bulk_ratio}: "
            f"{'met' if c['bulk_target_met'] else 'NOT met'}); all tensors received (per-row carry "
            f"included) ratio {c['driver_tensor_ratio_tq_over_legacy']:.3f}; pickled Ray returns ratio "
            f"{c['ray_pickled_ratio_tq_over_legacy']:.3f}; driver sent bulk legacy "
            f"{c['legacy_ray_sent_bulk_bytes'] / 1e3:.1f} kB, tq "
            f"{(c['tq_ray_sent_bulk_bytes'] + c['tq_driver_store_written_bytes']) / 1e3:.1f} kB; "
            f"tq store time per step: driver {c['tq_driver_store_wall_ms']:.0f} ms, slowest worker "
            f"{c['tq_workers_store_wall_ms_max_rank']:.0f} ms (extra step time "
            f"{1000 * c['tq_extra_time_s']:.0f} ms); peak RSS legacy "
            f"{c['legacy_peak_rss_mb']:.0f} MB, tq {c['tq_peak_rss_mb']:.0f} MB",
            flush=True,
        )
    print(f"[bench] report: {out_path}", flush=True)
    return report


# ---------------------------------------------------------------------------------------------
# bench=sft_step: legacy vs data-plane SFT trainers (disabled / local / tq), side by side
# ---------------------------------------------------------------------------------------------

SFT_STEP_TRAINERS: tuple[str, ...] = ("disabled", "local", "tq")


@dataclass
class SftStepBenchConfig:
    """``bench`` for ``bench=sft_step`` (schema of ``conf/bench/sft_step.yaml``)."""

    name: str = "sft_step"
    global_batch_sizes: list[int] = field(default_factory=lambda: [128, 512])
    micro_batch_size: int = 64
    warmup_steps: int = 2
    measured_steps: int = 5
    backends: list[str] = field(default_factory=lambda: list(SFT_STEP_TRAINERS))
    train_overrides: list[str] = field(default_factory=list)
    num_cpus: int = 2
    output_file: str = "bench_sft_step.json"

    def __post_init__(self) -> None:
        def fail(key: str, message: str) -> None:
            raise ValueError(f"bench.{key}: {message}")

        if not self.global_batch_sizes or any(b < 1 for b in self.global_batch_sizes):
            fail("global_batch_sizes", f"need positive sizes, got {self.global_batch_sizes}")
        if self.micro_batch_size < 1:
            fail("micro_batch_size", f"must be >= 1, got {self.micro_batch_size}")
        unknown = [d for d in self.backends if d not in SFT_STEP_TRAINERS]
        if unknown or not self.backends or len(set(self.backends)) != len(self.backends):
            fail("backends", f"need distinct options of {list(SFT_STEP_TRAINERS)}, got {self.backends}")
        for key in ("measured_steps", "num_cpus"):
            if getattr(self, key) < 1:
                fail(key, f"must be >= 1, got {getattr(self, key)}")
        if self.warmup_steps < 0:
            fail("warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        if not self.output_file or "/" in self.output_file:
            fail("output_file", f"must be a plain file name, got {self.output_file!r}")


def _sft_step_run(
    train_cfg: DictConfig, ray_env: dict[str, str], bench: SftStepBenchConfig, run_dir: Path
) -> dict[str, Any]:
    """Run one SFT trainer for warmup + measured (+1 validation) steps; per-step costs.

    Bytes crossing the driver are counted on the worker group's calls (``_RayTraffic``): what
    the driver ships (the legacy trainer's collated shards; the data-plane trainer's metas) and
    everything returned to it (envelopes, metrics), pickled.
    """
    marks, memory = _timed_trainer_run(train_cfg, ray_env, run_dir, 0.005)
    steps = []
    for (_, t0, _, _), (s1, t1, traffic, record) in zip(marks, marks[1:]):
        if bench.warmup_steps < s1 <= bench.warmup_steps + bench.measured_steps:
            sent = traffic["ray_sent_bulk_bytes"] + traffic["ray_sent_per_row_bytes"]
            steps.append(
                {
                    "step": s1,
                    "step_time_s": t1 - t0,
                    "time/train_s": record["time/train_s"],
                    **traffic,
                    "driver_sent_tensor_bytes": sent,
                    "driver_held_bytes": sent + traffic["ray_received_pickled_bytes"],
                }
            )
    mean = {k: statistics.fmean(float(s[k]) for s in steps) for k in steps[0] if k != "step"}
    return {"steps": steps, "mean": mean, **memory}


def run_sft_step_bench(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    """Legacy (``disabled``) vs ``local`` vs ``tq`` SFT step at each batch size; write the JSON.

    Each trainer is selected exactly as the launcher selects it (``select_sync_trainer`` and
    ``make_policy_factory`` on a composed ``conf/config.yaml``), on one Ray for the whole bench.

    Args:
        cfg: The composed bench root config (``bench`` is a ``SftStepBenchConfig``).
        output_dir: Where the JSON goes.

    Returns:
        The report that was written.
    """
    from hydra import compose

    from nemo_dp.config import register_configs, validate_config
    from nemo_dp.distributed.ray_init import init_ray, shutdown_ray

    bench = OmegaConf.to_object(cfg.bench)
    assert isinstance(bench, SftStepBenchConfig)
    register_configs(Path(__file__).resolve().parents[1] / "recipes")

    def train_config(data_plane: str, gbs: int) -> DictConfig:
        overrides = [
            "~recipe",
            "algorithm=sft",
            f"data_plane={data_plane}",
            f"policy.train_global_batch_size={gbs}",
            f"policy.train_micro_batch_size={min(bench.micro_batch_size, gbs)}",
            f"algorithm.num_train_samples={gbs * (bench.warmup_steps + bench.measured_steps + 1)}",
            f"algorithm.max_steps={bench.warmup_steps + bench.measured_steps + 1}",
            "algorithm.val_at_start=false",
            "algorithm.val_period=0",
            "algorithm.val_samples=8",
            "checkpointing.enabled=false",
            "logger.plot=false",
            "logger.progress_bar=false",
            *bench.train_overrides,
        ]
        train_cfg = compose("config", overrides=overrides)
        validate_config(train_cfg)
        return train_cfg

    tq_cfg = train_config("tq", bench.global_batch_sizes[0]).data_plane
    results: list[dict[str, Any]] = []
    ray_env = init_ray(num_cpus=bench.num_cpus, data_plane_cfg=tq_cfg)
    try:
        for gbs in bench.global_batch_sizes:
            for dp in bench.backends:
                print(f"[bench] sft_step: {gbs} rows/step, data_plane={dp}", flush=True)
                run = _sft_step_run(train_config(dp, gbs), ray_env, bench, output_dir / f"sft_{dp}_{gbs}")
                results.append({"global_batch_size": gbs, "data_plane": dp, **run})
    finally:
        shutdown_ray()

    table = []
    for gbs in bench.global_batch_sizes:
        by_dp = {r["data_plane"]: r for r in results if r["global_batch_size"] == gbs}
        base = by_dp.get("disabled")
        for dp, r in by_dp.items():
            m = r["mean"]
            table.append(
                {
                    "global_batch_size": gbs,
                    "data_plane": dp,
                    "step_time_s": m["step_time_s"],
                    "train_time_s": m["time/train_s"],
                    "driver_held_bytes": m["driver_held_bytes"],
                    "driver_sent_tensor_bytes": m["driver_sent_tensor_bytes"],
                    "ray_received_pickled_bytes": m["ray_received_pickled_bytes"],
                    "peak_rss_mb": r["peak_rss_mb"],
                    "step_time_vs_disabled": None if base is None else m["step_time_s"] / base["mean"]["step_time_s"],
                    "driver_bytes_vs_disabled": None
                    if base is None
                    else m["driver_held_bytes"] / max(1.0, base["mean"]["driver_held_bytes"]),
                }
            )
    report = {
        "bench": "sft_step",
        "config": OmegaConf.to_container(cfg, resolve=True),
        "columns": {
            "driver_held_bytes": "per step: tensor bytes the driver shipped to the workers + pickled "
            "size of everything returned to it (legacy: the collated batch shards; data plane: metas "
            "out, envelopes and metrics back)",
            "step_time_s": "wall time between consecutive logged steps (validation step excluded)",
        },
        "runs": results,
        "table": table,
    }
    out_path = output_dir / bench.output_file
    out_path.write_text(json.dumps(report, indent=2, default=str))
    print(f"{'rows':>6} {'data_plane':>10} {'step ms':>9} {'x legacy':>9} {'driver bytes':>13} {'x legacy':>9} {'peak RSS MB':>12}")
    for row in table:
        st = row["step_time_vs_disabled"]
        db = row["driver_bytes_vs_disabled"]
        print(
            f"{row['global_batch_size']:>6} {row['data_plane']:>10} {row['step_time_s'] * 1e3:>9.1f} "
            f"{'-' if st is None else f'{st:.2f}':>9} {row['driver_held_bytes']:>13.0f} "
            f"{'-' if db is None else f'{db:.3f}':>9} {row['peak_rss_mb']:>12.0f}",
            flush=True,
        )
    print(f"[bench] report: {out_path}", flush=True)
    return report


#: ``bench.name`` -> runner.  Later benchmarks (``grpo_step``, ``sft_step``) register here with
#: their own ``conf/bench/<name>.yaml`` and schema.
BENCHES: dict[str, Callable[[DictConfig, Path], dict[str, Any]]] = {
    "data_plane": run_data_plane_bench,
    "grpo_step": run_grpo_step_bench,
    "sft_step": run_sft_step_bench,
}


def run_bench(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    """Dispatch on ``bench.name``.

    Raises:
        ValueError: Unknown bench name (lists the known ones).
    """
    name = cfg.bench.name
    runner = BENCHES.get(name)
    if runner is None:
        raise ValueError(f"unknown bench.name {name!r}; known benches: {sorted(BENCHES)}")
    return runner(cfg, output_dir)


@hydra.main(config_path="../conf", config_name="benchmark", version_base=None)
def main(cfg: DictConfig) -> None:
    """Hydra entry point: ``python launchers/bench.py bench=data_plane [overrides]``."""
    run_bench(cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    register_bench_configs()
    main()
