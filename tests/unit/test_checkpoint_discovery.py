"""Finding checkpoints on disk (nemo_dp.training.checkpoint_discovery): the rules resume, evaluate,
the checkpointer and the failure summary share."""

from __future__ import annotations

from pathlib import Path

from nemo_dp.training.checkpoint_discovery import (
    classify_checkpoint_dir,
    find_phase_roots,
    list_step_dirs,
    newest_checkpoint,
    step_of,
    temp_step_dirs,
)


def _step(phase_root: Path, step: int, *files: str) -> Path:
    d = phase_root / f"step_{step:08d}"
    d.mkdir(parents=True)
    for name in files:
        (d / name).write_text("{}")
    return d


def test_step_dirs_committed_and_not(tmp_path: Path) -> None:
    sft = tmp_path / "checkpoints" / "sft"
    done = _step(sft, 2, "manifest.json", "state.json")
    partial = _step(sft, 5)  # no manifest: a copy in progress, still a step directory
    (sft / "step_00000007.tmp-0a1b").mkdir()
    (sft / "step_00000003.old-ff").mkdir()
    assert [step_of(p) for p in (done, partial, sft / "step_00000007.tmp-0a1b", sft)] == [2, 5, None, None]
    assert list_step_dirs(sft) == [(2, done), (5, partial)]
    assert list_step_dirs(sft, committed=True) == [(2, done)]
    assert list_step_dirs(tmp_path / "missing") == []
    assert find_phase_roots(tmp_path / "checkpoints") == {"sft": sft}
    assert temp_step_dirs(tmp_path / "checkpoints") == [sft / "step_00000007.tmp-0a1b"]


def test_classify_the_three_forms(tmp_path: Path) -> None:
    root = tmp_path / "run" / "checkpoints"
    step = _step(root / "grpo", 4, "manifest.json")
    uncommitted = _step(root / "ppo", 1)
    loc = classify_checkpoint_dir(step)
    assert loc is not None and (loc.kind, loc.step_dir, loc.run_dir) == ("step directory", step, tmp_path / "run")
    loc = classify_checkpoint_dir(root / "grpo")
    assert loc is not None and (loc.kind, loc.phase_roots) == ("phase root", {"grpo": root / "grpo"})
    loc = classify_checkpoint_dir(root)
    assert loc is not None and (loc.kind, sorted(loc.phase_roots)) == ("checkpoints root", ["grpo", "ppo"])
    loc = classify_checkpoint_dir(root, committed=True)
    assert loc is not None and sorted(loc.phase_roots) == ["grpo"]
    assert classify_checkpoint_dir(uncommitted.parent, committed=True) is None
    assert classify_checkpoint_dir(tmp_path / "run") is None  # the run-directory form is the caller's


def test_newest_checkpoint_of_the_latest_phase_that_has_one(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    assert newest_checkpoint(None) is None and newest_checkpoint(root) is None
    ws = _step(root / "warm_start", 3, "manifest.json", "state.json")
    _step(root / "grpo", 9, "manifest.json")  # no state file: not loadable
    assert newest_checkpoint(root, ["warm_start", "grpo"]) == ws
    grpo = _step(root / "grpo", 1, "manifest.json", "state.json")
    assert newest_checkpoint(root, ["warm_start", "grpo"]) == grpo
    assert newest_checkpoint(root, ["warm_start"]) == ws
    assert newest_checkpoint(root) == ws  # no phase names: sub-directories by name, "warm_start" last
