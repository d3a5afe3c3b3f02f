"""Training utilities: atomic checkpoints, RNG capture/restore, metrics log, plots."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from nemo_dp.models.tiny.model import ModelConfig, TinyCausalLM
from nemo_dp.training.checkpoint_discovery import latest_checkpoint
from nemo_dp.utils.checkpoint import (
    checkpoint_dir_for_step,
    load_training_checkpoint,
    save_training_checkpoint,
)
from nemo_dp.utils.metrics import MetricsLogger, read_metrics
from nemo_dp.utils.plotting import plot_training_curves
from nemo_dp.utils.seeding import capture_rng_state, restore_rng_state


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_rng_round_trip() -> None:
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

    class Unstorable:
        pass

    # A value that cannot be stored without code is refused before anything is written ...
    with pytest.raises(TypeError, match=r"state\['bad'\]: value of type Unstorable cannot be checkpointed"):
        save_training_checkpoint(target, {"step": 1, "bad": Unstorable()})
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]

    # ... and a write that fails after its files are on disk leaves the previous one intact.
    def fail(tmp: Path) -> None:
        assert (tmp / "state.json").is_file()
        raise RuntimeError("boom while writing")

    with pytest.raises(RuntimeError, match="boom while writing"):
        save_training_checkpoint(target, {"step": 2, "x": torch.arange(5)}, finalize=fail)
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


# --- the run layer (nemo_dp.training) ------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def _compose(*overrides: str):  # type: ignore[no-untyped-def]
    from tests.compose import compose_run

    return compose_run(["~recipe", *overrides])


def test_plan_phases_adds_the_warm_start_only_when_enabled() -> None:
    from nemo_dp.training import plan_phases

    with_ws = plan_phases(_compose("algorithm=grpo", "algorithm.warm_start.enabled=true"))
    assert [(p.name, p.out_subdir) for p in with_ws] == [("warm_start", "warm_start"), ("grpo", "")]
    assert with_ws[0].cfg.algorithm.name == "sft" and with_ws[1].cfg.algorithm.name == "grpo"
    assert [p.name for p in plan_phases(_compose("algorithm=grpo", "algorithm.warm_start.enabled=false"))] == ["grpo"]
    assert [p.name for p in plan_phases(_compose("algorithm=sft"))] == ["sft"]


def test_start_states_resume_the_latest_phase_with_a_checkpoint(tmp_path: Path) -> None:
    from nemo_dp.training import Checkpointer, load_start_state, plan_phases

    phases = plan_phases(_compose("algorithm=grpo", "algorithm.warm_start.enabled=true"))
    assert load_start_state(None) is None
    ckpt = Checkpointer(tmp_path / "warm_start", enabled=True, save_period=1, keep_last=2)
    for step in (1, 2, 3):
        ckpt.save(step, lambda: {"counters": {"step": step}})
    assert sorted(p.name for p in (tmp_path / "warm_start").iterdir()) == ["step_00000002", "step_00000003"]
    states = [load_start_state(tmp_path / p.name) for p in phases]
    assert states[1] is None and states[0] is not None
    assert states[0]["counters"] == {"step": 3}
    assert states[0]["checkpoint_path"].endswith("step_00000003")


def test_a_resume_that_finds_nothing_fails_naming_the_key(tmp_path: Path) -> None:
    from nemo_dp.config import validate_config
    from nemo_dp.training import run_phases

    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = _compose("algorithm=sft", "data_plane=disabled", f"checkpointing.resume_from={empty}")
    with pytest.raises(ValueError, match="checkpointing.resume_from: .* is an empty directory - nothing to resume"):
        run_phases(cfg, validate_config(cfg), tmp_path / "run")
    assert not (tmp_path / "run" / "resolved_config.yaml").exists()
    assert not (tmp_path / "run" / "run.json").exists()


def test_run_phase_hands_the_trainer_one_context(tmp_path: Path) -> None:
    """A recording trainer stands in for a real one (isolates what run_phase builds)."""
    from nemo_dp.algorithms.context import TrainContext, TrainHooks
    from nemo_dp.training import Checkpointer, RunLogger, main_phase, make_tokenizer, run_phase

    cfg = _compose("algorithm=sft", "algorithm.val_samples=5")
    phase = main_phase(cfg)
    seen: list[TrainContext] = []

    def trainer(ctx: TrainContext) -> dict:
        seen.append(ctx)
        return {"step": 0, "val_accuracy": 0.25}

    hooks = TrainHooks()
    logger = RunLogger(tmp_path, metrics_file="m.jsonl", plot_file="p.png", plot=False, progress_bar=False, label="x")
    ckpt = Checkpointer(tmp_path / "ckpt", enabled=False, save_period=0, keep_last=1)
    policy = object()
    result = run_phase(phase, policy, tokenizer=make_tokenizer(cfg), logger=logger, checkpointer=ckpt,
                       hooks=hooks, trainer=trainer)
    (ctx,) = seen
    assert ctx.policy is policy and ctx.cfg is phase.cfg and ctx.logger is logger and ctx.checkpointer is ckpt
    assert ctx.hooks is hooks and ctx.start_state is None and len(ctx.val_problems) == 5
    assert ctx.train_loader.batch_size == int(cfg.policy.train_global_batch_size)
    assert result["val_accuracy"] == 0.25 and result["num_val_problems"] == 5 and result["wall_time_s"] >= 0


def test_input_builders_batch_by_algorithm() -> None:
    from nemo_dp.algorithms.inputs import build_rl_inputs, build_sft_inputs
    from nemo_dp.training import build_inputs

    sft = _compose("algorithm=sft", "policy.train_global_batch_size=8")
    rl = _compose("algorithm=grpo", "algorithm.num_prompts_per_step=3")
    assert build_sft_inputs(sft).train_loader.batch_size == 8
    assert build_rl_inputs(rl).train_loader.batch_size == 3
    assert build_inputs(rl).train_loader.batch_size == 3
    rl_batch = build_rl_inputs(rl).train_loader.next_batch()
    assert all(hasattr(p, "answer") for p in rl_batch)


def test_final_accuracy_is_the_last_phase_and_the_launcher_returns_it(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``run_phases`` is replaced by a recorder (isolates the launcher's return path)."""
    import importlib.util

    import nemo_dp.training as training
    from nemo_dp.training import final_accuracy

    summary = {"final_phase": "grpo", "phases": {"warm_start": {"val_accuracy": 0.1}, "grpo": {"val_accuracy": 0.4}}}
    assert final_accuracy(summary) == 0.4
    with pytest.raises(ValueError, match="'grpo' recorded no held-out accuracy"):
        final_accuracy({"final_phase": "grpo", "phases": {"grpo": {"val_accuracy": None}}})

    calls = []

    def fake_run_phases(cfg, validated, run_dir, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(run_dir)
        return summary

    monkeypatch.setattr(training, "run_phases", fake_run_phases)
    spec = importlib.util.spec_from_file_location("launch_under_test", REPO / "launchers" / "launch.py")
    assert spec is not None and spec.loader is not None
    launch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch)
    acc = launch.run(_compose("algorithm=sft", "data_plane=disabled"), tmp_path)
    assert acc == 0.4 and isinstance(acc, float) and calls == [tmp_path]


