"""``bench=data_plane``: put/get throughput of every data-plane backend on the same bytes."""

from __future__ import annotations

import gc
import json
import logging
import os
import platform
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from nemo_dp.bench.backends import Backend, ClientBackend, MemcpyBackend, RayObjectStoreBackend, make_reader_actor
from nemo_dp.bench.common import (
    LOCAL,
    MB,
    MEMCPY,
    RAY_NUMPY,
    RAY_TD,
    RAY_STORE,
    TQ_ADAPTER,
    TQ_RAW,
    DataPlaneBenchConfig,
    make_payload,
)
from nemo_dp.bench.report import Row, add_ratios, evaluate_targets, fmt, format_table, summarize
from nemo_dp.data_plane.factory import build_data_plane_client, coerce_data_plane_config
from nemo_dp.data_plane.interfaces import DataPlaneConfig, LocalDataPlaneConfig

__all__ = ["run_data_plane_bench"]

_LOG = logging.getLogger("nemo_dp.bench")
_NEEDS_TQ = {TQ_ADAPTER, TQ_RAW}
_NEEDS_RAY = {TQ_ADAPTER, TQ_RAW, RAY_TD, RAY_NUMPY, RAY_STORE}


def _setup_backends(
    bench: DataPlaneBenchConfig,
    tq_cfg: Any,
    local_cfg: Any,
    opened: list[Backend],
    errors: dict[str, str],
    raw_backends: Mapping[str, Callable[[], Backend]],
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
                make_raw = raw_backends.get(TQ_RAW)
                if make_raw is None:
                    errors[TQ_RAW] = "no raw TransferQueue backend was given (launchers/bench.py provides it)"
                else:
                    try:
                        backends[TQ_RAW] = make_raw()
                    except Exception as exc:
                        errors[TQ_RAW] = f"{type(exc).__name__}: {exc}"
    if RAY_STORE in selected:
        from nemo_dp.data_plane.ray_store_config import RayStoreDataPlaneConfig

        try:
            store = build_data_plane_client(RayStoreDataPlaneConfig(), bootstrap=True)
        except Exception as exc:  # recorded, reported, and fails the run at the end
            errors[RAY_STORE] = f"ray_store bootstrap failed: {type(exc).__name__}: {exc}"
        else:
            backends[RAY_STORE] = ClientBackend(RAY_STORE, store)
            opened.append(backends[RAY_STORE])
    if selected & {RAY_TD, RAY_NUMPY}:
        reader = make_reader_actor()
        if RAY_TD in selected:
            backends[RAY_TD] = RayObjectStoreBackend(RAY_TD, reader, as_numpy=False)
        if RAY_NUMPY in selected:
            backends[RAY_NUMPY] = RayObjectStoreBackend(RAY_NUMPY, reader, as_numpy=True)
    return backends


def run_data_plane_bench(
    cfg: DictConfig, output_dir: Path, *, raw_backends: Mapping[str, Callable[[], Backend]] | None = None
) -> dict[str, Any]:
    """Measure every selected backend (``raw_backends``: constructors of ones defined outside the package) on
    every payload and size; write the JSON report and return it (RuntimeError instead if any backend failed)."""
    bench = OmegaConf.to_object(cfg.bench)
    assert isinstance(bench, DataPlaneBenchConfig)
    selected = set(bench.backends)
    local_cfg = coerce_data_plane_config(cfg.local_data_plane) if LOCAL in selected else None
    if local_cfg is not None and not isinstance(local_cfg, LocalDataPlaneConfig):
        raise ValueError("local_data_plane must be the 'local' data_plane option")
    tq_cfg = coerce_data_plane_config(cfg.data_plane) if selected & _NEEDS_TQ else None
    if tq_cfg is not None and not (isinstance(tq_cfg, DataPlaneConfig) and tq_cfg.enabled):
        raise ValueError(f"backends {sorted(selected & _NEEDS_TQ)} need data_plane=tq (enabled TransferQueue)")

    rows: list[Row] = []
    errors: dict[str, str] = {}
    opened: list[Backend] = []
    ray_started = False
    try:
        if selected & _NEEDS_RAY:
            from nemo_dp.data_plane.registry import ray_start_args
            from nemo_dp.distributed.ray_init import init_ray

            init_ray(num_cpus=bench.num_cpus, **ray_start_args(tq_cfg))
            ray_started = True
        backends = _setup_backends(bench, tq_cfg, local_cfg, opened, errors, raw_backends or {})
        for kind in bench.payloads:
            for size in bench.sizes_mib:
                payload = make_payload(kind, size, bench)
                reps = bench.large_reps if size >= bench.large_from_mib else bench.reps
                sized = f"{payload.rows} rows, {payload.nbytes / MB:.1f} MB"
                print(f"[bench] {kind} {size:g} MiB: {sized}, {reps} reps", flush=True)
                times: dict[str, dict[str, list[float]]] = {}
                # Repetition-major order: every backend sees the same load drift on this shared
                # machine instead of one backend getting all the quiet seconds.
                for i in range(bench.warmup + reps):
                    for name in bench.backends:
                        backend = backends.get(name)
                        if backend is None or name in errors:
                            continue
                        try:
                            sample = backend.once(payload, f"{kind}_{size:g}_{i}", verify=i == bench.warmup)
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
            f"[target] {t['target']}: median {fmt(t['value'], '.2f')} -> {verdict[t['met']]}; "
            f"min {fmt(t['value_min'], '.2f')} -> {verdict[t['met_min']]}",
            flush=True,
        )
    print(f"[bench] report: {out_path}", flush=True)
    if errors:
        for name, message in errors.items():
            print(f"[bench] ERROR {name}: {message}", flush=True)
        raise RuntimeError(f"bench backends failed: {sorted(errors)} (details in {out_path})")
    return report
