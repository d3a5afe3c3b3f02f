"""Training utilities: atomic checkpoints, RNG capture/restore, metrics log, plots."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from nemo_dp.models.model import ModelConfig, TinyCausalLM
from nemo_dp.utils.checkpoint import (
    checkpoint_dir_for_step,
    latest_checkpoint,
    load_training_checkpoint,
    save_training_checkpoint,
)
from nemo_dp.utils.metrics import MetricsLogger, read_metrics
from nemo_dp.utils.plotting import plot_training_curves
from nemo_dp.utils.seeding import capture_rng_state, restore_rng_state, set_seed


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_set_seed_and_rng_round_trip() -> None:
    set_seed(5)
    a = _draws()
    set_seed(5)
    assert _draws() == a
    state = capture_rng_state()
    b = _draws()
    _draws()
    restore_rng_state(state)
    assert _draws() == b
    with pytest.raises(KeyError, match="snapshot lacks 'numpy'"):
        restore_rng_state({"python": state["python"], "torch": state["torch"]})


def test_checkpoint_round_trip_and_latest(tmp_path: Path) -> None:
    model = TinyCausalLM(ModelConfig(vocab_size=9, n_layers=1, d_model=8, n_heads=2, max_seq_len=4), seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3, dtype=torch.long)).sum().backward()
    opt.step()
    set_seed(3)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": capture_rng_state(), "step": 2,
             "loader": {"epoch": 1, "cursor": 4}}
    assert latest_checkpoint(tmp_path) is None
    save_training_checkpoint(checkpoint_dir_for_step(tmp_path, 2), state)
    after_save = _draws()
    save_training_checkpoint(checkpoint_dir_for_step(tmp_path, 10), {"step": 10})
    (tmp_path / "step_00000099.tmp-abc").mkdir()  # a killed writer's leftovers are ignored
    (tmp_path / "step_00000050").mkdir()  # no manifest: not a committed checkpoint
    assert latest_checkpoint(tmp_path) == checkpoint_dir_for_step(tmp_path, 10)
    loaded = load_training_checkpoint(checkpoint_dir_for_step(tmp_path, 2))
    assert loaded["step"] == 2 and loaded["loader"] == {"epoch": 1, "cursor": 4}
    for k, v in model.state_dict().items():
        assert torch.equal(loaded["model"][k], v)
    assert loaded["optimizer"]["state"][0]["exp_avg"].equal(opt.state_dict()["state"][0]["exp_avg"])
    restore_rng_state(loaded["rng"])
    assert _draws() == after_save


def test_failed_save_leaves_previous_checkpoint(tmp_path: Path) -> None:
    target = checkpoint_dir_for_step(tmp_path, 1)
    save_training_checkpoint(target, {"step": 1, "x": torch.arange(3)})

    class Unpicklable:
        def __reduce__(self) -> tuple:
            raise RuntimeError("boom while pickling")

    with pytest.raises(RuntimeError, match="boom while pickling"):
        save_training_checkpoint(target, {"step": 1, "bad": Unpicklable()})
    assert torch.equal(load_training_checkpoint(target)["x"], torch.arange(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no temp dir left
    with pytest.raises(TypeError, match="state must be a dict"):
        save_training_checkpoint(target, [1])  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        load_training_checkpoint(tmp_path / "missing")


def test_metrics_logger_and_truncate(tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    log = MetricsLogger(path)
    for step in range(1, 5):
        log.log(step, {"train/loss": torch.tensor(1.0 / step), "train/reward": np.float32(0.25), "phase": "grpo"})
    log.log(4, {"eval/accuracy": 0.5, "bad": float("nan")})
    recs = read_metrics(path)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 4]
    assert recs[1]["train/loss"] == 0.5 and recs[0]["train/reward"] == 0.25 and recs[4]["bad"] == "nan"
    json.loads(path.read_text().splitlines()[0])
    log.truncate_after(2)
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    with pytest.raises(ValueError, match="reserved key 'step'"):
        log.log(3, {"step": 1})
    with pytest.raises(TypeError, match="metric 'x' has type list"):
        log.log(3, {"x": [1]})
    path.write_text('{"step": 1}\nnot json\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2: invalid JSON"):
        read_metrics(path)


def test_plot_written(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLogger(path)
    for step in range(1, 11):
        log.log(step, {"train/loss": 1.0 / step, "train/reward": step / 10})
        if step % 5 == 0:
            log.log(step, {"eval/accuracy": step / 20})
    out = plot_training_curves(path, tmp_path / "plots" / "curves.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="holds no metrics records"):
        plot_training_curves(empty, tmp_path / "x.png")
