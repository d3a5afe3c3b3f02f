"""Helpers for launcher end-to-end tests: run ``launchers/launch.py`` in a subprocess on tiny
settings (from a temporary working directory, to prove recipes resolve from anywhere)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = REPO_ROOT / "launchers" / "launch.py"

#: Overrides that make any recipe tiny: a 1-layer model, small batches, few held-out problems.
TINY: tuple[str, ...] = (
    "policy.model.n_layers=1",
    "policy.model.d_model=32",
    "policy.model.n_heads=2",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=4",
    "policy.logprob_batch_size=16",
    "algorithm.val_samples=16",
)

LaunchFn = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def launch(tmp_path: Path) -> LaunchFn:
    """Run the launcher with the given overrides in ``tmp_path``; returns the completed process."""

    def _run(overrides: Sequence[str], *, timeout: float = 240.0) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        env["HYDRA_FULL_ERROR"] = "0"
        return subprocess.run(
            [sys.executable, str(LAUNCHER), *overrides],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return _run
