"""Issue 14 end to end: resume never silently starts over, run directories never mix, corrupt
or foreign checkpoints are refused naming the file or key, failures are clean.

Every test drives ``launchers/launch.py`` in a subprocess on tiny SFT / GRPO settings with
``data_plane=disabled`` (the backend plays no part in these checks, except where a data-plane
mismatch is the point).  One short SFT run with a checkpoint after every step is shared by the
module (and with ``test_evaluate.py``: ``sft_checkpointed_run`` in ``conftest.py``); tests that
damage a checkpoint damage a copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from nemo_dp.utils.metrics import read_metrics
from tests.e2e.conftest import (
    GRPO_ONE_STEP,
    SFT_CHECKPOINTED,
    assert_launch_ok,
    group_killed_on_exit,
    popen_launch,
    run_launch,
)

pytestmark = pytest.mark.timeout(420)

SFT = SFT_CHECKPOINTED
GRPO: tuple[str, ...] = (*GRPO_ONE_STEP, "data_plane=disabled")


def _launch(overrides: list[str] | tuple[str, ...], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_launch(overrides, cwd, timeout=timeout)


_ok = assert_launch_ok


def _resume(src: Path, new: Path, *overrides: str, steps: int = 3) -> subprocess.CompletedProcess:
    """``SFT`` for ``steps`` steps with ``overrides``, resumed from ``src`` into the run directory
    ``new`` (launched from ``new``'s parent)."""
    resume = [f"checkpointing.resume_from={src}", f"hydra.run.dir={new}"]
    return _launch([*SFT, f"algorithm.max_steps={steps}", *overrides, *resume], new.parent)


def _refused(proc: subprocess.CompletedProcess, run_dir: Path, *needles: str) -> None:
    """A clean configuration failure: non-zero, one message naming ``needles``, no traceback,
    nothing trained, and the run directory Hydra created is gone."""
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-4000:]
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in stderr:\n{proc.stderr[-4000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert "Held-out exact-match accuracy" not in proc.stdout  # nothing trained
    assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())


@pytest.fixture
def sft_run(sft_checkpointed_run: Path) -> Path:
    """The session's finished 2-step ``SFT`` run with checkpoints at steps 1 and 2 (read only)."""
    return sft_checkpointed_run


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --- problem 1: resume never silently starts from scratch -----------------------------------


def test_resume_from_empty_directory_is_refused(sft_run: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    new = tmp_path / "new"
    proc = _resume(empty, new)
    _refused(proc, new, "checkpointing.resume_from", "is an empty directory - nothing to resume from")


def test_resume_from_a_run_directory_continues_its_history(sft_run: Path, tmp_path: Path) -> None:
    new = tmp_path / "resumed"
    proc = _resume(sft_run, new)
    _ok(proc)
    assert "(run directory) -> phase 'sft' step 2" in proc.stdout
    assert "at step 2" in proc.stdout  # the trainer's own "resumed from ... at step 2"
    # problem 7: the resumed run's metrics hold the whole history, no step twice, and its plot
    # is drawn from them.
    first = {r["step"]: r for r in read_metrics(sft_run / "metrics.jsonl")}
    steps = [r["step"] for r in read_metrics(new / "metrics.jsonl")]
    assert steps == [1, 2, 3], steps
    resumed = {r["step"]: r for r in read_metrics(new / "metrics.jsonl")}
    assert resumed[1] == first[1] and resumed[2] == first[2]
    assert (new / "training_curves.png").stat().st_size > 1000
    meta = json.loads((new / "checkpoints" / "sft" / "step_00000003" / "checkpoint_meta.json").read_text())
    assert meta["algorithm"] == "sft" and meta["phase"] == "sft" and meta["data_plane"] == "disabled"
    assert meta["step"] == 3 and meta["model_shape"]["d_model"] == 32
    assert meta["run_id"] == json.loads((new / "run.json").read_text())["run_id"]
    assert (new / "checkpoints" / "sft" / "step_00000003" / "file_manifest.json").is_file()
    summary = json.loads((new / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from"].endswith("step_00000002")


def test_resume_from_a_step_directory_uses_that_step(sft_run: Path, tmp_path: Path) -> None:
    step1 = sft_run / "checkpoints" / "sft" / "step_00000001"
    new = tmp_path / "resumed"
    proc = _resume(step1, new, steps=2)
    _ok(proc)
    assert "(step directory) -> phase 'sft' step 1" in proc.stdout
    assert [r["step"] for r in read_metrics(new / "metrics.jsonl")] == [1, 2]


def test_resume_from_a_checkpoint_missing_its_state_file_is_refused(sft_run: Path, tmp_path: Path) -> None:
    copy = _copy_run(sft_run, tmp_path / "copy")
    (copy / "checkpoints" / "sft" / "step_00000002" / "state.json").unlink()
    new = tmp_path / "new"
    proc = _resume(copy, new)
    _refused(proc, new, "step_00000002 is missing ['state.json']", "refusing to fall back silently")


def test_sft_checkpoint_given_to_grpo_is_refused_with_the_init_from_hint(sft_run: Path, tmp_path: Path) -> None:
    new = tmp_path / "new"
    proc = _launch([*GRPO, f"checkpointing.resume_from={sft_run}", f"hydra.run.dir={new}"], tmp_path)
    _refused(proc, new, "holds checkpoints of phase(s) ['sft'] only", "policy.init_from=")


def test_init_from_starts_grpo_from_the_sft_weights(sft_run: Path, tmp_path: Path) -> None:
    new = tmp_path / "grpo"
    proc = _launch([*GRPO, f"policy.init_from={sft_run}", f"hydra.run.dir={new}"], tmp_path)
    _ok(proc)
    assert "init_from: policy.init_from=" in proc.stdout and "step 2" in proc.stdout
    assert "policy weights loaded from" in proc.stdout
    summary = json.loads((new / "summary.json").read_text())
    assert summary["init_from"].endswith("step_00000002")


# --- problem 2: a run directory is never shared by two runs ---------------------------------


def test_second_run_into_the_same_directory_is_refused(sft_run: Path, tmp_path: Path) -> None:
    copy = _copy_run(sft_run, tmp_path / "copy")
    before = (copy / "metrics.jsonl").read_text()
    proc = _launch([*SFT, "algorithm.max_steps=1", f"hydra.run.dir={copy}"], tmp_path)
    assert proc.returncode != 0
    assert "already holds" in proc.stderr and "checkpointing.overwrite=true" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (copy / "metrics.jsonl").read_text() == before  # nothing of the first run touched
    assert sorted(p.name for p in (copy / "checkpoints" / "sft").iterdir()) == ["step_00000001", "step_00000002"]
    proc = _launch([*SFT, "algorithm.max_steps=1", "checkpointing.overwrite=true", f"hydra.run.dir={copy}"], tmp_path)
    _ok(proc)
    assert sorted(p.name for p in (copy / "checkpoints" / "sft").iterdir()) == ["step_00000001"]
    assert [r["step"] for r in read_metrics(copy / "metrics.jsonl")] == [1]


# --- problem 4: corrupt and foreign checkpoints ---------------------------------------------


def test_truncated_and_zeroed_state_files_are_named(sft_run: Path, tmp_path: Path) -> None:
    copy = _copy_run(sft_run, tmp_path / "copy")
    tensors = copy / "checkpoints" / "sft" / "step_00000002" / "tensors.safetensors"
    data = tensors.read_bytes()
    tensors.write_bytes(data[: len(data) // 2])
    new = tmp_path / "new"
    proc = _resume(copy, new)
    _refused(proc, new, f"checkpoint file {tensors} is truncated")
    tensors.write_bytes(bytes(len(data)))
    proc = _resume(copy, new)
    _refused(proc, new, f"checkpoint file {tensors} is altered")


def test_other_model_size_and_data_plane_are_refused_naming_the_keys(sft_run: Path, tmp_path: Path) -> None:
    new = tmp_path / "new"
    proc = _resume(sft_run, new, "policy.model.d_model=64")
    _refused(proc, new, "differing keys: ['model_shape.d_model']", "policy.model.d_model")
    proc = _resume(sft_run, new, "data_plane=local")
    _refused(proc, new, "differing keys: ['data_plane']", "checkpoint 'disabled', this run 'local'")


def test_other_dp_size_is_refused_before_ray_naming_the_key(sft_run: Path, tmp_path: Path) -> None:
    new = tmp_path / "new"
    proc = _resume(sft_run, new, "policy.dp_size=2")
    _refused(proc, new, "differing keys: ['policy.dp_size']", "policy.dp_size: checkpoint 1, this run 2")
    assert "Ray" not in proc.stdout  # refused before Ray started


def test_resume_keeps_the_trainer_mode_of_the_checkpoint(
    grpo_warm_start_run: tuple[Path, subprocess.CompletedProcess], tmp_path: Path
) -> None:
    from tests.e2e.conftest import GRPO_WARM_START

    run, _ = grpo_warm_start_run  # synchronous GRPO on the legacy trainer
    new = tmp_path / "new"
    proc = _launch(
        [
            *GRPO_WARM_START,
            "algorithm.max_steps=6",
            "data_plane=tq",
            "algorithm.async_rollout.enabled=true",
            f"checkpointing.resume_from={run}",
            f"hydra.run.dir={new}",
        ],
        tmp_path,
    )
    _refused(
        proc,
        new,
        "differing keys: ['algorithm.async_rollout.enabled', 'data_plane']",
        "algorithm.async_rollout.enabled: checkpoint False, this run True",
    )


# --- problem 5: failures are clean ------------------------------------------------------------


def test_validation_error_is_one_message_and_leaves_no_run_directory(tmp_path: Path) -> None:
    new = tmp_path / "bad"
    proc = _launch([*SFT, "policy.dp_size=0", f"hydra.run.dir={new}"], tmp_path)
    _refused(proc, new, "policy.dp_size")
    log = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(log) <= 3, proc.stderr  # the message (and Hydra's hint line), not a traceback


def test_sigterm_stops_like_ctrl_c_with_a_summary_and_a_clean_log(tmp_path: Path) -> None:
    import signal
    import time

    import psutil

    run = tmp_path / "run"
    endless = [*SFT, "algorithm.max_steps=100000", "algorithm.val_period=1", "checkpointing.save_period=0"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    proc = popen_launch([*endless, f"hydra.run.dir={run}"], tmp_path, **pipes)
    descendants: list[psutil.Process] = []
    with group_killed_on_exit(proc):
        deadline = time.monotonic() + 240
        assert proc.stdout is not None
        seen: list[str] = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if (run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").stat().st_size > 0:
                break
        assert (run / "metrics.jsonl").is_file(), "".join(seen[-40:])
        descendants = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-4000:]
    assert "stopped by SIGTERM" in err
    assert "Traceback" not in err and "SIGTERM received" not in err and "*** " not in err, err[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "terminated"
    assert (run / "training_curves.png").is_file()
    log = (run / "launch.log").read_text()
    assert "run directory:" in log and "\x1b[" not in log
    # Nothing left behind: the driver's Ray processes exit with it.
    stop = time.monotonic() + 60
    while time.monotonic() < stop and any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in descendants):
        time.sleep(0.5)
    alive = [p for p in descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [p.name() for p in alive]


@pytest.mark.slow
def test_sigterm_during_final_teardown_keeps_summary_plot_and_says_how_to_resume(tmp_path: Path) -> None:
    import shlex
    import signal
    import time

    run = tmp_path / "run"
    two_steps = [*SFT, "algorithm.max_steps=2", f"hydra.run.dir={run}"]
    proc = popen_launch(two_steps, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with group_killed_on_exit(proc):
        assert proc.stdout is not None
        seen: list[str] = []
        for line in proc.stdout:
            seen.append(line)
            if "Held-out exact-match accuracy after" in line:  # every step and checkpoint done
                break
        assert seen and "Held-out exact-match accuracy after" in seen[-1], "".join(seen[-40:])
        time.sleep(1.0)  # into the teardown of the workers and Ray (several seconds here)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["phases"]["sft"]["step"] == 2, summary
    assert (run / "training_curves.png").is_file()
    assert proc.returncode == 143, err[-4000:]
    assert summary["status"] == "terminated" and "stopped by SIGTERM" in err
    last = run / "checkpoints" / "sft" / "step_00000002"
    assert f"last good checkpoint: {last}" in err and summary["last_checkpoint"] == str(last)
    command = summary["resume_command"]
    assert f"resume with: {command}" in err
    assert f"checkpointing.resume_from={run}" in command and f"hydra.run.dir={run}" in command
    # The printed command resumes; a killed checkpoint write's temp directory is removed.
    stale = run / "checkpoints" / "sft" / "step_00000003.tmp-0badc0de"
    stale.mkdir()
    (stale / "state.json").write_text("{}")
    resumed = _launch(shlex.split(command)[2:], tmp_path)
    _ok(resumed)
    assert f"removed {stale}" in resumed.stdout and not stale.exists()
    assert "step 2" in resumed.stdout


@pytest.mark.slow
def test_a_launch_right_after_a_sigkilled_driver_is_unaffected(tmp_path: Path) -> None:
    """A SIGKILLed driver leaves Ray's dashboard and runtime-env agents running for about a
    minute (Ray's own cleanup, docs/resume.md); the next launch starts its own private Ray
    beside them and runs normally."""
    import signal
    import time

    import psutil

    killed = tmp_path / "killed"
    endless = [*SFT, "algorithm.max_steps=100000", "algorithm.val_period=1", "checkpointing.save_period=0"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    proc = popen_launch([*endless, f"hydra.run.dir={killed}"], tmp_path, **quiet)
    orphans: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 240
        metrics = killed / "metrics.jsonl"
        while time.monotonic() < deadline and not (metrics.is_file() and metrics.stat().st_size > 0):
            time.sleep(0.2)
        assert metrics.is_file(), "the run to kill never trained"
        orphans = psutil.Process(proc.pid).children(recursive=True)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        new = tmp_path / "next"
        # A private Ray, as the killed run had: the next one starts beside its leftovers.
        next_run = [*SFT, "algorithm.max_steps=2", f"hydra.run.dir={new}"]
        _ok(run_launch(next_run, tmp_path, timeout=300, private_ray=True))
        assert json.loads((new / "summary.json").read_text())["status"] == "completed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for orphan in orphans:  # what the killed driver's Ray left, by PID
            try:
                orphan.kill()
            except psutil.NoSuchProcess:
                pass


# --- problem 6: help and recipes that mislead ----------------------------------------------


def test_algorithm_sft_alone_fails_with_the_recipe_hint(tmp_path: Path) -> None:
    proc = _launch(["algorithm=sft", f"hydra.run.dir={tmp_path / 'x'}"], tmp_path)
    assert proc.returncode != 0
    assert "hint: algorithm=sft cannot be merged into the default recipe" in proc.stderr, proc.stderr[-3000:]
    assert "recipe=sft_arith" in proc.stderr and "~recipe" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_grpo_without_warm_start_says_its_advantages_are_all_zero(tmp_path: Path) -> None:
    """An untrained tiny policy earns no reward: the run says so and names the fix."""
    run = tmp_path / "grpo"
    # The detector warns after 5 zero-advantage steps in a row: 5 steps are enough to see it.
    proc = _launch([*GRPO, "algorithm.max_steps=5", "checkpointing.enabled=false", f"hydra.run.dir={run}"], tmp_path)
    _ok(proc)
    rewards = [r.get("reward_mean") for r in read_metrics(run / "metrics.jsonl") if r["step"] > 0]
    assert rewards and max(rewards) == 0.0, rewards  # the premise: nothing solved
    assert "WARNING: steps 1-5: every advantage is 0" in proc.stdout, proc.stdout[-3000:]
    assert "algorithm.warm_start.enabled=true" in proc.stdout and "policy.init_from=" in proc.stdout


# --- problem 3: dataset problems surface before Ray, naming the key / file:line ------------


def test_dataset_errors_name_the_key_and_line_before_ray(tmp_path: Path) -> None:
    new = tmp_path / "new"
    missing = tmp_path / "nope.jsonl"
    proc = _launch([*SFT, "algorithm.max_steps=1", f"env.sft_jsonl={missing}", f"hydra.run.dir={new}"], tmp_path)
    _refused(proc, new, "env.sft_jsonl", str(missing))
    long_row = tmp_path / "long.jsonl"
    long_row.write_text(
        json.dumps({"prompt": "1+1=", "response": "2"}) + "\n"
        + json.dumps({"prompt": "1+" * 40 + "1=", "response": "41"}) + "\n"
    )
    proc = _launch([*SFT, "algorithm.max_steps=1", f"env.sft_jsonl={long_row}", f"hydra.run.dir={new}"], tmp_path)
    _refused(proc, new, f"{long_row}:2", "policy.model.max_seq_len")
