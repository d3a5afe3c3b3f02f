"""An HF policy (offline tiny Llama) through the real Ray worker group with dp_size 2.

What is checked: generation over two ranks equals generating in-process with the same
per-sample seeds, log-probs from the workers agree with the generation log-probs, training
keeps the gloo replicas identical and gives the same loss as one in-process rank on the
same global batch, and the policy state carries a ``save_pretrained`` directory's files.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_dp.algorithms.loss_functions import NLLLoss
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.distributed.worker_group import RayCluster
from nemo_dp.models.builders import build_model, build_tokenizer
from nemo_dp.models.generation import generate
from nemo_dp.models.hf.make_tiny import ensure_tiny_checkpoint
from nemo_dp.models.policy import Policy
from nemo_dp.models.policy.worker import PolicyWorker

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def hf_cfg(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = ensure_tiny_checkpoint("llama", tmp_path_factory.mktemp("hf_int"))
    return {
        "kind": "hf", "model_name_or_path": str(path), "tokenizer_name_or_path": None,
        "dtype": "float32", "attn_implementation": "sdpa", "trust_remote_code": False, "device": "cpu",
        "dp_size": 2, "torch_threads": 1, "model": {"max_seq_len": 64},
        "optimizer": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.99,
                      "eps": 1e-8, "warmup_steps": 0, "schedule": "constant", "min_lr_ratio": 0.1},
        "generation": {"max_new_tokens": 5, "temperature": 1.0},
        "train_global_batch_size": 8, "train_micro_batch_size": 2, "logprob_batch_size": 4,
        "generation_batch_size": 4, "max_grad_norm": 1.0,
        "dynamic_batching": {"enabled": False, "train_mb_tokens": 256, "logprob_mb_tokens": 256,
                             "sequence_length_round": 4},
        "sequence_packing": {"enabled": False, "train_mb_tokens": 256, "logprob_mb_tokens": 256,
                             "algorithm": "modified_first_fit_decreasing", "sequence_length_pad_multiple": 1,
                             "microbatch_order": "packer"},
    }


@pytest.fixture(scope="module")
def tok(hf_cfg: dict[str, Any]) -> Any:
    return build_tokenizer(hf_cfg)


@pytest.fixture(scope="module")
def policy(ray_cluster: dict[str, str], hf_cfg: dict[str, Any], tok: Any) -> Iterator[Policy]:
    p = Policy(cluster=RayCluster(env_vars=ray_cluster), config=hf_cfg, vocab_size=tok.vocab_size,
               pad_id=tok.pad_id, eos_id=tok.eos_id, seed=3)
    try:
        yield p
    finally:
        p.shutdown()


def _prompts(tok: Any) -> list[list[int]]:
    pairs = [(1, 2), (34, 5), (6, 78), (9, 9), (12, 34), (5, 0), (71, 2), (8, 88)]
    return [tok.encode_prompt(tok.apply_chat_template([{"role": "user", "content": f"{a}+{b}="}], True))
            for a, b in pairs]


def test_generation_matches_in_process_and_logprobs_agree(policy: Policy, hf_cfg: dict, tok: Any) -> None:
    prompts, seeds = _prompts(tok), list(range(100, 108))
    out = policy.generate(prompts, seeds, greedy=False)
    local = generate(build_model(hf_cfg, vocab_size=tok.vocab_size, seed=3), prompts,
                     max_new_tokens=5, eos_id=tok.eos_id, pad_id=tok.pad_id, greedy=False, temperature=1.0,
                     seeds=seeds)
    assert torch.equal(out["input_ids"], local["input_ids"])
    lp = policy.get_logprobs(out)["logprobs"]
    assert float((lp * out["token_mask"] - out["generation_logprobs"]).abs().max()) <= 1e-5


def test_training_keeps_replicas_identical_and_matches_one_rank(policy: Policy, hf_cfg: dict, tok: Any) -> None:
    out = policy.generate(_prompts(tok), list(range(8)), greedy=False)
    batch = BatchedDataDict({"input_ids": out["input_ids"], "input_lengths": out["input_lengths"],
                             "token_mask": out["token_mask"], "sample_mask": torch.ones(8)})
    single = PolicyWorker(rank=0, world_size=1, policy_cfg={**hf_cfg, "dp_size": 1}, vocab_size=tok.vocab_size,
                          pad_id=tok.pad_id, eos_id=tok.eos_id, seed=3)
    expected = single.train(BatchedDataDict(dict(batch)), NLLLoss(), gbs=8)["per_step"][0]["loss"]
    m = policy.train(batch, NLLLoss(), gbs=8)
    assert m["loss"] == pytest.approx(expected, rel=1e-5)
    sums = policy.weights_checksums()
    assert sums[0] == sums[1]
    assert sums[0] == pytest.approx(single.weights_checksum(), rel=1e-6)
    later = [policy.train(batch, NLLLoss(), gbs=8)["loss"] for _ in range(5)]
    assert later[-1] < m["loss"]


def test_state_carries_a_pretrained_directory(policy: Policy, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    files = policy.state_dict()["weights"]["pretrained"]
    assert {"config.json", "model.safetensors"} <= set(files)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), local_files_only=True)
    assert type(model).__name__ == "LlamaForCausalLM"
