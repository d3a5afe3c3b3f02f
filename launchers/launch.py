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
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from nemo_dp.config import preflight, register_configs, validate_config  # noqa: E402

CONF_DIR = _REPO_ROOT / "conf"
RECIPES_DIR = _REPO_ROOT / "recipes"

register_configs(RECIPES_DIR)


def run(cfg: DictConfig, run_dir: Path) -> float:
    """Validate, preflight and run every phase of ``cfg`` into ``run_dir``.

    Args:
        cfg: The composed root config.
        run_dir: The job's output directory.

    Returns:
        The held-out accuracy after the last phase (the run summary is in
        ``run_dir/summary.json``).
    """
    from nemo_dp.training import final_accuracy, run_phases

    validated = validate_config(cfg)
    preflight(validated, run_dir)
    return final_accuracy(run_phases(cfg, validated, run_dir))


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def main(cfg: DictConfig) -> float:
    """Hydra entry point (one call per job, also under ``--multirun``).

    Returns:
        The final held-out accuracy (what a sweeper maximises).
    """
    return run(cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
