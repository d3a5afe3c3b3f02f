"""The launcher runs asynchronous GRPO from one Hydra choice, and refuses it without TransferQueue.

``algorithm.async_rollout.enabled=true`` with ``data_plane=tq`` must select
``grpo_train_async`` through the factory (the launcher has no branch of its own), train, and log
the asynchronous metrics; with ``data_plane=disabled`` the launcher must fail at validation,
before Ray starts, naming both keys.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import TINY, LaunchFn


@pytest.mark.timeout(300)
def test_launcher_trains_async_grpo(launch: LaunchFn, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = launch(
        [
            "~recipe", "data_plane=tq", *TINY,
            "algorithm.async_rollout.enabled=true",
            "algorithm.warm_start.enabled=false",
            "algorithm.num_prompts_per_step=4",
            "algorithm.num_generations_per_prompt=2",
            "algorithm.num_train_prompts=32",
            "algorithm.max_steps=3",
            "algorithm.val_period=3",
            "algorithm.val_at_start=false",
            "policy.dp_size=1",
            f"hydra.run.dir={run}",
        ],
        timeout=280,
    )
    assert proc.returncode == 0, f"STDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-4000:]}"
    assert "Running asynchronous GRPO training (data plane: transfer_queue)" in proc.stdout
    assert "trainer nemo_dp.algorithms.grpo_async:grpo_train_async" in proc.stdout
    from nemo_dp.algorithms.async_ledger import read_ledger
    from nemo_dp.utils.metrics import read_metrics

    records = {int(r["step"]): r for r in read_metrics(run / "metrics.jsonl")}
    assert sorted(records) == [1, 2, 3]
    for step, rec in records.items():
        assert rec["async/generated_samples"] >= 8 * step
        assert rec["consumed_samples"] == 8 * step
        assert 0.0 <= rec["async/trainer_idle_frac"] <= 1.0 and 0.0 <= rec["async/rollout_idle_frac"] <= 1.0
        assert rec["async/staleness_hist/0"] + rec["async/staleness_hist/1"] == 8.0
    assert "val_accuracy" in records[3]
    assert [r["step"] for r in read_ledger(run / "async_ledger.jsonl")] == [1, 2, 3]


@pytest.mark.timeout(120)
def test_launcher_refuses_async_without_transfer_queue(launch: LaunchFn, tmp_path: Path) -> None:
    proc = launch(["~recipe", "data_plane=disabled", "algorithm.async_rollout.enabled=true",
                   f"hydra.run.dir={tmp_path / 'run'}"], timeout=100)
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    assert "algorithm.async_rollout.enabled=true needs data_plane=tq" in err
    assert "Running asynchronous" not in err and "ray.init" not in proc.stdout
