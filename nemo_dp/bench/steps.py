"""Step benchmarks (``bench=grpo_step`` / ``ppo_step`` / ``sft_step``): legacy vs data-plane trainers.

Each trainer runs from a fresh start on one Ray; warm-up steps and the final (validating) step are not measured."""

from __future__ import annotations

import gc
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nemo_dp.bench import bench_fail
from nemo_dp.bench.common import MB
from nemo_dp.bench.probes import RayTraffic, RssSampler
from nemo_dp.bench.report import print_rl_comparisons, print_sft_table, rl_comparisons, sft_table
from nemo_dp.bench.store_calls import STORE_COLUMNS, print_store_breakdown, store_breakdown, store_op_columns
from nemo_dp.training import Checkpointer, RunLogger, TrainHooks, main_phase, make_policy, make_tokenizer, run_phase

__all__ = [
    "RL_STEP_TRAINERS",
    "GRPO_STEP_TRAINERS",
    "SFT_STEP_TRAINERS",
    "GrpoStepBenchConfig",
    "PpoStepBenchConfig",
    "SftStepBenchConfig",
    "StepBench",
    "run_step_bench",
    "launcher_policy_overrides",
    "STEP_BENCHES",
]

RL_STEP_TRAINERS: tuple[str, ...] = ("disabled", "tq", "ray")
#: GRPO also runs the asynchronous trainer (``tq_async``).
GRPO_STEP_TRAINERS: tuple[str, ...] = (*RL_STEP_TRAINERS, "tq_async")
#: Bench backend -> the training overrides that select it (else a plain ``data_plane`` option).
_BACKEND_SELECTION: dict[str, tuple[str, ...]] = {"tq_async": ("data_plane=tq", "algorithm.async_rollout.enabled=true")}
SFT_STEP_TRAINERS: tuple[str, ...] = ("disabled", "local", "tq", "ray")
_REPO_ROOT = Path(__file__).resolve().parents[2]

Mark = tuple[int, float, dict[str, int], dict[str, Any]]

_DRIVER_STORE_WALL = "data_plane/step/wall_ms"


def _check_common(cfg: Any, legal_backends: tuple[str, ...], *, overrides_required: bool = False) -> None:
    unknown = [d for d in cfg.backends if d not in legal_backends]
    if unknown or not cfg.backends or len(set(cfg.backends)) != len(cfg.backends):
        bench_fail("backends", f"need distinct options of {list(legal_backends)}, got {cfg.backends}")
    for key in ("measured_steps", "num_cpus"):
        if getattr(cfg, key) < 1:
            bench_fail(key, f"must be >= 1, got {getattr(cfg, key)}")
    if cfg.warmup_steps < 0:
        bench_fail("warmup_steps", f"must be >= 0, got {cfg.warmup_steps}")
    if not cfg.output_file or "/" in cfg.output_file:
        bench_fail("output_file", f"must be a plain file name, got {cfg.output_file!r}")
    missing = [d for d in cfg.backends if d not in cfg.backend_overrides]
    if missing and overrides_required:
        bench_fail("backend_overrides", f"no entry for {missing}")
    if not cfg.rss_sample_interval_s > 0:
        bench_fail("rss_sample_interval_s", f"must be > 0, got {cfg.rss_sample_interval_s}")


def _observed_overrides(*backends: str) -> Any:
    """``backend_overrides`` field: data-plane observability on for each backend but ``disabled``."""
    on = ["data_plane.observability.enabled=true"]
    return field(default_factory=lambda: {b: [] if b == "disabled" else list(on) for b in backends})


@dataclass
class GrpoStepBenchConfig:
    """``bench`` for ``bench=grpo_step`` (schema of ``conf_bench/bench/grpo_step.yaml``)."""

    name: str = "grpo_step"
    samples_per_step: list[int] = field(default_factory=lambda: [32, 128])
    group_size: int = 8
    warmup_steps: int = 1
    measured_steps: int = 3
    backends: list[str] = field(default_factory=lambda: list(RL_STEP_TRAINERS))
    train_overrides: list[str] = field(default_factory=list)
    backend_overrides: dict[str, list[str]] = _observed_overrides("disabled", "tq", "tq_async", "ray")
    rss_sample_interval_s: float = 0.005
    target_bulk_ratio: float = 0.05
    num_cpus: int = 2
    output_file: str = "bench_grpo_step.json"

    def legal_backends(self) -> tuple[str, ...]:
        return GRPO_STEP_TRAINERS

    def __post_init__(self) -> None:
        if not self.samples_per_step or any(s < 1 for s in self.samples_per_step):
            bench_fail("samples_per_step", f"need positive sizes, got {self.samples_per_step}")
        if self.group_size < 1 or any(s % self.group_size for s in self.samples_per_step):
            bench_fail("group_size", f"must be >= 1 and divide every samples_per_step {self.samples_per_step}")
        _check_common(self, self.legal_backends(), overrides_required=True)


