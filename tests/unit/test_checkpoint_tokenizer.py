"""A training checkpoint's ``policy/`` directory carries the tokenizer beside the weights.

What is checked (no Ray: one ``PolicyWorker`` in-process, its state saved through the real
checkpoint writer): for ``policy=hf`` the directory loads with ``AutoTokenizer`` and
``AutoModelForCausalLM.from_pretrained`` and tokenizes exactly like the run's tokenizer; the
evaluation takes the tokenizer from the checkpoint, so a run config whose tokenizer path does
not resolve from here still evaluates, unless ``run_overrides`` names the tokenizer; a tiny
model (vocabulary in code) writes no tokenizer files; and a checkpoint tokenizer that asks for
its own Python code is refused, not run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from nemo_dp.models.builders import build_tokenizer, load_saved_tokenizer
from nemo_dp.models.hf.make_tiny import TinyDims, ensure_tiny_checkpoint
from nemo_dp.training.evaluate import CheckpointRef, load_tokenizer
from nemo_dp.utils.checkpoint import save_training_checkpoint
from nemo_dp.utils.seeding import capture_rng_state
from tests.unit.test_checkpoint_format import policy_base, policy_worker, tiny_policy

_CONSTANT_LR: dict[str, Any] = {"weight_decay": 0.0, "warmup_steps": 0, "schedule": "constant"}
BASE = policy_base(**_CONSTANT_LR)
TINY = tiny_policy(**_CONSTANT_LR)
TEXTS = ("12+7=", "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n7<|im_end|>\n")


@pytest.fixture(scope="module")
def hf_cfg(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    dims = TinyDims(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1)
    path = ensure_tiny_checkpoint("llama", tmp_path_factory.mktemp("tok_ckpt"), dims=dims, name="micro-llama")
    return {**BASE, "kind": "hf", "model_name_or_path": str(path), "tokenizer_name_or_path": None,
            "dtype": "float32", "attn_implementation": "sdpa", "trust_remote_code": False,
            "model": {"max_seq_len": 32}}


def _checkpoint(cfg: dict[str, Any], target: Path) -> Path:
    """A training checkpoint holding a fresh worker's state (as the trainers save one)."""
    w, _ = policy_worker(cfg)
    w.reset_optimizer(3e-3, decay_steps=2)
    weights = {k: v for k, v in w.get_state(include_weights=True).items() if k not in ("rng", "rank")}
    state = {"algorithm": "sft", "counters": {"step": 1, "best": -math.inf},
             "policy": {"weights": weights, "worker_rng": [capture_rng_state()]}, "driver_rng": capture_rng_state()}
    return save_training_checkpoint(target, state)


@pytest.fixture(scope="module")
def hf_checkpoint(hf_cfg: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(hf_cfg, tmp_path_factory.mktemp("run") / "step_00000001")


def test_hf_policy_directory_holds_a_loadable_tokenizer(hf_cfg: dict, hf_checkpoint: Path) -> None:
    transformers = pytest.importorskip("transformers")
    exported = hf_checkpoint / "policy"
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names, names
    source = build_tokenizer(hf_cfg)
    auto = transformers.AutoTokenizer.from_pretrained(str(exported), local_files_only=True)
    for text in TEXTS:
        assert auto.encode(text, add_special_tokens=False) == source.encode(text)
    assert (auto.pad_token_id, auto.eos_token_id, auto.bos_token_id) == (source.pad_id, source.eos_id, source.bos_id)
    assert auto.chat_template == source.chat_template and auto.chat_template
    model = transformers.AutoModelForCausalLM.from_pretrained(str(exported), local_files_only=True)
    assert model.get_output_embeddings().weight.shape[0] >= len(auto)

    saved = load_saved_tokenizer(hf_cfg, str(exported))
    assert saved is not None and saved.vocab_size == source.vocab_size
    assert [saved.encode_prompt(t) for t in TEXTS] == [source.encode_prompt(t) for t in TEXTS]


def test_tiny_policy_directory_has_no_tokenizer_files(tmp_path: Path) -> None:
    path = _checkpoint(TINY, tmp_path / "step_00000001")
    assert sorted(p.name for p in (path / "policy").iterdir()) == ["config.json", "model.safetensors"]
    assert load_saved_tokenizer(TINY, str(path / "policy")) is None


def _ref(checkpoint: Path, policy: dict[str, Any], overrides: tuple[str, ...] = ()) -> CheckpointRef:
    run_cfg = OmegaConf.create({"algorithm": {"name": "sft"}, "policy": policy, "seed": 1})
    return CheckpointRef(checkpoint, "sft", 1, checkpoint.parent, run_cfg, overrides)


def test_evaluation_takes_the_tokenizer_from_the_checkpoint(hf_cfg: dict, hf_checkpoint: Path,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The run named its model and tokenizer relative to a directory that is not this one.
    monkeypatch.chdir(tmp_path)
    moved = {**hf_cfg, "model_name_or_path": ".cache/nemo_dp/tiny-llama"}
    tok = load_tokenizer(_ref(hf_checkpoint, moved))
    source = build_tokenizer(hf_cfg)
    assert [tok.encode_prompt(t) for t in TEXTS] == [source.encode_prompt(t) for t in TEXTS]
    # Naming the tokenizer in run_overrides takes it from the run config instead (here: it
    # does not resolve, and the error says how to fix it).
    override = ("policy.tokenizer_name_or_path=.cache/elsewhere",)
    with pytest.raises(ValueError, match="run_overrides"):
        load_tokenizer(_ref(hf_checkpoint, {**moved, "tokenizer_name_or_path": ".cache/elsewhere"}, override))
    # A checkpoint without tokenizer files falls back to the run config's tokenizer.
    bare = tmp_path / "bare" / "step_00000001"
    (bare / "policy").mkdir(parents=True)
    assert load_tokenizer(_ref(bare, hf_cfg)).vocab_size == source.vocab_size


def test_a_checkpoint_tokenizer_asking_for_code_is_refused(hf_cfg: dict, hf_checkpoint: Path, tmp_path: Path) -> None:
    import shutil

    tampered = tmp_path / "step_00000001"
    shutil.copytree(hf_checkpoint, tampered)
    config_file = tampered / "policy" / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["auto_map"] = {"AutoTokenizer": ["evil_tokenizer.EvilTokenizer", None]}
    config_file.write_text(json.dumps(config))
    (tampered / "policy" / "evil_tokenizer.py").write_text("raise SystemExit('code from a checkpoint ran')\n")
    with pytest.raises(ValueError, match=r"tokenizer_config.json: \"auto_map\" names a tokenizer class") as err:
        load_tokenizer(_ref(tampered, hf_cfg))
    assert str(tampered / "policy") in str(err.value)
