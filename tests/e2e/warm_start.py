"""The e2e tier's shared SFT warm start, run as a script: ``python warm_start.py OUT_DIR``.

Composes ``WARM_START_OVERRIDES`` (see ``conftest.py``), runs the config's warm-start phase
through ``nemo_dp.training.run_phase`` on a plain policy with its own Ray, and saves the final
training checkpoint under ``OUT_DIR/checkpoints/warm_start``.  Consumers load its ``policy``
state into their policies.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def main(out_dir: Path) -> None:
    """Run the warm start into ``out_dir``.

    Args:
        out_dir: Output directory (metrics under ``warm/``, checkpoint under ``checkpoints/``).
    """
    from hydra import compose, initialize_config_dir

    from nemo_dp.config import register_configs, validate_config
    from nemo_dp.data_plane.registry import ray_start_args
    from nemo_dp.distributed.ray_init import init_ray, shutdown_ray
    from nemo_dp.training import Checkpointer, make_policy, make_tokenizer, phase_logger, run_phase, warm_start_phase
    from tests.e2e.conftest import WARM_START_OVERRIDES

    register_configs(REPO_ROOT / "recipes")
    with initialize_config_dir(str(REPO_ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=list(WARM_START_OVERRIDES))
    validated = validate_config(cfg)
    phase = warm_start_phase(cfg)
    tok = make_tokenizer(cfg)
    env = init_ray(num_cpus=2, **ray_start_args(cfg.data_plane))
    try:
        policy = make_policy(cfg, tok, env_vars=env)  # built from the run's config, as the launcher does
        try:
            run_phase(
                phase,
                policy,
                tokenizer=tok,
                logger=phase_logger(phase, out_dir / "warm", validated.logger),
                checkpointer=Checkpointer(
                    out_dir / "checkpoints" / "warm_start", enabled=True, save_period=0, keep_last=1
                ),
            )
        finally:
            policy.shutdown()
    finally:
        shutdown_ray()


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    main(target)