@dataclass
class PpoStepBenchConfig(GrpoStepBenchConfig):
    """``bench`` for ``bench=ppo_step`` (schema of ``conf_bench/bench/ppo_step.yaml``)."""

    name: str = "ppo_step"
    ppo_epochs: int = 2
    output_file: str = "bench_ppo_step.json"

    def legal_backends(self) -> tuple[str, ...]:
        return RL_STEP_TRAINERS  # PPO has no asynchronous trainer

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ppo_epochs < 1:
            bench_fail("ppo_epochs", f"must be >= 1, got {self.ppo_epochs}")


@dataclass
class SftStepBenchConfig:
    """``bench`` for ``bench=sft_step`` (schema of ``conf_bench/bench/sft_step.yaml``)."""

    name: str = "sft_step"
    global_batch_sizes: list[int] = field(default_factory=lambda: [128, 512])
    micro_batch_size: int = 64
    warmup_steps: int = 2
    measured_steps: int = 5
    backends: list[str] = field(default_factory=lambda: list(SFT_STEP_TRAINERS))
    train_overrides: list[str] = field(default_factory=list)
    backend_overrides: dict[str, list[str]] = _observed_overrides("local", "tq", "ray")
    rss_sample_interval_s: float = 0.005
    num_cpus: int = 2
    output_file: str = "bench_sft_step.json"

    def __post_init__(self) -> None:
        if not self.global_batch_sizes or any(b < 1 for b in self.global_batch_sizes):
            bench_fail("global_batch_sizes", f"need positive sizes, got {self.global_batch_sizes}")
        if self.micro_batch_size < 1:
            bench_fail("micro_batch_size", f"must be >= 1, got {self.micro_batch_size}")
        _check_common(self, SFT_STEP_TRAINERS)


StoreProbe = Callable[[float], dict[str, float]]


