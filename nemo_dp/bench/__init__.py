"""Benchmarks of nemo_dp, run by ``launchers/bench.py`` (``bench=<name>``, configs in ``conf_bench/``).

Numbers are reported, never asserted; ``peer_trl`` needs the ``bench`` extra."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import DictConfig

from nemo_dp.config import CONF_DIR, REPO_ROOT
from nemo_dp.utils.config_checks import fail

__all__ = [
    "BENCH_CONF_DIR",
    "BENCH_NAMES",
    "TrainingConfSearchPath",
    "bench_fail",
    "register_bench_configs",
    "run_bench",
]

#: The bench's config directory: root ``benchmark.yaml`` and group ``bench``.
BENCH_CONF_DIR: Path = REPO_ROOT / "conf_bench"
#: ``bench.name`` values, each with ``conf_bench/bench/<name>.yaml`` and a schema below.
BENCH_NAMES: tuple[str, ...] = ("data_plane", "grpo_step", "peer_trl", "ppo_step", "sft_step")

_SEARCH_PATH_PROVIDER = "nemo_dp-bench"


def bench_fail(key: str, message: str) -> NoReturn:
    """Raise ``ValueError("bench.<key>: <message>")``."""
    fail(f"bench.{key}", message)


class TrainingConfSearchPath(SearchPathPlugin):
    """Appends the training configs (``conf/``) to a search path that holds ``conf_bench/`` (any other is left as is).

    A plugin, not ``hydra.searchpath`` in ``benchmark.yaml``: the step benches compose the training
    ``config`` inside the running app (``hydra.compose``), which a primary config's search path misses.
    """

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        entries = [element.path.removeprefix("file://") for element in search_path.get_path() if element.path]
        dirs = [Path(entry).resolve() for entry in entries if "://" not in entry]  # local directories only
        bench, conf = BENCH_CONF_DIR.resolve(), CONF_DIR.resolve()
        if bench in dirs and conf not in dirs:
            search_path.append(provider=_SEARCH_PATH_PROVIDER, path=f"file://{conf}")


def register_bench_configs() -> None:
    """Store the bench, policy and data-plane schemas and register :class:`TrainingConfSearchPath` (idempotent)."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    from nemo_dp.bench.common import DataPlaneBenchConfig
    from nemo_dp.bench.peer_trl import PeerTrlBenchConfig
    from nemo_dp.bench.steps import GrpoStepBenchConfig, PpoStepBenchConfig, SftStepBenchConfig
    from nemo_dp.config.policy import register_policy_configs
    from nemo_dp.data_plane.interfaces import register_data_plane_configs

    register_data_plane_configs()
    register_policy_configs()  # conf/policy/<kind>.yaml extends /policy_<kind>_schema
    # Outside the ``bench`` group (``conf_bench/bench/<name>.yaml`` extends
    # ``/bench_<name>_schema@_here_``), so that ``--help`` lists only runnable options.
    schemas = (DataPlaneBenchConfig, GrpoStepBenchConfig, PeerTrlBenchConfig, PpoStepBenchConfig, SftStepBenchConfig)
    for name, schema in zip(BENCH_NAMES, schemas):
        ConfigStore.instance().store(name=f"bench_{name}_schema", node=schema)
    Plugins.instance().register(TrainingConfSearchPath)


def run_bench(
    cfg: DictConfig, output_dir: Path, *, raw_backends: Mapping[str, Callable[[], Any]] | None = None
) -> dict[str, Any]:
    """Run the benchmark ``bench.name`` names (ValueError listing the known ones if none); return its report."""
    name = str(cfg.bench.name)
    if name == "data_plane":
        from nemo_dp.bench.data_plane import run_data_plane_bench

        return run_data_plane_bench(cfg, output_dir, raw_backends=raw_backends)
    if name == "peer_trl":
        from nemo_dp.bench.peer_trl import run_peer_trl_bench

        return run_peer_trl_bench(cfg, output_dir)
    from nemo_dp.bench import steps

    spec = steps.STEP_BENCHES.get(name)
    if spec is None:
        raise ValueError(f"unknown bench.name {name!r}; known benches: {sorted(BENCH_NAMES)}")
    return steps.run_step_bench(cfg, output_dir, spec)