def test_checkpoint_hook_runs_after_the_state_and_before_the_manifest(tmp_path: Path) -> None:
    from nemo_dp.algorithms.context import TrainHooks
    from nemo_dp.algorithms.sft_sync import save_sft_checkpoint
    from nemo_dp.training import Checkpointer, load_start_state

    seen: dict[str, object] = {}

    def staged(step: int, tmp_dir: Path) -> None:
        seen.update(step=step, state=(tmp_dir / "state.json").is_file(), dp=(tmp_dir / "data_plane" / "x").is_file(),
                    manifest=(tmp_dir / "manifest.json").exists(), final=(tmp_path / "step_00000002").exists())

    def save_dp(d: Path) -> None:
        d.mkdir(parents=True)
        (d / "x").write_text("1")

    ckpt = Checkpointer(tmp_path, enabled=True, save_period=1, keep_last=3)
    save_sft_checkpoint(ckpt, 2, {"counters": {"step": 2}}, save_dp, hooks=TrainHooks(on_checkpoint_staged=staged))
    assert seen == {"step": 2, "state": True, "dp": True, "manifest": False, "final": False}
    assert load_start_state(tmp_path)["counters"] == {"step": 2}


def test_checkpointer_finalize_records_meta_and_a_manifest_verified_on_load(tmp_path: Path) -> None:
    from nemo_dp.training.checkpointer import Checkpointer, checkpoint_finalizer
    from nemo_dp.training.resume import read_checkpoint_meta
    from nemo_dp.utils.manifest import CheckpointCorruptError

    fin = checkpoint_finalizer(algorithm="sft", phase="sft", model_shape={"d_model": 8}, data_plane="local", run_id="r1")
    ckpt = Checkpointer(tmp_path, enabled=True, save_period=1, keep_last=2, finalize=fin)
    path = ckpt.save(3, lambda: {"counters": {"step": 3}, "w": torch.arange(64, dtype=torch.float32)})
    meta = read_checkpoint_meta(path)
    assert meta is not None and (meta.algorithm, meta.phase, meta.data_plane, meta.run_id, meta.step) == (
        "sft", "sft", "local", "r1", 3)
    manifest = json.loads((path / "file_manifest.json").read_text())
    assert {"checkpoint_meta.json", "manifest.json", "state.json", "tensors.safetensors"} <= set(manifest["files"])
    assert torch.equal(load_training_checkpoint(path)["w"], torch.arange(64, dtype=torch.float32))
    tensors = path / "tensors.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:-10])
    with pytest.raises(CheckpointCorruptError, match=f"checkpoint file {tensors} is truncated"):
        load_training_checkpoint(path)


