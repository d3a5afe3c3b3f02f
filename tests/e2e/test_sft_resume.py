"""Exact resume and crash safety of the data-plane SFT trainer, on the Local store, TransferQueue
and the Ray object store.

* **Resume**: N = 6 straight steps (checkpoint every 3) versus 3 steps + resume for 3 more from
  the step-3 checkpoint: steps 4-6 must have identical ``loss`` / ``grad_norm`` / ``lr`` /
  ``consumed_samples`` (``==``, no tolerance: the checkpoint holds model, optimizer, RNG
  streams, counters, the committed loader position and the data plane's own checkpoint, and
  prefetched batches are dropped before saving, so the resumed run loads exactly the batches
  the straight run trained on).
* **Crash safety** (Local): the training process is SIGKILLed while the step-6 checkpoint is
  being written.  The process is this file run as a script: it runs the launcher's run layer
  (``nemo_dp.training.run_phases``) with a ``TrainHooks.on_checkpoint_staged`` hook that, at
  step 6, announces itself and blocks - after ``state.json`` and the data plane are in the
  temporary directory and before the manifest / commit renames.  The step-3 checkpoint must
  still be the latest committed one, load, and a run resumed from it must reproduce steps 4-6
  of the straight run.

The other runs are the real launcher in subprocesses (see ``test_sft_parity.py`` for the
settings); the straight runs are shared with ``test_sft_parity.py`` within one pytest session.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nemo_dp.training.checkpoint_discovery import latest_checkpoint
from nemo_dp.utils.checkpoint import load_training_checkpoint
from tests.e2e.test_sft_parity import CKPT, COMPARED, SFT_OVERRIDES, read_metrics, run_launcher, straight_run


def _resume(tmp_path: Path, choice: str, resume_root: Path, name: str) -> Path:
    run_dir = tmp_path / name
    proc = run_launcher(
        [
            *SFT_OVERRIDES,
            f"data_plane={choice}",
            *CKPT,
            f"checkpointing.resume_from={resume_root}",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
    )
    assert "resumed from" in proc.stdout and "at step 3" in proc.stdout
    return run_dir


def _assert_same_tail(straight: Path, resumed: Path, *, history: bool) -> None:
    """The resumed run's steps 4-6 equal the straight run's; with ``history`` (resumed from a
    run directory) its metrics also hold steps 1-3, copied from the interrupted run."""
    a, b = read_metrics(straight), read_metrics(resumed)
    assert sorted(b) == ([1, 2, 3, 4, 5, 6] if history else [4, 5, 6])
    for step in sorted(b):
        for key in COMPARED:
            assert b[step][key] == a[step][key], (step, key, b[step][key], a[step][key])
    # The first resumed step loads its batch (2 driver -> worker calls), the others are one
    # fused call each.
    assert [b[step]["driver/worker_calls"] for step in (4, 5, 6)] == [2, 1, 1]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tq_resume_is_exact(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    straight, _ = straight_run("tq", tmp_path_factory)
    step3 = straight / "checkpoints" / "sft" / "step_00000003"
    assert (step3 / "data_plane" / "tq" / "manifest.json").is_file()  # the data plane's checkpoint
    root = tmp_path / "resume_root"
    shutil.copytree(step3, root / "sft" / step3.name)
    _assert_same_tail(straight, _resume(tmp_path, "tq", root, "resumed_tq"), history=False)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ray_resume_is_exact(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    straight, _ = straight_run("ray", tmp_path_factory)
    step3 = straight / "checkpoints" / "sft" / "step_00000003"
    assert (step3 / "data_plane" / "ray_store").is_dir()  # the shared store's checkpoint
    root = tmp_path / "resume_root"
    shutil.copytree(step3, root / "sft" / step3.name)
    _assert_same_tail(straight, _resume(tmp_path, "ray", root, "resumed_ray"), history=False)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_local_sigkill_during_checkpoint_then_resume_is_exact(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    straight, _ = straight_run("local", tmp_path_factory)
    step3 = straight / "checkpoints" / "sft" / "step_00000003"
    assert (step3 / "data_plane" / "dp0" / "manifest.json").is_file()  # each worker's store
    assert (step3 / "data_plane" / "dp1" / "manifest.json").is_file()

    crash_dir = tmp_path / "crash_local"
    env = dict(os.environ)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.test_sft_resume", str(crash_dir), "6", *SFT_OVERRIDES, "data_plane=local", *CKPT],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 240
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "[test hook] checkpoint step 6 paused" in line:
                break
        assert seen and "checkpoint step 6 paused" in seen[-1], "".join(seen[-50:])
        os.kill(proc.pid, signal.SIGKILL)  # the training (driver) process, mid-checkpoint
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        try:  # leftovers of the killed run in its own session (its Ray processes)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == -signal.SIGKILL

    ckpt_root = crash_dir / "checkpoints" / "sft"
    names = sorted(p.name for p in ckpt_root.iterdir())
    assert any(n.startswith("step_00000006.tmp-") for n in names), names  # the interrupted write
    assert "step_00000006" not in names
    latest = latest_checkpoint(ckpt_root)
    assert latest is not None and latest.name == "step_00000003"
    assert load_training_checkpoint(latest)["counters"]["step"] == 3

    _assert_same_tail(
        straight, _resume(tmp_path, "local", crash_dir / "checkpoints", "resumed_local"), history=True
    )


#: Every file name the TransferQueue data plane's old checkpoint format (the library's own
#: files under ``data_plane/tq/tq/``) wrote into a training checkpoint.
OLD_TQ_FILES = (
    "data_plane/tq/tq/controller_state.pkl",
    "data_plane/tq/tq/metadata.json",
    "data_plane/tq/tq/simple_storage/su_0_TransferQueueStorageUnit#0.pkl",
    "data_plane/tq/tq/simple_storage/storage_unit_info.json",
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tq_resume_never_loads_a_planted_pickle(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    from nemo_dp.utils.manifest import verify_manifest, write_manifest
    from tests.e2e.conftest import run_launch
    from tests.e2e.planted_pickle import plant_pickle

    straight, _ = straight_run("tq", tmp_path_factory)
    step3 = straight / "checkpoints" / "sft" / "step_00000003"
    assert sorted(p.name for p in (step3 / "data_plane" / "tq").iterdir()) == ["manifest.json", "tensors.safetensors"]
    marker = tmp_path / "code_ran"
    for i, rel in enumerate(OLD_TQ_FILES):
        root = tmp_path / f"root_{i}"
        ckpt = root / "sft" / step3.name
        shutil.copytree(step3, ckpt)
        plant_pickle(ckpt, rel, marker)
        write_manifest(ckpt)  # whoever can write the checkpoint can rewrite its manifest
        verify_manifest(ckpt)
        run_dir = tmp_path / f"run_{i}"
        proc = run_launch(
            [*SFT_OVERRIDES, "data_plane=tq", *CKPT, f"checkpointing.resume_from={root}", f"hydra.run.dir={run_dir}"],
            tmp_path,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, out[-3000:]
        assert f"{ckpt / rel} is a pickle" in out, out[-3000:]
        assert "Traceback" not in out
        assert not marker.exists(), rel
        assert not run_dir.exists(), rel


PAUSED_LINE = "[test hook] checkpoint step {step} paused"


def _run_with_pause(run_dir: Path, pause_step: int, overrides: list[str]) -> None:
    """Run the launcher's run layer on ``overrides``, blocking inside checkpoint ``pause_step``.

    Args:
        run_dir: The run directory.
        pause_step: The step whose checkpoint write blocks (until the process is killed).
        overrides: Hydra overrides.
    """
    from hydra import compose, initialize_config_dir

    from nemo_dp.config import preflight, register_configs, validate_config
    from nemo_dp.training import TrainHooks, run_phases

    repo = Path(__file__).resolve().parents[2]
    register_configs(repo / "recipes")
    with initialize_config_dir(str(repo / "conf"), version_base=None):
        cfg = compose("config", overrides=overrides)
    validated = validate_config(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    preflight(validated, run_dir)
    never = threading.Event()

    def pause(step: int, tmp_dir: Path) -> None:
        if step == pause_step:
            assert (tmp_dir / "state.json").is_file()
            print(PAUSED_LINE.format(step=step), flush=True)
            never.wait(300)  # the test SIGKILLs this process while it waits here

    run_phases(cfg, validated, run_dir, hooks=TrainHooks(on_checkpoint_staged=pause))


if __name__ == "__main__":  # python -m tests.e2e.test_sft_resume RUN_DIR STEP OVERRIDES...
    _run_with_pause(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