class StepClock(RunLogger):
    """A ``RunLogger`` that timestamps every logged step and snapshots the Ray traffic there; ``store_probe``
    (the policy's ``data_plane_step_metrics``) fills in the store counters of a record that lacks them (SFT)."""

    def __init__(self, *args: Any, traffic: RayTraffic, store_probe: StoreProbe | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.marks: list[Mark] = []
        self.traffic = traffic
        self.store_probe = store_probe

    def start(self, total_steps: int, start_step: int) -> None:
        """Open the phase and take the step-0 mark (traffic before it is dropped)."""
        super().start(total_steps, start_step)
        self.traffic.take()
        if self.store_probe is not None:
            self.store_probe(1.0)  # drop pre-run store traffic
        self.marks.append((0, time.perf_counter(), {}, {}))

    def log_step(self, step: int, metrics: Any) -> dict[str, Any]:
        """Log the step and mark it."""
        record = super().log_step(step, metrics)
        if step > 0:
            now = time.perf_counter()
            mark = dict(record)
            if self.store_probe is not None and _DRIVER_STORE_WALL not in mark:
                mark.update(self.store_probe(max(now - self.marks[-1][1], 1e-9)))
            self.marks.append((step, now, self.traffic.take(), mark))
        return record


def timed_phase_run(
    train_cfg: DictConfig, ray_env: dict[str, str], run_dir: Path, rss_interval_s: float
) -> tuple[list[Mark], dict[str, float]]:
    """Run the phase ``train_cfg`` describes from a fresh start; return ``(marks, driver RSS keys)``.

    A mark per logged step (step 0 = the start): ``(step, perf_counter, Ray traffic since the previous mark, record)``.
    """
    from nemo_dp.algorithms.selection import select_sync_trainer

    tok = make_tokenizer(train_cfg)
    phase = main_phase(train_cfg)
    trainer = select_sync_trainer(train_cfg)  # imported before the memory sampling starts
    gc.collect()
    rss = RssSampler(rss_interval_s)
    policy = make_policy(train_cfg, tok, env_vars=ray_env)
    try:
        traffic = RayTraffic(policy.worker_group)
        probe = getattr(policy, "data_plane_step_metrics", None)
        clock = StepClock(
            run_dir,
            store_probe=probe if callable(probe) else None,
            metrics_file="metrics.jsonl",
            plot_file="curves.png",
            plot=False,
            progress_bar=False,
            label=run_dir.name,
            traffic=traffic,
        )
        run_phase(
            phase,
            policy,
            tokenizer=tok,
            logger=clock,
            checkpointer=Checkpointer(run_dir / "ckpt", enabled=False, save_period=0, keep_last=1),
            # A model the trainer builds itself (PPO's critic) is counted like the policy.
            hooks=TrainHooks(on_model_built=lambda role, model: traffic.attach(model.worker_group)),
            trainer=trainer,
        )
    finally:
        policy.shutdown()
        memory = rss.stop()
    return clock.marks, memory


def rl_step_row(step: int, step_time_s: float, traffic: dict[str, int], record: dict[str, Any]) -> dict[str, Any]:
    """One measured GRPO / PPO step: timings, store and Ray traffic of the driver."""
    store_read = int(round(float(record.get("data_plane/step/bytes_read_mb", 0.0)) * MB))
    store_written = int(round(float(record.get("data_plane/step/bytes_written_mb", 0.0)) * MB))
    bulk_in = traffic["ray_received_bulk_bytes"] + store_read
    return {
        "step": step,
        "step_time_s": step_time_s,
        # The asynchronous trainer generates concurrently and logs no generation time.
        "time/generation_s": record.get("time/generation_s", 0.0),
        "time/logprobs_s": record["time/logprobs_s"],
        "time/train_s": record["time/train_s"],
        "driver_store_wall_ms": float(record.get("data_plane/step/wall_ms", 0.0)),
        "workers_store_wall_ms_sum": float(record.get("data_plane/workers/step/wall_ms", 0.0)),
        "workers_store_wall_ms_max_rank": float(record.get("data_plane/workers/step/max_rank_wall_ms", 0.0)),
        "driver_store_read_bytes": store_read,
        "driver_store_written_bytes": store_written,
        **traffic,
        "driver_bulk_received_bytes": bulk_in,
        "driver_tensor_received_bytes": bulk_in + traffic["ray_received_per_row_bytes"],
        **store_op_columns(record),
    }


def sft_step_row(step: int, step_time_s: float, traffic: dict[str, int], record: dict[str, Any]) -> dict[str, Any]:
    """One measured SFT step: what the driver shipped and everything returned to it."""
    sent = traffic["ray_sent_bulk_bytes"] + traffic["ray_sent_per_row_bytes"]
    return {
        "step": step,
        "step_time_s": step_time_s,
        "time/train_s": record["time/train_s"],
        **traffic,
        "driver_sent_tensor_bytes": sent,
        "driver_held_bytes": sent + traffic["ray_received_pickled_bytes"],
        **store_op_columns(record),
    }


@dataclass
class StepBench:
    """What distinguishes one step benchmark from another (``schema``: its ``bench`` dataclass;
    ``size_key``: the batch-size axis in the report; ``summarize``: keys added to the report)."""

    name: str
    schema: type
    size_key: str
    sizes: Callable[[Any], list[int]]
    train_overrides: Callable[[Any, str, int], list[str]]
    step_row: Callable[[int, float, dict[str, int], dict[str, Any]], dict[str, Any]]
    summarize: Callable[[Any, list[dict[str, Any]]], dict[str, Any]]
    columns: dict[str, str]
    print_summary: Callable[[Any, dict[str, Any]], None]
    run_prefix: str = ""


def _measured(bench_cfg: Any, spec: StepBench, marks: list[Mark]) -> list[dict[str, Any]]:
    """Rows of steps ``warmup+1 .. warmup+measured`` (the final validating step is not measured)."""
    steps = [
        spec.step_row(s1, t1 - t0, traffic, record)
        for (_, t0, _, _), (s1, t1, traffic, record) in zip(marks, marks[1:])
        if bench_cfg.warmup_steps < s1 <= bench_cfg.warmup_steps + bench_cfg.measured_steps
    ]
    if len(steps) != bench_cfg.measured_steps:
        raise RuntimeError(
            f"bench {spec.name}: measured {len(steps)} steps, expected bench.measured_steps="
            f"{bench_cfg.measured_steps} (logged steps: {[m[0] for m in marks]})"
        )
    return steps


def _mean_row(steps: list[dict[str, Any]]) -> dict[str, float]:
    """Per-key mean over the measured steps; a store op a step did not call counts 0 there."""
    keys: list[str] = []
    for row in steps:
        keys.extend(k for k in row if k != "step" and k not in keys)
    return {k: statistics.fmean(float(row.get(k, 0.0)) for row in steps) for k in keys}


def launcher_policy_overrides() -> list[str]:
    """The bench command line's ``policy=``/``env=``/``policy.<key>=``/``env.<key>=`` overrides, in order (empty
    outside a Hydra run); every training config the bench composes gets these first."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    out: list[str] = []
    for item in map(str, HydraConfig.get().overrides.task):
        choice = re.match(r"^\+?(policy|env)=(.*)$", item)
        if choice is not None:  # the training config always has these groups to select in
            out.append(f"{choice.group(1)}={choice.group(2)}")
        elif re.match(r"^(\+\+|\+|~)?(policy|env)\.", item):
            out.append(item)
    return out


def run_step_bench(cfg: DictConfig, output_dir: Path, spec: StepBench) -> dict[str, Any]:
    """Run every (size, data plane) of a step benchmark on one Ray; write (to ``output_dir``) and return the report."""
    import json

    from hydra import compose

    from nemo_dp.config import register_configs, validate_config
    from nemo_dp.data_plane.registry import ray_start_args
    from nemo_dp.distributed.ray_init import init_ray, shutdown_ray

    from nemo_dp.models.builders import prepare_policy, validate_policy

    bench = OmegaConf.to_object(cfg.bench)
    if not isinstance(bench, spec.schema):
        raise ValueError(f"bench: expected the {spec.name} schema, got {type(bench).__name__}")
    register_configs(_REPO_ROOT / "recipes")
    policy_overrides = launcher_policy_overrides()

    def train_config(data_plane: str, size: int) -> DictConfig:
        # The bench's own keys come after the launcher's policy overrides, so they win.
        train_cfg = compose("config", overrides=[*policy_overrides, *spec.train_overrides(bench, data_plane, size)])
        validate_config(train_cfg)
        # As the training launcher does before Ray starts (builds an offline tiny checkpoint on first use).
        prepare_policy(train_cfg.policy)
        validate_policy(train_cfg.policy)
        return train_cfg

    sizes = spec.sizes(bench)
    tq_cfg = train_config("tq", sizes[0]).data_plane
    results: list[dict[str, Any]] = []
    ray_env = init_ray(num_cpus=bench.num_cpus, **ray_start_args(tq_cfg))
    try:
        for size in sizes:
            for dp in bench.backends:
                print(f"[bench] {spec.name}: {size} {spec.size_key}, data_plane={dp}", flush=True)
                run_dir = output_dir / f"{spec.run_prefix}{dp}_{size}"
                marks, memory = timed_phase_run(train_config(dp, size), ray_env, run_dir, bench.rss_sample_interval_s)
                steps = _measured(bench, spec, marks)
                mean = _mean_row(steps)
                results.append({spec.size_key: size, "data_plane": dp, "steps": steps, "mean": mean, **memory})
    finally:
        shutdown_ray()

    summary = spec.summarize(bench, results)
    summary["store_breakdown"] = store_breakdown(results, spec.size_key)
    report = {
        "bench": spec.name,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "columns": spec.columns,
        "runs": results,
        **summary,
    }
    out_path = output_dir / bench.output_file
    out_path.write_text(json.dumps(report, indent=2, default=str))
    spec.print_summary(bench, summary)
    print_store_breakdown(spec.name, spec.size_key, summary["store_breakdown"])
    print(f"[bench] report: {out_path}", flush=True)
    return report


_SHARED_TRAIN_OVERRIDES: tuple[str, ...] = (
    "~recipe",
    "algorithm.val_at_start=false",
    "algorithm.val_period=0",
    "checkpointing.enabled=false",
    "logger.plot=false",
    "logger.progress_bar=false",
)


def _rl_overrides(algorithm: str, bench: Any, data_plane: str, samples: int) -> list[str]:
    extra = [f"algorithm.ppo_epochs={bench.ppo_epochs}"] if algorithm == "ppo" else []
    return [
        *_SHARED_TRAIN_OVERRIDES,
        f"algorithm={algorithm}",
        *_BACKEND_SELECTION.get(data_plane, (f"data_plane={data_plane}",)),
        f"algorithm.num_generations_per_prompt={bench.group_size}",
        f"algorithm.num_prompts_per_step={samples // bench.group_size}",
        f"policy.train_global_batch_size={samples}",
        f"algorithm.max_steps={bench.warmup_steps + bench.measured_steps + 1}",
        "algorithm.warm_start.enabled=false",
        *extra,
        *bench.train_overrides,
        *bench.backend_overrides[data_plane],
    ]


def _sft_overrides(bench: Any, data_plane: str, gbs: int) -> list[str]:
    steps = bench.warmup_steps + bench.measured_steps + 1
    return [
        *_SHARED_TRAIN_OVERRIDES,
        "algorithm=sft",
        f"data_plane={data_plane}",
        f"policy.train_global_batch_size={gbs}",
        f"policy.train_micro_batch_size={min(bench.micro_batch_size, gbs)}",
        f"algorithm.num_train_samples={gbs * steps}",
        f"algorithm.max_steps={steps}",
        "algorithm.val_samples=8",
        *bench.train_overrides,
        *bench.backend_overrides.get(data_plane, []),
    ]


_STEP_COLS = {"step_time_s": "wall time between consecutive logged steps (validation step excluded)", **STORE_COLUMNS}
RL_COLUMNS: dict[str, str] = {
    "driver_bulk_received_bytes": "per step: per-token (dim >= 2) tensor bytes Ray returned "
    "to the driver + bytes the driver read from the store (observability counters)",
    "driver_tensor_received_bytes": "as above plus 1-D per-row tensors (driver_carry)",
    "ray_received_pickled_bytes": "per step: pickled size of everything Ray returned "
    "to the driver (metas, carries, metrics included)",
    "ray_sent_bulk_bytes": "per step: per-token tensor bytes the driver shipped to workers",
    **_STEP_COLS,
}
SFT_COLUMNS: dict[str, str] = {
    "driver_held_bytes": "per step: tensor bytes the driver shipped to the workers + pickled "
    "size of everything returned to it (legacy: the collated batch shards; data plane: metas "
    "out, envelopes and metrics back)",
    **_STEP_COLS,
}


def _rl_bench(name: str, algorithm: str, schema: type) -> StepBench:
    return StepBench(
        name=name,
        schema=schema,
        size_key="samples_per_step",
        sizes=lambda b: list(b.samples_per_step),
        train_overrides=partial(_rl_overrides, algorithm),
        step_row=rl_step_row,
        summarize=lambda b, results: {"comparisons": rl_comparisons(results, b.samples_per_step, b.target_bulk_ratio)},
        columns=RL_COLUMNS,
        print_summary=lambda b, s: print_rl_comparisons(name, s["comparisons"], b.target_bulk_ratio),
    )


GRPO_STEP = _rl_bench("grpo_step", "grpo", GrpoStepBenchConfig)
PPO_STEP = _rl_bench("ppo_step", "ppo", PpoStepBenchConfig)
SFT_STEP = StepBench(
    name="sft_step",
    schema=SftStepBenchConfig,
    size_key="global_batch_size",
    sizes=lambda b: list(b.global_batch_sizes),
    train_overrides=_sft_overrides,
    step_row=sft_step_row,
    summarize=lambda b, results: {"table": sft_table(results, b.global_batch_sizes)},
    columns=SFT_COLUMNS,
    print_summary=lambda b, s: print_sft_table(s["table"]),
    run_prefix="sft_",
)

#: ``bench.name`` -> its step benchmark (legacy vs data-plane trainers at each batch size).
STEP_BENCHES: dict[str, StepBench] = {spec.name: spec for spec in (GRPO_STEP, PPO_STEP, SFT_STEP)}