def test_sft_sync_checkpoints_are_code_free_and_finalized(tmp_path: Path) -> None:
    from nemo_dp.algorithms.sft_sync import save_sft_checkpoint
    from nemo_dp.training.checkpointer import Checkpointer, checkpoint_finalizer
    from nemo_dp.utils.manifest import verify_manifest

    fin = checkpoint_finalizer(algorithm="sft", phase="sft", model_shape={}, data_plane="local", run_id="r")
    ckpt = Checkpointer(tmp_path, enabled=True, save_period=1, keep_last=3, finalize=fin)
    state = {"counters": {"step": 1}, "policy": {"weights": {"pretrained": {"config.json": b"{}"}}}}
    path = save_sft_checkpoint(ckpt, 1, state, lambda d: d.mkdir())
    assert not (path / "state.pt").exists() and (path / "state.json").is_file()
    assert (path / "policy" / "config.json").read_bytes() == b"{}"
    assert (path / "checkpoint_meta.json").is_file() and verify_manifest(path).files >= 4
    assert load_training_checkpoint(path)["counters"] == {"step": 1}


def test_stale_temp_checkpoint_dirs_are_removed_and_nothing_else(tmp_path: Path) -> None:
    from nemo_dp.training.checkpointer import remove_stale_temp_dirs

    root = tmp_path / "checkpoints"
    keep = [root / "sft" / "step_00000003", root / "sft" / "step_00000002.old-0a1b", root / "grpo" / "step_00000001"]
    stale = [root / "sft" / "step_00000004.tmp-0123abcd", root / "grpo" / "step_00000002.tmp-ff"]
    for d in keep + stale:
        d.mkdir(parents=True)
        (d / "state.json").write_text("{}")
    (root / "sft" / "notes.tmp-1").write_text("a file, not a checkpoint write")
    assert remove_stale_temp_dirs(root) == sorted(stale, key=lambda p: (p.parent.name, p.name))
    assert all(d.is_dir() for d in keep) and not any(d.exists() for d in stale)
    assert (root / "sft" / "notes.tmp-1").is_file()
    assert remove_stale_temp_dirs(tmp_path / "missing") == []
