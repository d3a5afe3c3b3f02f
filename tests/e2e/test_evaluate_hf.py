"""``launchers/evaluate.py`` on a ``policy=hf`` checkpoint (the offline tiny Llama, SFT).

One short SFT run trains the tiny HuggingFace Llama that ``conf/policy/hf.yaml`` builds on first
use, printing every held-out example of its final validation; the evaluation of that checkpoint,
in a separate process, must reproduce the trainer's own responses problem for problem and its
``val_accuracy``. Run from another directory (where the run's relative tokenizer path does not
resolve) it gives the same predictions, the checkpoint's ``policy/`` holding the tokenizer; a
tokenizer named in ``run_overrides`` takes precedence.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from tests.e2e.conftest import LaunchFn
from tests.e2e.test_evaluate import _evaluate, _ok, _predictions, _printed, _trainer_accuracy

pytestmark = pytest.mark.timeout(600)

VAL_SAMPLES = 8
#: ``[SFT]   <prompt><response repr> (expected <answer repr>)``: one held-out example line.
EXAMPLE = re.compile(r"^\[SFT\]\s+(?P<prompt>.*?)(?P<resp>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\") \(expected (?P<ans>'[^']*')\)$")


def _trainer_examples(stdout: str) -> list[tuple[str, str, str]]:
    rows = [m for m in (EXAMPLE.match(line) for line in stdout.splitlines()) if m is not None]
    return [(m["prompt"], ast.literal_eval(m["resp"]), ast.literal_eval(m["ans"])) for m in rows]


def test_evaluate_hf_sft_checkpoint(launch: LaunchFn, tmp_path: Path) -> None:
    run = tmp_path / "hf_run"
    proc = launch(
        ["recipe=sft_arith", "policy=hf", "data_plane=disabled", "algorithm.max_steps=2", "algorithm.val_period=0",
         "algorithm.num_train_samples=32", f"algorithm.val_samples={VAL_SAMPLES}", "policy.train_global_batch_size=8",
         "policy.train_micro_batch_size=4", "policy.logprob_batch_size=8", "policy.optimizer.warmup_steps=0",
         f"logger.num_val_examples_to_print={VAL_SAMPLES}", "logger.progress_bar=false", "logger.plot=false",
         f"hydra.run.dir={run}"]
    )  # fmt: skip
    _ok(proc)
    trained = _trainer_examples(proc.stdout)
    assert len(trained) == VAL_SAMPLES, proc.stdout  # one validation, at the last step
    exported = run / "checkpoints" / "sft" / "step_00000002" / "policy"
    assert (exported / "config.json").is_file() and (exported / "model.safetensors").is_file()

    out = tmp_path / "eval_hf"
    proc = _evaluate(tmp_path, [f"checkpoint={run / 'checkpoints'}", f"hydra.run.dir={out}"])
    _ok(proc)
    phase, step, acc, n = _printed(proc)
    assert (phase, step, n) == ("sft", 2, VAL_SAMPLES)
    rows = _predictions(out / "predictions.jsonl")
    # The trainer's final validation ran on this checkpoint's weights: same problems, same
    # greedy responses, same accuracy.
    assert [(r["prompt"], r["response"], r["answer"]) for r in rows] == trained
    assert f"{acc:.3f}" == f"{_trainer_accuracy(run, 'sft'):.3f}"
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["reward"] == "exact" and summary["checkpoint"].endswith("step_00000002")

    # The run config names its model and tokenizer relative to where it trained (tmp_path),
    # but the checkpoint's policy/ directory holds both: it evaluates from any directory.
    assert (exported / "tokenizer.json").is_file() and (exported / "tokenizer_config.json").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out2 = tmp_path / "eval_hf_elsewhere"
    proc = _evaluate(elsewhere, [f"checkpoint={run / 'checkpoints'}", f"hydra.run.dir={out2}"])
    _ok(proc)
    assert _printed(proc)[2] == acc
    assert _predictions(out2 / "predictions.jsonl") == rows
    # run_overrides naming the tokenizer take precedence over the checkpoint's copy: a path
    # that does not resolve from here fails naming the run config and run_overrides.
    out_bad = tmp_path / "eval_hf_bad"
    proc = _evaluate(
        elsewhere,
        [
            f"checkpoint={run / 'checkpoints'}",
            "run_overrides=['policy.tokenizer_name_or_path=.cache/nemo_dp/tiny-llama']",
            f"hydra.run.dir={out_bad}",
        ],
    )
    assert proc.returncode != 0 and "resolved_config.yaml" in proc.stderr and "run_overrides" in proc.stderr
    assert not (out_bad / "predictions.jsonl").exists()
