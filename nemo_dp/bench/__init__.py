"""Benchmarks of nemo_dp, run by ``launchers/bench.py`` (Hydra: ``bench=<name>``).

* ``data_plane`` - put/get throughput of every data-plane backend against one memory copy and
  Ray's object store (``nemo_dp.bench.data_plane``);
* ``grpo_step`` / ``ppo_step`` / ``sft_step`` - legacy vs data-plane trainers side by side:
  step time, bytes crossing the driver, driver peak RSS (``nemo_dp.bench.steps``, one shared
  runner over the launcher's run layer).

Numbers are ratios from one run on this machine, reported (``nemo_dp.bench.report``), never
asserted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

__all__ = ["BENCH_NAMES", "register_bench_configs", "run_bench"]

#: ``bench.name`` values, each with ``conf/bench/<name>.yaml`` and a schema below.
BENCH_NAMES: tuple[str, ...] = ("data_plane", "grpo_step", "ppo_step", "sft_step")


def register_bench_configs() -> None:
    """Store the bench schemas (group ``bench``) and the data-plane schemas in the ConfigStore."""
    from hydra.core.config_store import ConfigStore

    from nemo_dp.bench.common import DataPlaneBenchConfig
    from nemo_dp.bench.steps import GrpoStepBenchConfig, PpoStepBenchConfig, SftStepBenchConfig
    from nemo_dp.data_plane.interfaces import register_data_plane_configs

    register_data_plane_configs()
    store = ConfigStore.instance()
    store.store(group="bench", name="data_plane_schema", node=DataPlaneBenchConfig)
    store.store(group="bench", name="grpo_step_schema", node=GrpoStepBenchConfig)
    store.store(group="bench", name="ppo_step_schema", node=PpoStepBenchConfig)
    store.store(group="bench", name="sft_step_schema", node=SftStepBenchConfig)


def run_bench(
    cfg: DictConfig, output_dir: Path, *, raw_backends: Mapping[str, Callable[[], Any]] | None = None
) -> dict[str, Any]:
    """Run the benchmark ``bench.name`` names.

    Args:
        cfg: The composed bench root config.
        output_dir: Where the report goes.
        raw_backends: Extra data-plane backends defined outside the package (``tq_raw``).

    Returns:
        The report that was written.

    Raises:
        ValueError: Unknown bench name (lists the known ones).
    """
    name = str(cfg.bench.name)
    if name == "data_plane":
        from nemo_dp.bench.data_plane import run_data_plane_bench

        return run_data_plane_bench(cfg, output_dir, raw_backends=raw_backends)
    from nemo_dp.bench import steps

    runners = {
        "grpo_step": steps.run_grpo_step_bench,
        "ppo_step": steps.run_ppo_step_bench,
        "sft_step": steps.run_sft_step_bench,
    }
    runner = runners.get(name)
    if runner is None:
        raise ValueError(f"unknown bench.name {name!r}; known benches: {sorted(BENCH_NAMES)}")
    return runner(cfg, output_dir)
