"""PARITY: ``data_plane=disabled``, ``local``, ``tq`` and ``ray`` SFT compute the same run.

Same seed and config, ``dp_size=2``, 6 steps: the legacy trainer (``sft_train`` on a plain
``Policy``: the driver collates each global batch and ``policy.train`` shards it) and the
data-plane trainer (``sft_train_sync`` on a ``TQPolicy``: colocated loaders put each rank's
block into the Local store / TransferQueue / the Ray object store, the driver ships only metas)
must write identical per-step ``loss``, ``grad_norm``, ``lr`` and ``num_valid_tokens`` to
``metrics.jsonl``, and the same final held-out accuracy.  The data-plane step is one fused
driver -> worker call once the previous step readied its batch: two calls (load + step) only
for the first step and the one after the step-3 checkpoint (``driver/worker_calls``).

The comparison is **exact** (``==`` on the floats), with no tolerance: every rank receives the
same rows (the legacy planner's contiguous block r of each global batch), materialises them
(padding width does not matter: the worker trims each micro-batch to its longest row), runs the
same fixed-size micro-batches, normalises by the same all-reduced global counts and
all-reduces gradients in the same order.  Any difference is a bug.

Each run is the real launcher (``launchers/launch.py``) in a subprocess, from a temporary
working directory, so trainer and policy come from ``select_sync_trainer`` /
``make_policy_factory`` exactly as in production.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import run_launch


#: Tiny SFT settings shared by every run (only the data plane varies).
SFT_OVERRIDES: tuple[str, ...] = (
    "~recipe",
    "algorithm=sft",
    "seed=5",
    "env.digits=1",
    "policy.dp_size=2",
    "policy.model.n_layers=1",
    "policy.model.d_model=32",
    "policy.model.n_heads=2",
    "policy.model.max_seq_len=16",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=2",
    "policy.optimizer.warmup_steps=0",
    "algorithm.max_steps=6",
    "algorithm.num_train_samples=64",
    "algorithm.val_samples=8",
    "algorithm.val_period=0",
    "logger.plot=false",
    "logger.progress_bar=false",
)

COMPARED: tuple[str, ...] = ("loss", "grad_norm", "lr", "num_valid_tokens", "consumed_samples")


def run_launcher(overrides: list[str], cwd: Path, *, timeout: float = 240.0) -> subprocess.CompletedProcess:
    """Run the launcher with ``overrides`` in ``cwd``; fail the test with its output on error."""
    proc = run_launch(overrides, cwd, timeout=timeout, full_error=True)
    if proc.returncode != 0:
        pytest.fail(f"launcher failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def read_metrics(run_dir: Path) -> dict[int, dict[str, Any]]:
    """``metrics.jsonl`` of a run as ``{step: record}``."""
    from nemo_dp.utils.metrics import read_metrics as read_records

    return {int(r["step"]): r for r in read_records(run_dir / "metrics.jsonl")}


#: Checkpoint every 3 steps (the straight runs double as the reference of the resume tests).
CKPT: tuple[str, ...] = ("checkpointing.enabled=true", "checkpointing.save_period=3", "checkpointing.keep_last=3")

# One straight 6-step run per data plane per pytest session, shared with test_sft_resume.py
# (launcher runs dominate the test time on a 2-core machine).
_STRAIGHT_RUNS: dict[str, tuple[Path, str]] = {}


def straight_run(choice: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The run directory and stdout of the straight 6-step run on data plane ``choice``."""
    if choice not in _STRAIGHT_RUNS:
        base = tmp_path_factory.mktemp(f"sft_straight_{choice}")
        run_dir = base / "run"
        proc = run_launcher([*SFT_OVERRIDES, f"data_plane={choice}", *CKPT, f"hydra.run.dir={run_dir}"], base)
        _STRAIGHT_RUNS[choice] = (run_dir, proc.stdout)
    return _STRAIGHT_RUNS[choice]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_disabled_local_tq_and_ray_sft_agree_exactly(tmp_path_factory: pytest.TempPathFactory) -> None:
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for choice in ("disabled", "local", "tq", "ray"):
        run_dir, stdout = straight_run(choice, tmp_path_factory)
        expected_trainer = "sft:sft_train " if choice == "disabled" else "sft_sync:sft_train_sync "
        assert f"trainer nemo_dp.algorithms.{expected_trainer}" in stdout
        runs[choice] = read_metrics(run_dir)

    legacy = runs["disabled"]
    steps = sorted(s for s in legacy if s >= 1)
    assert steps == list(range(1, 7))
    for choice in ("local", "tq", "ray"):
        other = runs[choice]
        assert sorted(s for s in other if s >= 1) == steps
        for step in steps:
            for key in COMPARED:
                assert other[step][key] == legacy[step][key], (choice, step, key, other[step][key], legacy[step][key])
        assert other[6]["val_accuracy"] == legacy[6]["val_accuracy"]
        # The data-plane driver held only metadata: a few hundred bytes of envelopes per step.
        assert all(other[s]["driver/held_bytes"] < 4096 for s in steps)
        # One driver -> worker round trip per step, except where no earlier step readied the
        # batch: the first step and the one after the step-3 checkpoint's quiesce.
        assert [other[s]["driver/worker_calls"] for s in steps] == [2, 1, 1, 2, 1, 1], choice
    # The loss really moved (the comparison is not between constant curves).
    assert legacy[6]["loss"] < legacy[1]["loss"]
