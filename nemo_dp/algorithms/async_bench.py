"""Side-by-side wall time per trained sample: synchronous vs asynchronous GRPO in one run.

Why this module exists: the asynchronous trainer's value is overlap, which only a measurement
shows (never a timed test).  ``compare_sync_async`` runs ``grpo_train_sync`` and
``grpo_train_async`` (each ``max_staleness`` asked for) on one ``TQPolicy`` from the same starting
weights, times the steps after a warm-up (the final, validating step excluded) and reports the
wall time per trained sample and where it went.  ``launchers/bench.py bench=grpo_step`` can call
it for its async column; ``python -m nemo_dp.algorithms.async_bench`` runs it on its own.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["compare_sync_async", "ASYNC_SPLIT_KEYS", "SYNC_SPLIT_KEYS"]

SYNC_SPLIT_KEYS: tuple[str, ...] = ("time/generation_s", "time/logprobs_s", "time/train_s")
ASYNC_SPLIT_KEYS: tuple[str, ...] = (
    "time/claim_wait_s",
    "time/logprobs_s",
    "time/train_s",
    "time/rollout_gen_s",
    "time/rollout_put_s",
    "async/trainer_idle_frac",
    "async/rollout_idle_frac",
    "async/store_occupancy_rows",
)


class _StepClock:
    """A ``PhaseLogger`` that writes ``metrics.jsonl`` and the wall clock of every logged step.

    The bench stands in for the run layer's logger here (the run layer sits above this one);
    the trainer sees the same protocol.
    """

    def __init__(self, out_dir: Path, label: str) -> None:
        from nemo_dp.utils.metrics import MetricsLogger

        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = MetricsLogger(self.out_dir / "metrics.jsonl")
        self.label = label
        self.marks: list[tuple[int, float, dict]] = []

    def start(self, total_steps: int, start_step: int) -> None:
        self.metrics.truncate_after(start_step)
        self.marks = [(0, time.perf_counter(), {})]

    def info(self, message: str) -> None:
        print(f"[{self.label}] {message}", flush=True)

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        record = self.metrics.log(step, metrics)
        if step > 0:
            self.marks.append((step, time.perf_counter(), dict(record)))
        return record

    def close(self) -> Path | None:
        return None


class _NoCheckpoints:
    """A ``PhaseCheckpointer`` that never saves (the bench measures steps, not checkpoints)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def should_save(self, step: int, *, final: bool) -> bool:
        return False

    def save(self, step: int, state_fn: Callable[[], dict[str, Any]]) -> Path:
        raise RuntimeError("compare_sync_async: the bench writes no checkpoints")

    def prune(self) -> None:
        return None


def _clocked_run(trainer: Any, policy: Any, cfg: Any, tok: Any, run_dir: Path) -> list[tuple[int, float, dict]]:
    """Train ``cfg``'s main phase with ``trainer``; the wall clock at every logged step."""
    from nemo_dp.algorithms.context import TrainContext
    from nemo_dp.config.algorithm_registry import algorithm, resolve_target

    inputs = resolve_target(algorithm(str(cfg.algorithm.name)).input_builder)(cfg, tok)
    clock = _StepClock(run_dir, run_dir.name)
    trainer(TrainContext(policy=policy, cfg=cfg, train_loader=inputs.train_loader, val_problems=inputs.val_problems,
                         tokenizer=tok, env=inputs.env, logger=clock, checkpointer=_NoCheckpoints(run_dir / "ckpt")))
    return clock.marks


def _summary(marks: list[tuple[int, float, dict]], warmup: int, measured: int, keys: Sequence[str],
             rows_per_step: int) -> dict[str, Any]:
    steps = [(s1, t1 - t0, rec) for (_, t0, _), (s1, t1, rec) in zip(marks, marks[1:])
             if warmup < s1 <= warmup + measured]
    if not steps:
        raise ValueError(f"compare_sync_async: no measured steps (warmup={warmup}, measured={measured})")
    step_s = statistics.fmean(d for _, d, _ in steps)
    split = {k: statistics.fmean(float(rec.get(k, 0.0)) for _, _, rec in steps) for k in keys}
    return {"step_time_s": step_s, "s_per_trained_sample": step_s / rows_per_step, "split": split,
            "steps": [s for s, _, _ in steps]}


