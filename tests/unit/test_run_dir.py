"""Run directories never mix runs; a resumed run continues its history (issue 14 problems 2, 7).

Problem 2: a second run into the same ``hydra.run.dir`` left the first run's checkpoints beside
its own and a later resume picked the older run's step.  Problem 7: a resumed run started a new
``metrics.jsonl`` whose steps overlapped the interrupted run's.  Checkpoints here are real
atomic commits; the metrics files are written by the project's ``MetricsLogger``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nemo_dp.training.resume import CheckpointMeta, resolve_resume, write_checkpoint_meta
from nemo_dp.training.run_dir import (
    OVERWRITE_KEY,
    RUN_MARKER,
    RunDirError,
    claim_run_dir,
    continue_history,
    read_run_marker,
    scan_run_dir,
)
from nemo_dp.utils.checkpoint import write_training_state
from nemo_dp.utils.checkpoint_io import write_checkpoint_atomically
from nemo_dp.utils.checkpoint_io import write_manifest as write_format_manifest
from nemo_dp.utils.metrics import MetricsLogger, read_metrics

SHAPE = {"d_model": 8, "n_layers": 1}


def _save(run: Path, phase: str, step: int, run_id: str = "old-run") -> Path:
    def write(tmp: Path) -> None:
        write_training_state(tmp, {"step": torch.tensor(step)})
        write_format_manifest(tmp, {"format": "nemo_dp.training_checkpoint", "format_version": 2})
        algo = "sft" if phase == "warm_start" else phase
        write_checkpoint_meta(tmp, CheckpointMeta(algo, phase, dict(SHAPE), "local", run_id, step))

    return write_checkpoint_atomically(run / "checkpoints" / phase / f"step_{step:08d}", write)


def _metrics(path: Path, steps: range) -> None:
    logger = MetricsLogger(path)
    for s in steps:
        logger.log(s, {"loss": float(s)})


def _previous_run(tmp_path: Path, name: str = "run") -> Path:
    """A finished GRPO run: marker, checkpoints at 10 and 20, metrics 1..20, summary."""
    run = tmp_path / name
    (run / ".hydra").mkdir(parents=True)
    claim_run_dir(run).commit()
    _save(run, "grpo", 10, read_run_marker(run)["run_id"])  # type: ignore[index]
    _save(run, "grpo", 20, read_run_marker(run)["run_id"])  # type: ignore[index]
    _metrics(run / "metrics.jsonl", range(1, 21))
    (run / "summary.json").write_text("{}")
    return run


def _plan(path: Path):
    return resolve_resume(path, phase_names=["grpo"], algorithm="grpo", data_plane="local", model_shape=SHAPE)


def test_fresh_dir_gets_a_marker_and_hydra_files_do_not_count(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("a: 1\n")
    (run / "launch.log").write_text("")
    decision = claim_run_dir(run)
    assert decision.mode == "fresh"
    assert not (run / RUN_MARKER).exists()  # claim writes nothing
    assert decision.commit() == []
    marker = read_run_marker(run)
    assert marker is not None and marker["run_id"] == decision.run_id and marker["resumes"] == []


def test_second_run_into_the_same_dir_is_refused_naming_the_keys(tmp_path: Path) -> None:
    run = _previous_run(tmp_path)
    before = sorted(p.relative_to(run).as_posix() for p in run.rglob("*"))
    with pytest.raises(RunDirError) as info:
        claim_run_dir(run)
    msg = str(info.value)
    assert "checkpoints grpo: steps [10, 20]" in msg and "metrics.jsonl" in msg
    assert (
        "hydra.run.dir" in msg
        and f"checkpointing.resume_from={run}" in msg
        and f"{OVERWRITE_KEY}=true" in msg
    )
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*")) == before


def test_metrics_alone_or_a_phase_subdir_also_count(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _metrics(run / "warm_start" / "metrics.jsonl", range(1, 3))
    contents = scan_run_dir(run)
    assert contents.metrics == [run / "warm_start" / "metrics.jsonl"]
    with pytest.raises(RunDirError, match="warm_start/metrics.jsonl"):
        claim_run_dir(run)


def test_overwrite_removes_the_previous_run(tmp_path: Path) -> None:
    run = _previous_run(tmp_path)
    old_id = read_run_marker(run)["run_id"]  # type: ignore[index]
    decision = claim_run_dir(run, overwrite=True)
    assert decision.mode == "overwrite" and decision.run_id != old_id
    lines = decision.commit()
    assert len(lines) == 1 and f"{OVERWRITE_KEY}=true: removed run {old_id}" in lines[0]
    assert not (run / "checkpoints").exists() and not (run / "metrics.jsonl").exists()
    assert not (run / "summary.json").exists()
    assert read_run_marker(run)["run_id"] == decision.run_id  # type: ignore[index]
    with pytest.raises(RunDirError, match=f"run {decision.run_id}"):
        claim_run_dir(run)  # the directory now belongs to the new run
    # The directory now holds only the new run's marker: a resume finds nothing of the old run.
    with pytest.raises(ValueError, match="no checkpoints"):
        _plan(run)


def test_resume_in_place_keeps_the_run_id(tmp_path: Path) -> None:
    run = _previous_run(tmp_path)
    old_id = read_run_marker(run)["run_id"]  # type: ignore[index]
    plan = _plan(run)
    decision = claim_run_dir(run, resume=plan, phase_names=["grpo"])
    assert (decision.mode, decision.run_id, decision.resume_step) == ("resume_in_place", old_id, 20)
    assert decision.commit() == []
    marker = read_run_marker(run)
    assert marker is not None and marker["run_id"] == old_id
    assert [r["checkpoint"] for r in marker["resumes"]] == [str(plan.checkpoint)]


def test_resume_in_place_from_an_older_step_moves_newer_checkpoints_out(tmp_path: Path) -> None:
    run = _previous_run(tmp_path)
    plan = _plan(run / "checkpoints" / "grpo" / "step_00000010")
    decision = claim_run_dir(run, resume=plan, phase_names=["grpo"])
    lines = decision.commit()
    assert len(lines) == 1 and "moved 1 newer checkpoint(s) ['grpo/step_00000020']" in lines[0]
    # The later resume can no longer pick the superseded step.
    assert _plan(run).checkpoint == run / "checkpoints" / "grpo" / "step_00000010"
    assert len(list(run.glob("superseded-*/grpo/step_00000020"))) == 1


def test_resume_in_place_of_an_earlier_phase_supersedes_later_phases(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _save(run, "warm_start", 100)
    _save(run, "grpo", 5)
    plan = resolve_resume(
        run / "checkpoints" / "warm_start",
        phase_names=["warm_start", "grpo"],
        algorithm="grpo",
        data_plane="local",
        model_shape=SHAPE,
    )
    decision = claim_run_dir(run, resume=plan, phase_names=["warm_start", "grpo"])
    assert decision.mode == "resume_in_place"
    lines = decision.commit()
    assert "['grpo/step_00000005']" in lines[0]
    assert scan_run_dir(run).checkpoints == {"warm_start": [100]}


def test_resuming_another_run_into_a_used_dir_is_refused(tmp_path: Path) -> None:
    old = _previous_run(tmp_path, "old")
    other = _previous_run(tmp_path, "other")
    with pytest.raises(RunDirError, match="which is not in this directory"):
        claim_run_dir(other, resume=_plan(old))
    fresh = tmp_path / "new"
    decision = claim_run_dir(fresh, resume=_plan(old))
    assert decision.mode == "fresh"
    decision.commit()
    assert read_run_marker(fresh)["resumes"][0]["in_place"] is False  # type: ignore[index]


def test_corrupt_marker_is_named(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / RUN_MARKER).write_text("[1]")
    with pytest.raises(RunDirError, match=f"{RUN_MARKER}: not a run marker"):
        claim_run_dir(run)


# --- history ---------------------------------------------------------------------------------


def test_resume_into_a_new_dir_copies_history_without_overlap(tmp_path: Path) -> None:
    old = tmp_path / "old"
    _metrics(old / "warm_start" / "metrics.jsonl", range(0, 5))
    _metrics(old / "metrics.jsonl", range(0, 13))  # interrupted at 12, checkpoint at 10
    new = tmp_path / "new"
    reports = continue_history(
        source_run_dir=old,
        run_dir=new,
        phase_subdirs=["warm_start", ""],
        resume_phase_index=1,
        resume_step=10,
    )
    assert [(r.kept, r.dropped) for r in reports] == [(5, 0), (11, 2)]
    assert "dropped 2" in reports[1].describe() and str(old) in reports[1].describe()
    # The resumed run appends steps 11.. through the project's own logger: no step repeats.
    _metrics(new / "metrics.jsonl", range(11, 16))
    steps = [r["step"] for r in read_metrics(new / "metrics.jsonl")]
    assert steps == list(range(0, 16))
    assert [r["step"] for r in read_metrics(new / "warm_start" / "metrics.jsonl")] == list(range(0, 5))
    # The interrupted run's files are untouched.
    assert [r["step"] for r in read_metrics(old / "metrics.jsonl")] == list(range(0, 13))


def test_resume_in_place_truncates_and_drops_later_phases(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _metrics(run / "warm_start" / "metrics.jsonl", range(0, 8))
    _metrics(run / "metrics.jsonl", range(0, 3))
    reports = continue_history(
        source_run_dir=run, run_dir=run, phase_subdirs=["warm_start", ""], resume_phase_index=0, resume_step=5
    )
    assert [(r.path, r.kept, r.dropped) for r in reports] == [
        (run / "warm_start" / "metrics.jsonl", 6, 2),
        (run / "metrics.jsonl", 0, 3),
    ]
    assert not (run / "metrics.jsonl").exists()
    assert [r["step"] for r in read_metrics(run / "warm_start" / "metrics.jsonl")] == list(range(0, 6))
    assert (
        continue_history(
            source_run_dir=run,
            run_dir=run,
            phase_subdirs=["warm_start", ""],
            resume_phase_index=0,
            resume_step=5,
        )
        == []
    )


def test_torn_last_line_is_dropped_and_bad_lines_are_named(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _metrics(run / "metrics.jsonl", range(1, 4))
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"step": 4, "lo')  # the writer was killed mid-line
    (report,) = continue_history(
        source_run_dir=run, run_dir=tmp_path / "new", phase_subdirs=[""], resume_phase_index=0, resume_step=3
    )
    assert (report.kept, report.dropped) == (3, 1)
    (run / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: invalid JSON"):
        continue_history(
            source_run_dir=run, run_dir=run, phase_subdirs=[""], resume_phase_index=0, resume_step=1
        )
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunDirError, match="exists already"):
        continue_history(
            source_run_dir=run,
            run_dir=tmp_path / "dst",
            phase_subdirs=[""],
            resume_phase_index=0,
            resume_step=1,
        )
