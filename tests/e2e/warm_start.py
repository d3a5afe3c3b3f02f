"""The e2e tier's parity process: the shared SFT warm start, then the parity runs that start from it.

Run as a script: ``python warm_start.py OUT_DIR [GROUP ...]``, groups from ``PARITY_GROUPS``
(``conftest.py`` passes the groups of the parity tests the session collected).  One process,
because a Python, Ray, worker groups and TransferQueue system per parity file would cost more on
a 2-core machine than the runs themselves: one Ray (started with the TransferQueue knobs
exported, as for any ``data_plane=tq`` run) serves everything:

1. the warm start: ``WARM_START_OVERRIDES`` composed, its warm-start phase run through
   ``nemo_dp.training.run_phase`` on a plain policy, the final training checkpoint saved under
   ``OUT_DIR/checkpoints/warm_start`` (``OUT_DIR/warm_start.json`` names it);
2. its ``policy`` state loaded back from that checkpoint, as any consumer would;
3. the GRPO runs (``grpo``: ``test_grpo_parity.RUNS``; ``async``: ``test_grpo_async_parity.RUNS``)
   through ``test_grpo_parity.run_grpo`` into ``OUT_DIR/grpo.json``, and the PPO runs (``ppo``)
   through ``test_ppo_parity.run_ppo`` into ``OUT_DIR/ppo.json``.

A failing job writes its traceback to ``OUT_DIR/<job>.error`` instead, and the next job still
runs, so one job's failure fails only the tests that read it.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]

#: The parity groups this script knows, in run order.
PARITY_GROUPS: tuple[str, ...] = ("grpo", "async", "ppo")


def run_warm_start(out_dir: Path, env: dict[str, str]) -> Path:
    """Run the shared warm start into ``out_dir`` on the caller's Ray.

    Args:
        out_dir: Output directory (metrics under ``warm/``, checkpoint under ``checkpoints/``).
        env: The worker environment ``init_ray`` returned.

    Returns:
        The committed checkpoint directory of the warm start's last step.

    Raises:
        RuntimeError: No committed checkpoint was written.
    """
    from nemo_dp.config import validate_config
    from nemo_dp.training import Checkpointer, make_policy, make_tokenizer, phase_logger, run_phase, warm_start_phase
    from nemo_dp.training.checkpoint_discovery import latest_checkpoint
    from tests.e2e.conftest import WARM_START_OVERRIDES
    from tests.e2e.phase_runs import compose_run

    cfg = compose_run(WARM_START_OVERRIDES)
    validated = validate_config(cfg)
    phase = warm_start_phase(cfg)
    tok = make_tokenizer(cfg)
    root = out_dir / "checkpoints" / "warm_start"
    policy = make_policy(cfg, tok, env_vars=env)  # built from the run's config, as the launcher does
    try:
        run_phase(
            phase,
            policy,
            tokenizer=tok,
            logger=phase_logger(phase, out_dir / "warm", validated.logger),
            checkpointer=Checkpointer(root, enabled=True, save_period=0, keep_last=1),
        )
    finally:
        policy.shutdown()
    latest = latest_checkpoint(root)
    if latest is None:
        raise RuntimeError(f"the warm start wrote no committed checkpoint under {root}")
    return latest


def _job(out_dir: Path, name: str, fn: Callable[[], dict[str, Any]]) -> None:
    """Run one job; write its result to ``<name>.json`` or its traceback to ``<name>.error``."""
    try:
        result = fn()
    except Exception:
        (out_dir / f"{name}.error").write_text(traceback.format_exc())
        traceback.print_exc()
        return
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1))


def main(out_dir: Path, groups: Sequence[str]) -> None:
    """Run the warm start, then every job the ``groups`` need, in one Ray.

    Args:
        out_dir: Output directory of everything (see the module docstring).
        groups: Parity groups to run (a subset of ``PARITY_GROUPS``).

    Raises:
        ValueError: An unknown group (before Ray starts).
    """
    unknown = sorted(set(groups) - set(PARITY_GROUPS))
    if unknown:
        raise ValueError(f"unknown parity group(s) {unknown}; known: {list(PARITY_GROUPS)}")
    from nemo_dp.utils.checkpoint import load_training_checkpoint
    from tests.e2e.phase_runs import compose_run
    from tests.e2e.ray_cluster import script_ray

    with script_ray(compose_run(["~recipe", "data_plane=tq"]).data_plane) as env:
        ckpt = run_warm_start(out_dir, env)
        (out_dir / "warm_start.json").write_text(json.dumps({"checkpoint": str(ckpt)}))
        state = load_training_checkpoint(ckpt)["policy"]
        if "grpo" in groups or "async" in groups:
            from tests.e2e import test_grpo_async_parity, test_grpo_parity

            runs = {
                **(test_grpo_parity.RUNS if "grpo" in groups else {}),
                **(test_grpo_async_parity.RUNS if "async" in groups else {}),
            }
            _job(out_dir, "grpo", lambda: test_grpo_parity.run_grpo(out_dir / "grpo", state, env, runs))
        if "ppo" in groups:
            from tests.e2e import test_ppo_parity

            _job(out_dir, "ppo", lambda: test_ppo_parity.run_ppo(out_dir / "ppo", state, env))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    main(target, sys.argv[2:])
