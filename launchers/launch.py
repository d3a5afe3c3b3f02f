"""The one training entry point: ``python launchers/launch.py [recipe=...] [overrides...]``.

Compose -> validate -> preflight -> ``run_phases``: a bad configuration fails with one message
before any process starts; the final held-out accuracy is returned for a Hydra sweeper.
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
from nemo_dp.training.hydra_task import hydra_task  # noqa: E402
from nemo_dp.training.recipe_hints import recipe_hint_on_failure  # noqa: E402
from nemo_dp.training.run_record import RunRecord  # noqa: E402

CONF_DIR = _REPO_ROOT / "conf"
RECIPES_DIR = _REPO_ROOT / "recipes"

register_configs(RECIPES_DIR)


def run(cfg: DictConfig, run_dir: Path, record: RunRecord | None = None) -> float:
    """Validate, preflight and run every phase of ``cfg`` into ``run_dir``; the final held-out accuracy."""
    from nemo_dp.training import final_accuracy, run_phases

    validated = validate_config(cfg)
    preflight(validated, run_dir)
    return final_accuracy(run_phases(cfg, validated, run_dir, record=record))


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
@hydra_task
def main(cfg: DictConfig, record: RunRecord) -> float:
    """Hydra entry point (one call per job, also under ``--multirun``); returns the final held-out accuracy."""
    return run(cfg, record.run_dir, record)


def _default_recipe() -> str:
    for entry in OmegaConf.load(CONF_DIR / "config.yaml").defaults:
        if hasattr(entry, "items") and "recipe" in entry:
            return str(entry["recipe"])
    return ""


def _refuse_unwritable_output_dir(argv: list[str]) -> None:
    """Exit with one message (Hydra's own style) when the output directory cannot be written."""
    from nemo_dp.training.hydra_task import RunConfigurationError, full_error_requested
    from nemo_dp.training.output_dir import output_dir_problem

    if any(a in ("--help", "-h", "--hydra-help", "--info", "--cfg", "-c", "--shell-completion") for a in argv):
        return
    problem = output_dir_problem(argv, CONF_DIR)
    if problem is None:
        return
    if full_error_requested():
        raise RunConfigurationError(problem)
    print(f"{problem}\n\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.", file=sys.stderr)
    raise SystemExit(1)


if __name__ == "__main__":
    _refuse_unwritable_output_dir(sys.argv[1:])
    with recipe_hint_on_failure(sys.argv[1:], recipes_dir=RECIPES_DIR, default_recipe=_default_recipe()):
        main()
