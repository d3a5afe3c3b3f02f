"""Training checkpoints users can take away, loaded without unpickling code: typed JSON +
safetensors round trips exactly, ``<checkpoint>/policy`` is a model directory
(``AutoModelForCausalLM.from_pretrained`` / the tiny loader), resume from a checkpoint equals
the uninterrupted run, bad states are refused before anything is written, and a version-1
checkpoint (a pickled ``state.pt``) is refused without being read."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from nemo_dp.algorithms.loss_functions import NLLLoss
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.models.builders import build_tokenizer, load_pretrained_model
from nemo_dp.models.hf.make_tiny import ensure_tiny_checkpoint
from nemo_dp.models.policy.worker import PolicyWorker
from nemo_dp.training.checkpoint_discovery import latest_checkpoint
from nemo_dp.utils import checkpoint as ckpt
from nemo_dp.utils.checkpoint import (
    checkpoint_dir_for_step,
    load_training_checkpoint,
    save_training_checkpoint,
)
from nemo_dp.utils.checkpoint_io import write_manifest
from nemo_dp.utils.seeding import capture_rng_state, restore_rng_state

def policy_base(**optimizer: Any) -> dict[str, Any]:
    """A new one-rank policy config without its model keys (the in-process worker tests' base).

    Args:
        **optimizer: ``optimizer`` entries that replace the defaults.
    """
    return {
        "dp_size": 1, "torch_threads": 1,
        "optimizer": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.01, "beta1": 0.9, "beta2": 0.99, "eps": 1e-8,
                      "warmup_steps": 1, "schedule": "cosine", "min_lr_ratio": 0.1, **optimizer},
        "generation": {"max_new_tokens": 4, "temperature": 1.0},
        "train_global_batch_size": 4, "train_micro_batch_size": 2, "logprob_batch_size": 4,
        "generation_batch_size": 4, "max_grad_norm": 1.0,
        "dynamic_batching": {"enabled": False}, "sequence_packing": {"enabled": False},
    }


def tiny_policy(**optimizer: Any) -> dict[str, Any]:
    """``policy_base(**optimizer)`` with a 1-layer tiny model."""
    model = {"n_layers": 1, "d_model": 16, "n_heads": 2, "max_seq_len": 24, "dropout": 0.0}
    return {**policy_base(**optimizer), "kind": "tiny", "model": model}


def policy_worker(cfg: dict[str, Any]) -> tuple[PolicyWorker, Any]:
    """A rank-0 ``PolicyWorker`` of ``cfg`` (seed 1) and its tokenizer."""
    tok = build_tokenizer(cfg)
    w = PolicyWorker(rank=0, world_size=1, policy_cfg=cfg, vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                     eos_id=tok.eos_id, seed=1)
    return w, tok


BASE = policy_base()
TINY = tiny_policy()


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = ensure_tiny_checkpoint("llama", tmp_path_factory.mktemp("ckpt_hf"))
    return {**BASE, "kind": "hf", "model_name_or_path": str(path), "dtype": "float32",
            "attn_implementation": "sdpa", "trust_remote_code": False, "model": {"max_seq_len": 48}}


def _worker(cfg: dict[str, Any]) -> tuple[PolicyWorker, Any]:
    w, tok = policy_worker(cfg)
    w.reset_optimizer(3e-3, decay_steps=6)
    return w, tok


def _batch(w: PolicyWorker, tok: Any, step: int) -> BatchedDataDict:
    prompts = [tok.encode_prompt(f"{a}+{b}=") for a, b in [(1, 2), (30, 4), (5, 66), (7, 8)]]
    g = w.generate({"prompts": prompts, "seeds": [step * 10 + i for i in range(4)]}, False)
    return BatchedDataDict({"input_ids": g["input_ids"], "input_lengths": g["input_lengths"],
                            "token_mask": g["token_mask"], "sample_mask": torch.ones(4)})


def _step(w: PolicyWorker, tok: Any, step: int) -> tuple[float, float]:
    out = w.train(_batch(w, tok, step), NLLLoss())["per_step"][0]
    return out["loss"], out["grad_norm"]


def _state(w: PolicyWorker, step: int) -> dict[str, Any]:
    weights = {k: v for k, v in w.get_state(include_weights=True).items() if k not in ("rng", "rank")}
    return {"algorithm": "sft", "counters": {"step": step, "best": -math.inf},
            "policy": {"weights": weights, "worker_rng": [capture_rng_state()]},
            "driver_rng": capture_rng_state()}


@pytest.mark.parametrize("kind", ["tiny", "hf"])
def test_resume_from_checkpoint_equals_the_straight_run(kind: str, hf_llama: dict, tmp_path: Path) -> None:
    cfg = TINY if kind == "tiny" else hf_llama
    straight, tok = _worker(cfg)
    expected = [_step(straight, tok, s) for s in range(4)]

    first, _ = _worker(cfg)
    got = [_step(first, tok, s) for s in range(2)]
    path = save_training_checkpoint(checkpoint_dir_for_step(tmp_path, 2), _state(first, 2))
    del first
    resumed, _ = _worker(cfg)
    state = load_training_checkpoint(latest_checkpoint(tmp_path))
    assert latest_checkpoint(tmp_path) == path and state["counters"] == {"step": 2, "best": -math.inf}
    resumed.load_state(state["policy"]["weights"], state["policy"]["worker_rng"][0])
    got += [_step(resumed, tok, s) for s in range(2, 4)]
    assert got == expected
    assert resumed.weights_checksum() == straight.weights_checksum()


def test_policy_directory_loads_with_from_pretrained(hf_llama: dict, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    w, tok = _worker(hf_llama)
    _step(w, tok, 0)
    path = save_training_checkpoint(tmp_path / "step_00000001", _state(w, 1))
    names = sorted(p.name for p in path.iterdir())
    assert names == ["manifest.json", "policy", "state.json", "tensors.safetensors"]
    assert not any(p.suffix in (".pt", ".bin", ".pkl") for p in path.rglob("*"))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path / "policy"), local_files_only=True)
    ids = _batch(w, tok, 5)["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, w.model(ids))
    loaded = load_training_checkpoint(path)
    files = loaded["policy"]["weights"]["pretrained"]
    assert files["model.safetensors"] == (path / "policy" / "model.safetensors").read_bytes()


def test_tiny_policy_directory_loads_with_its_own_loader(tmp_path: Path) -> None:
    w, tok = _worker(TINY)
    _step(w, tok, 0)
    path = save_training_checkpoint(tmp_path / "c", _state(w, 1))
    assert sorted(p.name for p in (path / "policy").iterdir()) == ["config.json", "model.safetensors"]
    model = load_pretrained_model(TINY, str(path / "policy"))
    ids = _batch(w, tok, 3)["input_ids"]
    assert torch.equal(model(ids), w.model(ids))


def test_typed_values_come_back_exactly(tmp_path: Path) -> None:
    random.random(), np.random.rand(3), torch.rand(2)
    state = {
        "rng": capture_rng_state(),
        "tuple": (1, (2.5, None), "x"),
        "int_keys": {0: {"a": torch.arange(3)}, 7: [True, False]},
        "floats": [math.inf, -math.inf, -0.0, 1e-310, 0.1],
        "np": {"i": np.int64(2**40), "f": np.float32(0.25), "arr": np.arange(6, dtype=np.uint32).reshape(2, 3)},
        "bytes": b"\x00\xff",
        "tensors": {"bf16": torch.randn(3).to(torch.bfloat16), "bool": torch.tensor([True, False]),
                    "scalar": torch.tensor(3.5), "view": torch.arange(10)[::3]},
        "big": 2**100,
    }
    save_training_checkpoint(tmp_path / "c", state)
    back = load_training_checkpoint(tmp_path / "c")
    assert back["tuple"] == state["tuple"] and back["int_keys"][7] == [True, False]
    assert torch.equal(back["int_keys"][0]["a"], torch.arange(3))
    assert [repr(x) for x in back["floats"]] == [repr(x) for x in state["floats"]]
    assert type(back["np"]["i"]) is np.int64 and back["np"]["i"] == 2**40 and type(back["np"]["f"]) is np.float32
    assert back["np"]["arr"].dtype == np.uint32 and np.array_equal(back["np"]["arr"], state["np"]["arr"])
    assert back["bytes"] == b"\x00\xff" and back["big"] == 2**100
    for k, v in state["tensors"].items():
        assert back["tensors"][k].dtype == v.dtype and torch.equal(back["tensors"][k], v), k
    restore_rng_state(state["rng"])
    draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    restore_rng_state(back["rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == draws
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["format_version"] == 2


def test_unstorable_state_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    target = checkpoint_dir_for_step(tmp_path, 1)
    save_training_checkpoint(target, {"x": torch.arange(3)})
    with pytest.raises(TypeError, match=r"state\['opt'\]\['fn'\]: value of type function cannot be checkpointed"):
        save_training_checkpoint(target, {"opt": {"fn": lambda: None}})
    with pytest.raises(TypeError, match=r"dict key \(1, 2\) of type tuple"):
        save_training_checkpoint(target, {"k": {(1, 2): 3}})
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]
    assert torch.equal(load_training_checkpoint(target)["x"], torch.arange(3))


def test_failure_while_writing_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = checkpoint_dir_for_step(tmp_path, 1)
    save_training_checkpoint(target, {"x": torch.arange(3)})

    def boom(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("safetensors.torch.save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        save_training_checkpoint(target, {"x": torch.arange(5)})
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]
    assert torch.equal(load_training_checkpoint(target)["x"], torch.arange(3))


class _Exploit:
    def __reduce__(self) -> tuple:
        return (print, ("code ran while loading",))


def test_version_1_pickle_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "step_00000003"
    d.mkdir()
    write_manifest(d, {"format": ckpt.CHECKPOINT_FORMAT, "format_version": 1})
    unpickled: list[Any] = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: unpickled.append(a))
    # A state holding code, and a plain one (tensors, primitives, NumPy RNG state): both refused.
    for state in ({"x": torch.arange(2), "evil": _Exploit()}, {"x": torch.arange(2), "rng": capture_rng_state()}):
        torch.save(state, d / ckpt.STATE_FILE)
        assert latest_checkpoint(tmp_path) == d
        with pytest.raises(ValueError, match="format_version 1, an older format that is no longer supported") as info:
            load_training_checkpoint(d)
        assert str(d / ckpt.STATE_FILE) in str(info.value)
    assert "code ran" not in capsys.readouterr().out and unpickled == []
