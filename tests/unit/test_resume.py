"""Resume resolution never starts over silently: every path it cannot resume from is refused.

Checkpoints are written through the real atomic commit with the real manifests, as the launcher
writes them (state file, format manifest, ``checkpoint_meta.json``, file manifest last).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from nemo_dp.training.resume import (
    CHECKPOINT_META_NAME,
    CheckpointMeta,
    CheckpointMismatchError,
    ResumeError,
    check_checkpoint_meta,
    model_shape_of,
    read_checkpoint_meta,
    resolve_init_from,
    resolve_resume,
    write_checkpoint_meta,
)
from nemo_dp.utils.checkpoint import write_training_state
from nemo_dp.utils.checkpoint_io import write_checkpoint_atomically
from nemo_dp.utils.checkpoint_io import write_manifest as write_format_manifest
from nemo_dp.utils.manifest import CheckpointCorruptError, write_manifest

SHAPE = {"d_model": 32, "max_seq_len": 16, "n_heads": 2, "n_layers": 1, "vocab_size": 20}


def _save(
    run_dir: Path,
    phase: str,
    step: int,
    *,
    algorithm: str | None = None,
    data_plane: str = "local",
    shape: dict[str, int] | None = None,
    meta: bool = True,
    run_id: str = "run-a",
) -> Path:
    algo = algorithm or ("sft" if phase in ("sft", "warm_start") else phase)

    def write(tmp: Path) -> None:
        write_training_state(tmp, {"policy": {"w": torch.zeros(3)}, "counters": {"step": step}})
        write_format_manifest(tmp, {"format": "nemo_dp.training_checkpoint", "format_version": 2})
        if meta:
            owner = {"algorithm": algo, "phase": phase, "data_plane": data_plane, "run_id": run_id}
            write_checkpoint_meta(tmp, CheckpointMeta(**owner, model_shape=dict(shape or SHAPE), step=step))
        write_manifest(tmp)

    return write_checkpoint_atomically(run_dir / "checkpoints" / phase / f"step_{step:08d}", write)


def _grpo(path: Path | str, **kw: object):
    args = {
        "phase_names": ["grpo"],
        "algorithm": "grpo",
        "data_plane": "local",
        "model_shape": SHAPE,
    }
    args.update(kw)
    return resolve_resume(path, **args)  # type: ignore[arg-type]


def _refused(path: Path, match: str, **kw: object) -> str:
    """The message of the ``ResumeError`` (matching ``match``) that :func:`_grpo` raises on ``path``."""
    with pytest.raises(ResumeError, match=match) as info:
        _grpo(path, **kw)
    return str(info.value)


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    return run


# --- every accepted form resolves, explicitly -----------------------------------------------


def test_run_dir_checkpoints_root_phase_root_and_step_dir_all_resolve(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    _save(run, "grpo", 10)
    newest = _save(run, "grpo", 20)
    root = run / "checkpoints"
    cases = {
        run: "run directory",
        root: "checkpoints root",
        root / "grpo": "phase root",
    }
    for given, kind in cases.items():
        plan = _grpo(given)
        assert (plan.source_kind, plan.checkpoint, plan.step, plan.phase) == (kind, newest, 20, "grpo")
        assert plan.checkpoints_root == root and plan.run_dir == run
        assert plan.meta is not None and plan.meta.run_id == "run-a"
        line = plan.describe()
        assert "\n" not in line and kind in line and "step 20" in line and str(newest) in line
    older = root / "grpo" / "step_00000010"
    plan = _grpo(older)
    assert (plan.source_kind, plan.checkpoint, plan.step, plan.run_dir) == ("step directory", older, 10, run)
    assert plan.start_checkpoint("grpo") == older


def test_temp_and_displaced_siblings_are_ignored(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    done = _save(run, "grpo", 5)
    (run / "checkpoints" / "grpo" / "step_00000009.tmp-abc").mkdir()
    (run / "checkpoints" / "grpo" / "step_00000007.old-abc").mkdir()
    assert _grpo(run).checkpoint == done


def test_warm_start_run_resumes_its_latest_phase(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    ws = _save(run, "warm_start", 100)
    phases = ["warm_start", "grpo"]
    plan = _grpo(run, phase_names=phases)
    assert (plan.phase, plan.phase_index, plan.checkpoint) == ("warm_start", 0, ws)
    assert plan.start_checkpoint("grpo") is None
    g = _save(run, "grpo", 3)
    plan = _grpo(run, phase_names=phases)
    assert (plan.phase, plan.phase_index, plan.checkpoint) == ("grpo", 1, g)
    assert "skipping finished phase(s) ['warm_start']" in plan.describe()


# --- a path with nothing to resume from is refused, saying what it found ---------------------


def test_missing_path_file_and_empty_dir(tmp_path: Path) -> None:
    _refused(tmp_path / "nope", "does not exist")
    (tmp_path / "empty").mkdir()
    _refused(tmp_path / "empty", "is an empty directory - nothing to resume from")
    state = _save(_run_dir(tmp_path), "grpo", 1) / "state.json"
    _refused(state, "is a file, not a checkpoint directory; pass its step directory")


def test_run_dir_without_checkpoints(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    assert "checkpointing.resume_from" in _refused(run, "is a run directory with no checkpoints")
    (run / "checkpoints").mkdir()
    _refused(run, "checkpoints root .* is empty: the run stopped before its first save")


def test_unrelated_dir_lists_what_it_found(tmp_path: Path) -> None:
    d = tmp_path / "misc"
    (d / "sub").mkdir(parents=True)
    (d / "notes.txt").write_text("x")
    _refused(d, r"holds no checkpoint \(found \['notes.txt', 'sub/'\]\)")


def test_step_dir_missing_its_state_file(tmp_path: Path) -> None:
    ckpt = _save(_run_dir(tmp_path), "grpo", 4)
    (ckpt / "state.json").unlink()
    _refused(ckpt, r"is missing \['state.json'\]; it is not a complete checkpoint")


def test_newest_incomplete_checkpoint_is_refused_not_skipped(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    older = _save(run, "grpo", 4)
    newest = _save(run, "grpo", 8)
    (newest / "state.json").unlink()
    message = _refused(run, "refusing to fall back silently")
    assert str(newest) in message
    assert f"checkpointing.resume_from={older}" in message
    assert _grpo(older).checkpoint == older


def test_sft_checkpoint_given_to_grpo_points_at_init_from(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    sft = _save(run, "sft", 50)
    for given in (run, run / "checkpoints", run / "checkpoints" / "sft", sft):
        message = _refused(given, r"holds checkpoints of phase\(s\) \['sft'\] only", phase_names=["warm_start", "grpo"])
        assert "policy.init_from=" in message
        assert "checkpointing.resume_from unset" in message


# --- metadata: refused on the driver, naming the differing keys ------------------------------


def test_model_shape_mismatch_names_the_keys(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    _save(run, "grpo", 2, shape={**SHAPE, "d_model": 64, "n_layers": 2})
    with pytest.raises(CheckpointMismatchError) as info:
        _grpo(run)
    assert info.value.differing == {"model_shape.d_model": (64, 32), "model_shape.n_layers": (2, 1)}
    msg = str(info.value)
    assert "policy.model.d_model" in msg and "policy.model.n_layers" in msg
    assert "checkpoint 64, this run 32" in msg


def test_data_plane_mismatch_is_named(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    _save(run, "grpo", 2, data_plane="tq")
    with pytest.raises(
        CheckpointMismatchError, match="data_plane: checkpoint 'tq', this run 'local'"
    ) as info:
        _grpo(run)
    assert list(info.value.differing) == ["data_plane"]


def test_algorithm_mismatch_inside_a_phase_root(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    _save(run, "grpo", 2, algorithm="ppo")
    with pytest.raises(CheckpointMismatchError, match="algorithm: checkpoint 'ppo', this run 'grpo'") as info:
        _grpo(run)
    assert "policy.init_from=" in str(info.value)


def test_checkpoint_without_metadata_resumes_with_a_note(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    _save(run, "grpo", 2, meta=False)
    plan = _grpo(run)
    assert plan.meta is None
    assert "model shape and data plane not checked" in plan.describe()


def test_corrupt_metadata_is_named(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    ckpt = _save(run, "grpo", 2, meta=False)
    (ckpt / CHECKPOINT_META_NAME).write_text("{not json")
    with pytest.raises(ResumeError, match=f"{CHECKPOINT_META_NAME}: checkpoint metadata is not valid JSON"):
        read_checkpoint_meta(ckpt)
    good = CheckpointMeta("grpo", "grpo", dict(SHAPE), "local", "r", 2).to_json()
    (ckpt / CHECKPOINT_META_NAME).write_text(json.dumps({**good, "step": "2"}))
    with pytest.raises(ResumeError, match="field 'step' must be a int"):
        read_checkpoint_meta(ckpt)


def test_check_checkpoint_meta_passes_on_equal_and_names_phase(tmp_path: Path) -> None:
    meta = CheckpointMeta("sft", "warm_start", dict(SHAPE), "tq", "r", 7)
    check_checkpoint_meta(
        meta, where=tmp_path, algorithm="sft", phase="warm_start", data_plane="tq", model_shape=SHAPE
    )
    with pytest.raises(CheckpointMismatchError) as info:
        check_checkpoint_meta(
            meta, where=tmp_path, algorithm="sft", phase="sft", data_plane="tq", model_shape=SHAPE
        )
    assert info.value.differing == {"phase": ("warm_start", "sft")}


# --- integrity: a damaged checkpoint is reported by path before Ray starts -------------------


def test_truncated_state_file_is_reported_by_path(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    ckpt = _save(run, "grpo", 2)
    state = ckpt / "tensors.safetensors"
    state.write_bytes(state.read_bytes()[:10])
    with pytest.raises(CheckpointCorruptError, match="truncated") as info:
        _grpo(run)
    assert info.value.path == state
    assert _grpo(run, verify_integrity=False).checkpoint == ckpt


class _Payload:
    """A pickle whose loading creates ``marker`` (what a malicious checkpoint file would run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def test_a_planted_pickle_is_refused_by_path_without_loading_it(tmp_path: Path) -> None:
    """A raw pickle, a ``.pkl`` name, or a ``torch.save`` archive (the ``tensors.pt`` of older
    local and ray data-plane checkpoints) anywhere in the step directory, with a file manifest
    rewritten to match: refused by path, nothing unpickled."""
    import pickle

    marker = tmp_path / "code_ran"
    plants = {
        "data_plane/dp0/tensors.pt": lambda p: torch.save({"x": _Payload(marker)}, p),
        "data_plane/ray_store/tensors.pt": lambda p: torch.save({"x": _Payload(marker)}, p),
        "data_plane/tq/state.bin": lambda p: p.write_bytes(pickle.dumps(_Payload(marker))),
        "data_plane/tq/tq/controller_state.pkl": lambda p: p.write_bytes(b"not even a pickle"),
    }
    for i, (rel, plant) in enumerate(plants.items()):
        run = _run_dir(tmp_path / f"r{i}")
        ckpt = _save(run, "grpo", 3)
        (ckpt / rel).parent.mkdir(parents=True, exist_ok=True)
        plant(ckpt / rel)
        write_manifest(ckpt)  # whoever can write the checkpoint can rewrite its file manifest
        assert f"{ckpt / rel} is a pickle" in _refused(run, "is a pickle")
    assert not marker.exists()


# --- policy.init_from ------------------------------------------------------------------------


def test_init_from_an_sft_run(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    _save(run, "sft", 10)
    newest = _save(run, "sft", 20)
    plan = resolve_init_from(run, model_shape=SHAPE)
    assert (plan.checkpoint, plan.weights, plan.phase, plan.step) == (newest, newest, "sft", 20)
    assert "policy.init_from=" in plan.describe() and "\n" not in plan.describe()
    (newest / "policy").mkdir()
    assert resolve_init_from(newest, model_shape=SHAPE, weights_subdir="policy").weights == newest / "policy"


def test_init_from_prefers_the_final_phase_and_refuses_ambiguity(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    _save(run, "warm_start", 100)
    g = _save(run, "grpo", 5)
    assert resolve_init_from(run / "checkpoints", model_shape=SHAPE).checkpoint == g
    _save(run, "ppo", 5)
    with pytest.raises(ResumeError, match=r"several phases \['grpo', 'ppo'\]; pass one phase root"):
        resolve_init_from(run, model_shape=SHAPE)
    assert resolve_init_from(run / "checkpoints" / "warm_start", model_shape=SHAPE).phase == "warm_start"


def test_init_from_refuses_other_shapes_missing_weights_and_empty_dirs(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    ckpt = _save(run, "sft", 3, shape={**SHAPE, "max_seq_len": 64})
    with pytest.raises(CheckpointMismatchError, match="policy.init_from: .*policy.model.max_seq_len") as info:
        resolve_init_from(run, model_shape=SHAPE)
    assert info.value.differing == {"model_shape.max_seq_len": (64, 16)}
    with pytest.raises(ResumeError, match="has no policy weights directory 'policy'"):
        resolve_init_from(ckpt, model_shape={**SHAPE, "max_seq_len": 64}, weights_subdir="policy")
    (tmp_path / "e").mkdir()
    with pytest.raises(ResumeError, match="policy.init_from: .* is an empty directory"):
        resolve_init_from(tmp_path / "e", model_shape=SHAPE)


# --- model shape of a config node ------------------------------------------------------------


@dataclass
class _Model:
    n_layers: int = 1
    d_model: int = 32
    dropout: float = 0.0
    tie: bool = True


def test_model_shape_of_dictconfig_and_dataclass() -> None:
    node = OmegaConf.create({"n_layers": 1, "d_model": 32, "n_heads": 2, "max_seq_len": 16, "dropout": 0.1})
    assert model_shape_of(node, vocab_size=20) == SHAPE
    assert model_shape_of(_Model()) == {"d_model": 32, "n_layers": 1}


def test_settings_a_resume_must_keep_are_recorded_and_compared(tmp_path: Path) -> None:
    from nemo_dp.training.resume import run_settings

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    hf_async = OmegaConf.create(
        {"policy": {"kind": "hf", "dp_size": 2, "model_name_or_path": str(model_dir)},
         "algorithm": {"name": "grpo", "async_rollout": {"enabled": True}}}
    )  # fmt: skip
    settings = run_settings(hf_async)
    assert settings == {"policy.dp_size": 2, "algorithm.async_rollout.enabled": True, "architecture": "LlamaForCausalLM"}
    assert run_settings(OmegaConf.create({"policy": {"kind": "tiny", "dp_size": 1}, "algorithm": {"name": "sft"}})) == {
        "policy.dp_size": 1,
        "architecture": "tiny",
    }
    meta = CheckpointMeta("grpo", "grpo", dict(SHAPE), "tq", "r", 2, settings=dict(settings))
    write_checkpoint_meta(tmp_path, meta)
    assert read_checkpoint_meta(tmp_path) == meta
    other = {"policy.dp_size": 1, "algorithm.async_rollout.enabled": False, "architecture": "Qwen2ForCausalLM"}
    with pytest.raises(CheckpointMismatchError) as info:
        check_checkpoint_meta(
            meta, where=tmp_path, algorithm="grpo", phase="grpo", data_plane="tq", model_shape=SHAPE, settings=other
        )
    assert sorted(info.value.differing) == ["algorithm.async_rollout.enabled", "architecture", "policy.dp_size"]
    text = str(info.value)
    assert "algorithm.async_rollout.enabled: checkpoint True, this run False" in text
    assert "architecture: checkpoint 'LlamaForCausalLM', this run 'Qwen2ForCausalLM'" in text
    # A checkpoint written before settings were recorded is not refused for them.
    old = CheckpointMeta("grpo", "grpo", dict(SHAPE), "tq", "r", 2)
    check_checkpoint_meta(old, where=tmp_path, algorithm="grpo", phase="grpo", data_plane="tq", model_shape=SHAPE, settings=other)
