"""A user's own dataset and reward functions through the launcher.

* GRPO on a parquet file with renamed columns (``question`` / ``solution`` plus an extra
  ``level`` column) and a two-reward list (the built-in ``format`` regex plus a correctness
  function loaded from a file path, TRL's signature) trains identically on the legacy trainer
  (rewards on the driver) and on TransferQueue (rewards in the workers): every metric,
  the per-reward means included, is equal step for step; the asynchronous trainer at
  staleness 0 (rewards in its rollout workers) logs the same losses and per-reward means.
* A reward function that raises at step 2 ends the run as a failure naming the function, the
  step and the sample, after ``summary.json`` records it; the step-1 checkpoint still loads.
* A reward function whose signature cannot take the dataset's columns is refused before Ray,
  with no run directory left.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from nemo_dp.data.arithmetic import ArithmeticTask
from tests.e2e.conftest import TINY, assert_launch_ok, run_launch

pytestmark = pytest.mark.timeout(600)

REWARDS_PY = '''
calls = {"n": 0}

def correct(completions, solution, level, **kwargs):
    """1 for the exact answer, 0.25 when the answer's last digit appears; None on level-0 rows."""
    out = []
    for c, s, lv in zip(completions, solution, level):
        if lv == 0:
            out.append(None)
        else:
            out.append(1.0 if c.strip() == s else (0.25 if s[-1] in c else 0.0))
    return out

def fails_at_second_call(completions, **kwargs):
    calls["n"] += 1
    if calls["n"] == 2:
        raise KeyError("no such answer")
    return [0.0] * len(completions)

def takes_difficulty(completions, difficulty):
    return [0.0] * len(completions)
'''

BASE: tuple[str, ...] = (
    "~recipe",
    "algorithm=grpo",
    *TINY,
    "env.digits=1",
    "seed=5",
    "algorithm.warm_start.enabled=false",
    "algorithm.dynamic_sampling.enabled=false",
    "algorithm.num_prompts_per_step=4",
    "algorithm.num_generations_per_prompt=4",
    "algorithm.max_steps=3",
    "algorithm.val_samples=8",
    "algorithm.val_period=3",
    "checkpointing.enabled=false",
    "env.columns.prompt=question",
    "env.columns.answer=solution",
    "logger.plot=false",
    "logger.progress_bar=false",
)

#: The runs of the parity test: legacy, synchronous TransferQueue, asynchronous at staleness 0.
ASYNC_AND_SYNC_RUNS: dict[str, tuple[str, ...]] = {
    "disabled": ("data_plane=disabled",),
    "tq": ("data_plane=tq",),
    "async_tq": ("data_plane=tq", "algorithm.async_rollout.enabled=true", "algorithm.async_rollout.max_staleness=0"),
}

#: Metrics that differ between the two runs by nature (wall times, store traffic).
_UNCOMPARED_PREFIXES = ("time/", "data_plane/", "dp/")


def _data(tmp_path: Path) -> tuple[Path, Path, Path]:
    task = ArithmeticTask(1, ("+",), 0)

    def table(problems: list, path: Path) -> Path:
        rows = {
            "question": [p.prompt for p in problems],
            "solution": [p.answer for p in problems],
            "level": [len(p.answer) for p in problems],
        }
        datasets.Dataset.from_dict(rows).to_parquet(str(path))
        return path

    train = table(task.train_problems(48), tmp_path / "train.parquet")
    val = table(task.eval_problems(8), tmp_path / "val.parquet")
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text(REWARDS_PY)
    return train, val, rewards


def _records(run: Path) -> list[dict]:
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out.append({k: v for k, v in rec.items() if not k.startswith(_UNCOMPARED_PREFIXES) and "wall" not in k})
    return out


def test_parquet_with_renamed_columns_and_two_rewards_legacy_equals_tq(tmp_path: Path) -> None:
    train, val, rewards = _data(tmp_path)
    overrides = [
        *BASE,
        f"env.rl_data={train}",
        f"env.val_data={val}",
        f'env.rewards=[{{fn: format, weight: 0.5, pattern: "[0-9]+"}}, {{fn: "{rewards}:correct", weight: 1.0}}]',
    ]
    runs = {}
    for name, extra in ASYNC_AND_SYNC_RUNS.items():
        run = tmp_path / name
        proc = run_launch([*overrides, *extra, f"hydra.run.dir={run}"], tmp_path, timeout=300)
        assert_launch_ok(proc)
        assert f"grpo train: 48 rows from {train} (env.rl_data)" in proc.stdout
        runs[name] = _records(run)
    legacy, tq = runs["disabled"], runs["tq"]
    # The asynchronous trainer at staleness 0 computes the rewards in its rollout workers and
    # logs the same per-reward means (its records add async/* metrics, so compare these keys).
    shared = ("step", "loss", "reward_mean", "reward/format", "reward/correct", "val_accuracy")
    assert [{k: r.get(k) for k in shared} for r in runs["async_tq"]] == [{k: r.get(k) for k in shared} for r in tq]
    assert [r["step"] for r in legacy] == [0, 1, 2, 3]  # held-out score before the first step too
    assert legacy == tq
    steps = legacy[1:]
    assert all({"reward/format", "reward/correct"} <= set(r) for r in steps)
    # The rewards were mixed, so the comparison covers real training, not all-zero advantages.
    assert any(r["advantage_abs_mean"] > 0 for r in steps)
    assert any(0 < r["reward/correct"] or 0 < r["reward/format"] for r in steps)


def test_a_reward_that_raises_at_step_2_fails_the_run_after_recording_it(tmp_path: Path) -> None:
    from nemo_dp.training.checkpoint_discovery import latest_checkpoint
    from nemo_dp.utils.checkpoint import load_training_checkpoint

    train, _, rewards = _data(tmp_path)
    run = tmp_path / "run"
    proc = run_launch(
        [
            *BASE,
            "data_plane=disabled",
            "algorithm.val_period=0",
            "algorithm.val_at_start=false",
            "checkpointing.enabled=true",
            "checkpointing.save_period=1",
            f"env.rl_data={train}",
            f"env.reward={rewards}:fails_at_second_call",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
        timeout=300,
    )
    assert proc.returncode != 0
    expected = (
        f"reward '{rewards}:fails_at_second_call' at step 2: raised KeyError: 'no such answer' "
        "(scoring 16 samples; sample 0's prompt: "
    )
    assert expected in proc.stderr, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"]["type"] == "RewardError"
    assert summary["error"]["message"].startswith(expected)
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    ckpt = latest_checkpoint(run / "checkpoints" / "grpo")
    assert ckpt is not None and ckpt.name.endswith("1")
    assert load_training_checkpoint(ckpt)["policy"]["weights"]["model"]


def test_a_reward_that_cannot_take_the_columns_is_refused_before_ray(tmp_path: Path) -> None:
    train, _, rewards = _data(tmp_path)
    run, ray_dir = tmp_path / "run", tmp_path / "ray"
    proc = run_launch(
        [*BASE, f"env.rl_data={train}", f"env.reward={rewards}:takes_difficulty", f"hydra.run.dir={run}",
         f"cluster.temp_dir={ray_dir}"],
        tmp_path,
        timeout=200,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert (
        f"env.reward: '{rewards}:takes_difficulty' requires ['difficulty'], which no dataset column gives "
        "(columns: ['level', 'solution'], plus completions and prompts) [scoring env.rl_data]"
    ) in proc.stderr, proc.stderr[-3000:]
    assert not run.exists() and not ray_dir.exists()
