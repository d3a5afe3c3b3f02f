"""Hydra's Optuna sweeper over ``launchers/launch.py`` (``hydra/sweeper=grpo_lr_kl``).

Two short GRPO trials over TransferQueue: each trial is its own Hydra job with its own Ray + TQ
lifetime (the second trial's bootstrap would fail with "already exists" if the first left its
controller behind), the launcher's task function returns the final held-out accuracy, and Optuna
records the best of the returned values in ``optimization_results.yaml``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.e2e.conftest import TINY_GRPO, LaunchFn

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def test_optuna_sweep_maximises_held_out_accuracy(launch: LaunchFn, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = launch(
        ["--multirun", "hydra/sweeper=grpo_lr_kl", "hydra.sweeper.n_trials=2", *TINY_GRPO, "data_plane=tq",
         "algorithm.max_steps=1", "logger.plot=false", "checkpointing.enabled=false", f"hydra.sweep.dir={sweep}"],
        timeout=560,
    )  # fmt: skip
    assert proc.returncode == 0, f"sweep failed:\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-4000:]}"
    assert proc.stdout.count("Running synchronous GRPO training (data plane: transfer_queue)") == 2

    trials = []
    for job in ("0", "1"):
        resolved = OmegaConf.load(sweep / job / "resolved_config.yaml")
        summary = json.loads((sweep / job / "summary.json").read_text())
        trials.append(
            (
                float(resolved.policy.optimizer.lr),
                float(resolved.algorithm.loss.reference_policy_kl_penalty),
                float(summary["phases"]["grpo"]["val_accuracy"]),
            )
        )
    assert trials[0][:2] != trials[1][:2]  # Optuna suggested two different points
    for lr, kl, _ in trials:
        assert 1e-5 <= lr <= 3e-3 and 0.0 <= kl <= 0.1

    results = OmegaConf.to_container(OmegaConf.load(sweep / "optimization_results.yaml"))
    assert results["name"] == "optuna"
    best = max(trials, key=lambda t: t[2])
    assert results["best_value"] == best[2]  # direction: maximize over the returned accuracies
    best_params = results["best_params"]
    assert set(best_params) == {"policy.optimizer.lr", "algorithm.loss.reference_policy_kl_penalty"}
    assert (best_params["policy.optimizer.lr"], best_params["algorithm.loss.reference_policy_kl_penalty"]) in [
        t[:2] for t in trials if t[2] == best[2]
    ]
