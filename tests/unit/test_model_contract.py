"""The model contract (``tests/model_contract_suite.py``) over every builder: ``tiny`` and
``hf`` on offline tiny Llama, Qwen2 and GPT-2 checkpoints built once per session by
``ensure_tiny_checkpoint`` (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_dp.models.builders import build_model, build_tokenizer, validate_policy
from nemo_dp.models.hf.make_tiny import ensure_tiny_checkpoint
from tests.model_contract_suite import ModelContract, ModelSpec

NAMES = ("tiny", "hf-llama", "hf-qwen2", "hf-gpt2")

TINY_POLICY = {
    "kind": "tiny",
    "model": {"n_layers": 2, "d_model": 32, "n_heads": 4, "max_seq_len": 32, "dropout": 0.0},
}


@pytest.fixture(scope="session")
def tiny_hf_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny_hf_cache")


def hf_policy(path: Path) -> dict:
    return {
        "kind": "hf",
        "model_name_or_path": str(path),
        "tokenizer_name_or_path": None,
        "dtype": "float32",
        "attn_implementation": "sdpa",
        "trust_remote_code": False,
        "model": {"max_seq_len": 64},
    }


@pytest.fixture(params=NAMES)
def spec(request: pytest.FixtureRequest, tiny_hf_cache: Path) -> ModelSpec:
    name = request.param
    if name == "tiny":
        cfg = TINY_POLICY
    else:
        cfg = hf_policy(ensure_tiny_checkpoint(name.split("-", 1)[1], tiny_hf_cache))
    validate_policy(cfg)
    tok = build_tokenizer(cfg)
    return ModelSpec(name=name, policy_cfg=cfg, tokenizer=tok, model=build_model(cfg, vocab_size=tok.vocab_size, seed=0))


class TestModelContract(ModelContract):
    """Runs every contract check for each entry of ``NAMES``."""
