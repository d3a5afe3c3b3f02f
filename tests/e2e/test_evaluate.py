"""``launchers/evaluate.py`` on checkpoints the launcher wrote (SFT, GRPO with warm start, PPO).

Each case evaluates, in a separate process, the checkpoint of a tiny ``launchers/launch.py`` run
and checks the printed accuracy against the predictions jsonl and against the held-out accuracy
the trainer itself recorded for that checkpoint.  The SFT and the GRPO-with-warm-start runs are
the session's shared runs (``sft_checkpointed_run`` and ``grpo_warm_start_run`` in
``conftest.py``: the resume tests read the same checkpoints); the PPO run is this file's own.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from nemo_dp.data.arithmetic import ArithmeticTask
from tests.e2e.conftest import REPO_ROOT, TINY, LaunchFn, run_script

pytestmark = pytest.mark.timeout(600)

EVALUATE = REPO_ROOT / "launchers" / "evaluate.py"
ACCURACY = re.compile(r"Held-out exact-match accuracy of (\w+) step (\d+): ([0-9.]+) \((\d+) problems")

RL_TINY: tuple[str, ...] = (
    *TINY,
    "data_plane=disabled",
    "algorithm.num_prompts_per_step=4",
    "algorithm.num_generations_per_prompt=4",
    "algorithm.num_train_prompts=64",
    "algorithm.max_steps=1",
    "algorithm.val_at_start=false",
    "logger.plot=false",
)


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"failed:\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-4000:]}"


def _evaluate(cwd: Path, overrides: Sequence[str]) -> subprocess.CompletedProcess:
    return run_script(EVALUATE, overrides, cwd, timeout=300)


def _printed(proc: subprocess.CompletedProcess) -> tuple[str, int, float, int]:
    m = ACCURACY.search(proc.stdout)
    assert m is not None, proc.stdout
    return m.group(1), int(m.group(2)), float(m.group(3)), int(m.group(4))


def _predictions(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        assert set(row) == {"prompt", "response", "extracted_answer", "answer", "reward"}
        assert row["reward"] == float(row["extracted_answer"] == row["answer"])
    return rows


def _trainer_accuracy(run: Path, phase: str) -> float:
    summary = json.loads((run / "summary.json").read_text())
    return float(summary["phases"][phase]["val_accuracy"])


def test_evaluate_sft_checkpoint(sft_checkpointed_run: Path, tmp_path: Path) -> None:
    run = sft_checkpointed_run  # 2 steps, a checkpoint after each
    out = tmp_path / "eval_latest"
    proc = _evaluate(tmp_path, [f"checkpoint={run / 'checkpoints'}", f"hydra.run.dir={out}"])
    _ok(proc)
    phase, step, acc, n = _printed(proc)
    assert (phase, step, n) == ("sft", 2, 16)  # TINY sets algorithm.val_samples=16
    assert "eval sft step 2" in proc.stderr  # the progress bar
    rows = _predictions(out / "predictions.jsonl")
    expected = ArithmeticTask(2, ("+",), 0).eval_problems(16)  # the env defaults of the run
    assert [(r["prompt"], r["answer"]) for r in rows] == [(p.prompt, p.answer) for p in expected]
    assert acc == pytest.approx(round(sum(r["reward"] for r in rows) / len(rows), 3), abs=1e-9)
    # The same held-out problems, greedy: the trainer's own number for this checkpoint.
    assert f"{acc:.3f}" == f"{_trainer_accuracy(run, 'sft'):.3f}"
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["step"] == 2 and summary["checkpoint"].endswith("step_00000002")

    # A given step, and a user jsonl.
    data = tmp_path / "my_eval.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n\n{"prompt": "20+22=", "answer": "42"}\n')
    out1 = tmp_path / "eval_step1"
    proc = _evaluate(
        tmp_path, [f"checkpoint={run / 'checkpoints'}", "step=1", f"eval.jsonl={data}", f"hydra.run.dir={out1}"]
    )
    _ok(proc)
    assert _printed(proc)[:2] == ("sft", 1) and _printed(proc)[3] == 2
    rows = _predictions(out1 / "predictions.jsonl")
    assert [r["prompt"] for r in rows] == ["1+1=", "20+22="]
    assert json.loads((out1 / "eval_summary.json").read_text())["checkpoint"].endswith("step_00000001")

    # Bad input fails naming what is at fault, before anything is written.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "1+2="}\n')
    out_bad = tmp_path / "eval_bad"
    proc = _evaluate(tmp_path, [f"checkpoint={run / 'checkpoints'}", f"eval.jsonl={bad}", f"hydra.run.dir={out_bad}"])
    assert proc.returncode != 0 and f"{bad}:2" in proc.stderr and "'answer'" in proc.stderr
    assert not (out_bad / "predictions.jsonl").exists()
    proc = _evaluate(tmp_path, [f"checkpoint={run / 'checkpoints'}", "step=7", f"hydra.run.dir={out_bad}"])
    assert proc.returncode != 0 and "step=7" in proc.stderr and "[1, 2]" in proc.stderr
    proc = _evaluate(tmp_path, [f"hydra.run.dir={out_bad}"])
    assert proc.returncode != 0 and "checkpoint" in proc.stderr


@pytest.mark.slow
def test_evaluate_grpo_phases_and_ppo(
    launch: LaunchFn, tmp_path: Path, grpo_warm_start_run: tuple[Path, subprocess.CompletedProcess]
) -> None:
    grpo, _ = grpo_warm_start_run  # 3 warm-start steps (8 held-out problems), then 4 GRPO steps
    out = tmp_path / "eval_grpo"
    proc = _evaluate(tmp_path, [f"checkpoint={grpo / 'checkpoints'}", f"hydra.run.dir={out}"])
    _ok(proc)
    phase, step, acc, n = _printed(proc)
    assert (phase, step, n) == ("grpo", 4, 16)  # the last phase by default
    assert f"{acc:.3f}" == f"{_trainer_accuracy(grpo, 'grpo'):.3f}"
    out_ws = tmp_path / "eval_ws"
    proc = _evaluate(tmp_path, [f"checkpoint={grpo / 'checkpoints'}", "phase=warm_start", f"hydra.run.dir={out_ws}"])
    _ok(proc)
    phase, step, acc, n = _printed(proc)
    assert (phase, step, n) == ("warm_start", 3, 8)  # warm_start.val_samples, not the GRPO phase's 16
    assert f"{acc:.3f}" == f"{_trainer_accuracy(grpo, 'warm_start'):.3f}"

    ppo = tmp_path / "ppo_run"
    _ok(launch(["recipe=ppo_arith", *RL_TINY, "algorithm.warm_start.enabled=false", f"hydra.run.dir={ppo}"]))
    out_ppo = tmp_path / "eval_ppo"
    proc = _evaluate(tmp_path, [f"checkpoint={ppo / 'checkpoints'}", f"hydra.run.dir={out_ppo}"])
    _ok(proc)
    phase, step, acc, n = _printed(proc)
    assert (phase, step, n) == ("ppo", 1, 16)
    assert f"{acc:.3f}" == f"{_trainer_accuracy(ppo, 'ppo'):.3f}"


def test_evaluate_checks_the_checkpoint_like_resume_and_fails_cleanly(sft_checkpointed_run: Path, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "run"  # a copy: this test damages its files
    shutil.copytree(sft_checkpointed_run, run)
    # A run directory is accepted as resume_from takes it; the accuracy is the trainer's own number.
    out = tmp_path / "eval_run_dir"
    proc = _evaluate(tmp_path, [f"checkpoint={run}", f"hydra.run.dir={out}"])
    _ok(proc)
    assert _printed(proc)[:2] == ("sft", 2)
    assert json.loads((out / "eval_summary.json").read_text())["accuracy"] == _trainer_accuracy(run, "sft")

    def refused(overrides: Sequence[str], *needles: str) -> None:
        out_bad = tmp_path / "eval_refused"
        proc = _evaluate(tmp_path, [*overrides, f"hydra.run.dir={out_bad}"])
        text = proc.stdout + proc.stderr
        assert proc.returncode == 1, text[-3000:]
        for needle in needles:
            assert needle in text, (needle, text[-3000:])
        assert "Traceback" not in text
        assert not out_bad.exists()  # no output directory left behind

    step2 = run / "checkpoints" / "sft" / "step_00000002"
    tensors = step2 / "tensors.safetensors"
    original = tensors.read_bytes()
    tensors.write_bytes(bytes(len(original)))  # zeroed, same size
    refused([f"checkpoint={step2}"], f"checkpoint file {tensors} is altered")
    tensors.write_bytes(original[: len(original) // 2])
    refused([f"checkpoint={run}"], f"checkpoint file {tensors} is truncated")
    tensors.write_bytes(original)
    refused([f"checkpoint={run}", "eval.max_new_tokens=4096"], "policy.model.max_seq_len", "eval.max_new_tokens (4096)")

    help_text = _evaluate(tmp_path, ["--help"]).stdout
    assert "checkpoint:" in help_text and "eval:" in help_text
    assert "data_plane" not in help_text and "algorithm" not in help_text
