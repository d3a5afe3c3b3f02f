"""A refused launch changes nothing on disk, and every check the README places before Ray
refuses the run with one message, no traceback and no run directory.

The refused launches stop before Ray (or at the cluster join) and cost a few seconds each; the
one accepted run they meet is a copy of the session's ``sft_checkpointed_run``.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import SFT_CHECKPOINTED, run_launch

pytestmark = pytest.mark.timeout(420)

SFT = SFT_CHECKPOINTED


def _tree_digest(root: Path) -> dict[str, str]:
    """Every path under ``root`` (directories too) with the SHA-256 of each file's bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def _one_message(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in stderr:\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert "Held-out exact-match accuracy" not in proc.stdout


def test_a_refused_run_changes_no_file_of_the_run_it_meets(sft_checkpointed_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(sft_checkpointed_run, run)
    # The accepted run got Hydra's files, written once it started.
    assert "- algorithm.max_steps=2" in (run / ".hydra" / "overrides.yaml").read_text()
    before = _tree_digest(run)
    proc = run_launch([*SFT, "algorithm.max_steps=34", f"hydra.run.dir={run}"], tmp_path)
    _one_message(proc, "already holds run", "checkpointing.overwrite=true")
    assert _tree_digest(run) == before
    # Overwrite granted, but the cluster to join is not there: refused before anything is replaced.
    proc = run_launch(
        [*SFT, "algorithm.max_steps=34", "checkpointing.overwrite=true", "cluster=auto",
         "cluster.connect_timeout_s=2", f"hydra.run.dir={run}"],
        tmp_path,
    )
    _one_message(proc, "cluster.address=auto found no Ray cluster to join")
    assert _tree_digest(run) == before


def _blocked_dir(tmp_path: Path) -> list[str]:
    (tmp_path / "a_file").write_text("x")
    return [f"hydra.run.dir={tmp_path / 'a_file' / 'run'}"]


@pytest.mark.parametrize(
    ("case", "overrides", "needle"),
    [
        ("cpu_budget", ["data_plane=tq", "cluster.num_cpus=2", "data_plane.simple.num_storage_units=2"],
         "cluster.num_cpus=2 is too small: the data plane's own actors reserve 3 logical CPUs"),
        ("cuda", ["policy.device=cuda"], "policy.device: cuda, but torch"),
        ("cluster", ["cluster=auto", "cluster.connect_timeout_s=2"], "cluster.address=auto found no Ray cluster"),
        ("unwritable", None, "hydra.run.dir: output path"),
    ],
)
def test_pre_ray_checks_are_one_message_and_leave_no_run_directory(
    tmp_path: Path, case: str, overrides: list[str] | None, needle: str
) -> None:
    if case == "cuda":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a CUDA device")
    new = tmp_path / "new"
    extra = _blocked_dir(tmp_path) if overrides is None else [*overrides, f"hydra.run.dir={new}"]
    # A private Ray: the GPU check is the local cluster's (a joined one is checked by Ray).
    proc = run_launch([*SFT, "algorithm.max_steps=1", *extra], tmp_path, private_ray=True)
    _one_message(proc, needle)
    assert not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["a_file"] if overrides is None else [])
