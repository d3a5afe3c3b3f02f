"""Benchmarks of nemo_dp, run by ``launchers/bench.py`` (Hydra: ``bench=<name>``, configs in ``conf_bench/``).

``data_plane``: put/get throughput of every backend; ``grpo_step`` / ``ppo_step`` / ``sft_step``:
legacy vs data-plane trainers (step time, driver bytes, peak RSS); ``peer_trl``: nemo_dp's GRPO
against TRL's (needs the ``bench`` extra).  Numbers are reported, never asserted.  The step benches
reach ``conf/``'s groups through the search-path plugin :class:`TrainingConfSearchPath`.
"""

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


def _local_dir(search_path_entry: str) -> Path | None:
    """The directory of a ``file://`` (or scheme-less) search path entry, else ``None``."""
    text = search_path_entry.removeprefix("file://")
    if "://" in text:
        return None
    return Path(text).resolve()


class TrainingConfSearchPath(SearchPathPlugin):
    """Appends the training configs (``conf/``) to a search path that holds ``conf_bench/``.

    Registered in-process by :func:`register_bench_configs`; a search path without
    ``conf_bench/`` (the training launcher's, a test's ``initialize_config_dir``) is left as
    it is, so registering it never changes what another Hydra app composes.  A plugin, not
    ``hydra.searchpath`` in ``benchmark.yaml``: the step benches compose the training ``config``
    inside the running app (``hydra.compose``), which a primary config's search path misses.
    """

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        """Append ``conf/`` after the bench's own directory in the search path Hydra is building."""
        dirs = [_local_dir(element.path) for element in search_path.get_path() if element.path]
        bench, conf = BENCH_CONF_DIR.resolve(), CONF_DIR.resolve()
        if bench in dirs and conf not in dirs:
            search_path.append(provider=_SEARCH_PATH_PROVIDER, path=f"file://{conf}")


def register_bench_configs() -> None:
    """Prepare Hydra for the bench app (idempotent; call before composing ``benchmark``).

    Stores the bench schemas (``bench_<name>_schema``) and the data-plane schemas in the
    ConfigStore and registers :class:`TrainingConfSearchPath`, so that a search path with
    ``conf_bench/`` also finds ``conf/``.
    """
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    from nemo_dp.bench.common import DataPlaneBenchConfig
    from nemo_dp.bench.peer_trl import PeerTrlBenchConfig
    from nemo_dp.bench.steps import GrpoStepBenchConfig, PpoStepBenchConfig, SftStepBenchConfig
    from nemo_dp.config.policy import register_policy_configs
    from nemo_dp.data_plane.interfaces import register_data_plane_configs

    register_data_plane_configs()
    register_policy_configs()  # conf/policy/<kind>.yaml extends /policy_<kind>_schema
    store = ConfigStore.instance()
    # Outside the ``bench`` group (``conf_bench/bench/<name>.yaml`` extends
    # ``/bench_<name>_schema@_here_``), so that ``--help`` lists only runnable options.
    store.store(name="bench_data_plane_schema", node=DataPlaneBenchConfig)
    store.store(name="bench_grpo_step_schema", node=GrpoStepBenchConfig)
    store.store(name="bench_peer_trl_schema", node=PeerTrlBenchConfig)
    store.store(name="bench_ppo_step_schema", node=PpoStepBenchConfig)
    store.store(name="bench_sft_step_schema", node=SftStepBenchConfig)
    Plugins.instance().register(TrainingConfSearchPath)


def run_bench(
    cfg: DictConfig, output_dir: Path, *, raw_backends: Mapping[str, Callable[[], Any]] | None = None
) -> dict[str, Any]:
    """Run the benchmark ``bench.name`` names; return the report that was written.

    Args:
        raw_backends: Extra data-plane backends defined outside the package (``tq_raw``).

    Raises:
        ValueError: Unknown bench name (lists the known ones).
    """
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