def compare_sync_async(
    overrides: Sequence[str],
    out_dir: Path,
    *,
    warmup_steps: int = 1,
    measured_steps: int = 4,
    staleness: Sequence[int] = (1,),
    num_cpus: int = 2,
) -> dict[str, Any]:
    """Run the synchronous and asynchronous trainers from the same weights; compare.

    Args:
        overrides: Hydra overrides of ``conf/config.yaml`` shared by every run (``data_plane=tq``
            is forced; ``algorithm.max_steps`` is set to warm-up + measured + 1).
        out_dir: Where each run writes its metrics.
        warmup_steps: Unmeasured steps first.
        measured_steps: Measured steps (the last, validating step is never measured).
        staleness: ``max_staleness`` values of the asynchronous runs.
        num_cpus: Logical CPUs of the local Ray.

    Returns:
        ``{"sync": summary, "async_<M>": summary, "ratio_async_<M>_over_sync": float}``; a summary
        is ``{"step_time_s", "s_per_trained_sample", "split", "steps"}``.
    """
    from hydra import compose, initialize_config_dir

    from nemo_dp.config import CONF_DIR, RECIPES_DIR, register_configs, validate_config
    from nemo_dp.data_plane.factory import select_sync_trainer
    from nemo_dp.data_plane.factory import make_policy_factory
    from nemo_dp.data_plane.registry import ray_start_args
    from nemo_dp.distributed.ray_init import init_ray, shutdown_ray
    from nemo_dp.distributed.worker_group import RayCluster
    from nemo_dp.models.builders import build_tokenizer

    register_configs(RECIPES_DIR)
    total = warmup_steps + measured_steps + 1
    base = ["~recipe", *overrides, "data_plane=tq", f"algorithm.max_steps={total}", "algorithm.val_at_start=false",
            "algorithm.val_period=0", "algorithm.warm_start.enabled=false", "checkpointing.enabled=false",
            "logger.plot=false", "logger.progress_bar=false"]
    runs: dict[str, list[str]] = {"sync": ["algorithm.async_rollout.enabled=false"]}
    for m in staleness:
        runs[f"async_{int(m)}"] = [
            "algorithm.async_rollout.enabled=true",
            f"algorithm.async_rollout.max_staleness={int(m)}",
        ]
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfgs = {name: compose("config", overrides=[*base, *extra]) for name, extra in runs.items()}
    for cfg in cfgs.values():
        validate_config(cfg)
    first = next(iter(cfgs.values()))
    rows = int(first.algorithm.num_prompts_per_step) * int(first.algorithm.num_generations_per_prompt)
    tok = build_tokenizer(first.policy)
    trainers = {name: select_sync_trainer(cfg) for name, cfg in cfgs.items()}
    env = init_ray(num_cpus=num_cpus, **ray_start_args(first.data_plane))
    report: dict[str, Any] = {"rows_per_step": rows, "overrides": list(overrides)}
    try:
        factory = make_policy_factory(first.data_plane)
        if factory is None:
            raise ValueError("compare_sync_async: data_plane=tq selects no data-plane policy factory")
        policy = factory(cluster=RayCluster(env_vars=dict(env)), config=first.policy, vocab_size=tok.vocab_size,
                         pad_id=tok.pad_id, eos_id=tok.eos_id, seed=int(first.seed))
        try:
            start = policy.state_dict()
            for name, cfg in cfgs.items():
                policy.load_state_dict(start)
                marks = _clocked_run(trainers[name], policy, cfg, tok, Path(out_dir) / name)
                keys = SYNC_SPLIT_KEYS if name == "sync" else ASYNC_SPLIT_KEYS
                report[name] = _summary(marks, warmup_steps, measured_steps, keys, rows)
        finally:
            policy.shutdown()
    finally:
        shutdown_ray()
    for name in runs:
        if name != "sync":
            report[f"ratio_{name}_over_sync"] = (
                report[name]["s_per_trained_sample"] / report["sync"]["s_per_trained_sample"]
            )
    return report


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    result = compare_sync_async(sys.argv[2:], out)
    (out / "async_bench.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
