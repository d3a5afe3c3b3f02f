"""The one training entry point: ``python launchers/launch.py [recipe=...] [overrides...]``.

Thin on purpose: compose -> validate -> preflight -> ``run_phases``, so that a bad
configuration fails before any process starts.

1. Hydra composes ``conf/config.yaml`` (recipes from ``recipes/`` are registered as the
   ``recipe`` group, so ``recipe=grpo_arith`` works from any working directory); struct mode
   rejects unknown keys and wrong types naming the key.
2. ``validate_config`` runs every range rule and checks the (algorithm, data_plane) pair through
   the factory's lookup; ``preflight`` checks the CPU budget and output paths.
3. ``nemo_dp.training.run_phases`` plans the phases (an RL run with
   ``algorithm.warm_start.enabled`` first runs an SFT warm start on the same policy), selects
   every trainer and the policy through the factory, starts Ray for this job only and writes
   the run directory.

Failures are clean (``nemo_dp.training.console.hydra_task``): a configuration or preflight
error prints one message (the traceback only with ``HYDRA_FULL_ERROR=1``) and leaves no run
directory behind; a failure after Ray started writes ``summary.json`` with the error and the
plot of what ran; SIGTERM stops like Ctrl-C; ``launch.log`` holds the run's output without
colour codes.

The Hydra task function returns the final held-out accuracy, so a Hydra sweeper can maximise
it.
"""

from __future__ import annotations

import sys
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[1]
if str(_REPO_ROOT) not in sys.path:  # running from a checkout without an installed package
    sys.path.insert(0, str(_REPO_ROOT))

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from nemo_dp.config import preflight, register_configs, validate_config  # noqa: E402
from nemo_dp.training.console import RunRecord, hydra_task, recipe_hint_on_failure  # noqa: E402

CONF_DIR = _REPO_ROOT / "conf"
RECIPES_DIR = _REPO_ROOT / "recipes"

register_configs(RECIPES_DIR)


def run(cfg: DictConfig, run_dir: Path, record: RunRecord | None = None) -> float:
    """Validate, preflight and run every phase of ``cfg`` into ``run_dir``.

    Args:
        cfg: The composed root config.
        run_dir: The job's output directory.
        record: The failure handling's record (marked started just before Ray starts).

    Returns:
        The held-out accuracy after the last phase (the run summary is in
        ``run_dir/summary.json``).
    """
    from nemo_dp.training import final_accuracy, run_phases

    validated = validate_config(cfg)
    preflight(validated, run_dir)
    return final_accuracy(run_phases(cfg, validated, run_dir, record=record))


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
@hydra_task
def main(cfg: DictConfig, record: RunRecord) -> float:
    """Hydra entry point (one call per job, also under ``--multirun``).

    Args:
        cfg: The composed root config.
        record: The job's run record (run directory, log file, summary so far).

    Returns:
        The final held-out accuracy (what a sweeper maximises).
    """
    return run(cfg, record.run_dir, record)


def _default_recipe() -> str:
    """The root config's default ``recipe`` choice (for the composition hint)."""
    for entry in OmegaConf.load(CONF_DIR / "config.yaml").defaults:
        if hasattr(entry, "items") and "recipe" in entry:
            return str(entry["recipe"])
    return ""


if __name__ == "__main__":
    with recipe_hint_on_failure(sys.argv[1:], recipes_dir=RECIPES_DIR, default_recipe=_default_recipe()):
        main()
