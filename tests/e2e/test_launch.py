"""End-to-end runs of ``launchers/launch.py`` in a subprocess on tiny settings.

Covers: a few SFT steps and a GRPO run with its SFT warm start (outputs, log lines, factory
selection), a bad override failing before Ray starts, a two-job ``--multirun`` sweep over the local
data plane (each job isolated in its own directory, Ray and store; two TransferQueue jobs in one
sweep, each bootstrapping and closing its own controller, are ``test_sweep.py``'s Optuna trials),
and exact resume (N steps straight equal K steps plus a resumed run, metric for metric).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nemo_dp.utils.metrics import read_metrics
from tests.e2e.conftest import GRPO_WARM_START, TINY, LaunchFn

pytestmark = pytest.mark.timeout(420)

def _ok(proc: object) -> None:
    assert proc.returncode == 0, f"launcher failed:\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-4000:]}"  # type: ignore[attr-defined]


def _training_metrics(path: Path) -> dict[int, dict[str, object]]:
    """Records by step without wall-clock timings (which legitimately differ between runs)."""
    out = {}
    for rec in read_metrics(path):
        out[int(rec["step"])] = {k: v for k, v in rec.items() if not k.startswith("time/")}
    return out


def test_sft_few_steps(launch: LaunchFn, tmp_path: Path) -> None:
    run = tmp_path / "sft_run"
    proc = launch(
        ["recipe=sft_arith", *TINY, "data_plane=disabled", "algorithm.max_steps=4", "algorithm.val_period=2",
         "algorithm.num_train_samples=64", f"hydra.run.dir={run}"]
    )  # fmt: skip
    _ok(proc)
    assert "Running synchronous SFT training (legacy)" in proc.stdout
    assert "trainer nemo_dp.algorithms.sft:sft_train" in proc.stdout
    assert "Held-out exact-match accuracy after SFT:" in proc.stdout
    assert "step/s" in proc.stderr  # the tqdm progress bar
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all("loss" in r for r in records)
    assert "val_accuracy" in records[1] and "val_accuracy" in records[3]
    assert (run / "resolved_config.yaml").read_text().startswith("algorithm:")
    assert (run / "training_curves.png").stat().st_size > 1000
    assert (run / "checkpoints" / "sft" / "step_00000004" / "manifest.json").is_file()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["phases"]["sft"]["step"] == 4


def test_bad_override_fails_before_ray_starts(launch: LaunchFn, tmp_path: Path) -> None:
    # The run layer prints "run directory:" first, before Ray starts: a config error is raised
    # before that line, and nothing is written into the run directory.
    proc = launch(["policy.dp_size=0", f"hydra.run.dir={tmp_path / 'bad'}"], timeout=120)
    assert proc.returncode != 0
    assert "policy.dp_size" in proc.stderr and "must be >= 1" in proc.stderr
    assert "run directory:" not in proc.stdout and "Running synchronous" not in proc.stdout
    assert not (tmp_path / "bad" / "resolved_config.yaml").exists()
    proc = launch(["policy.no_such_key=3", f"hydra.run.dir={tmp_path / 'bad2'}"], timeout=120)
    assert proc.returncode != 0 and "policy.no_such_key" in proc.stderr
    assert "run directory:" not in proc.stdout
    proc = launch(["data_plane=local", f"hydra.run.dir={tmp_path / 'bad3'}"], timeout=120)
    assert proc.returncode != 0 and "data_plane" in proc.stderr and "grpo" in proc.stderr
    assert "run directory:" not in proc.stdout


def test_grpo_with_warm_start_and_exact_resume(
    launch: LaunchFn, tmp_path: Path, grpo_warm_start_run: tuple[Path, subprocess.CompletedProcess]
) -> None:
    straight, proc = grpo_warm_start_run  # the session's straight 4-step run (shared with test_evaluate)
    out = proc.stdout
    assert "Running synchronous SFT warm start training (legacy)" in out
    assert "Running synchronous GRPO training (legacy)" in out
    assert out.index("Running synchronous SFT warm start") < out.index("Running synchronous GRPO")
    assert "Held-out exact-match accuracy after SFT warm start:" in out
    assert "Held-out exact-match accuracy after GRPO:" in out
    assert (straight / "warm_start" / "metrics.jsonl").is_file()
    full = _training_metrics(straight / "metrics.jsonl")
    assert sorted(full) == [0, 1, 2, 3, 4]  # step 0 = held-out accuracy before GRPO
    for step in (1, 2, 3, 4):
        for key in ("loss", "reward_mean", "kl_penalty", "grad_norm"):
            assert key in full[step]

    first = tmp_path / "first_half"
    _ok(launch([*GRPO_WARM_START, "algorithm.max_steps=2", f"hydra.run.dir={first}"]))
    resumed = tmp_path / "resumed"
    proc = launch(
        [
            *GRPO_WARM_START,
            "algorithm.max_steps=4",
            f"checkpointing.resume_from={first / 'checkpoints'}",
            f"hydra.run.dir={resumed}",
        ]
    )
    _ok(proc)
    assert "skipped (resuming a later phase)" in proc.stdout
    assert "resumed from" in proc.stdout
    half = _training_metrics(first / "metrics.jsonl")
    # The resumed run continues the interrupted run's history (copied from its run directory):
    # every step once, the first half exactly as the first run logged it.
    whole = _training_metrics(resumed / "metrics.jsonl")
    assert sorted(half) == [0, 1, 2] and sorted(whole) == [0, 1, 2, 3, 4]
    assert [r["step"] for r in read_metrics(resumed / "metrics.jsonl")] == [0, 1, 2, 3, 4]
    for step in (0, 1, 2):
        assert half[step] == full[step], f"step {step}"
        assert whole[step] == half[step], f"step {step}"
    for step in (3, 4):
        assert whole[step] == full[step], f"step {step}"


def test_multirun_sweep_isolates_jobs(launch: LaunchFn, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    # data_plane=local: each job starts and ends its own Ray and its workers' private stores.
    proc = launch(
        ["--multirun", "recipe=sft_arith", *TINY, "data_plane=local", "algorithm.max_steps=2",
         "algorithm.num_train_samples=64", "logger.plot=false", "seed=1,2", f"hydra.sweep.dir={sweep}"]
    )  # fmt: skip
    _ok(proc)
    assert proc.stdout.count("Running synchronous SFT training (data plane: local)") == 2
    losses = []
    for job in ("0", "1"):
        records = read_metrics(sweep / job / "metrics.jsonl")
        assert [r["step"] for r in records] == [1, 2]
        losses.append(records[0]["loss"])
        assert (sweep / job / "summary.json").is_file()
        assert (sweep / job / "checkpoints" / "sft" / "step_00000002").is_dir()
    assert losses[0] != losses[1]  # different seeds, different initial weights
