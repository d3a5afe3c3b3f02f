"""``policy=hf`` without Ray: pre-Ray validation errors name the key and the fix, offline tiny
checkpoints are laid out like hub checkpoints and load through ``AutoModelForCausalLM``, the
tokenizer adapter, and the policy / value workers training an HF model in-process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_dp.models.builders import build_model, build_tokenizer, validate_policy
from nemo_dp.models.hf import validate_hf_policy
from nemo_dp.models.hf.make_tiny import ensure_tiny_checkpoint, make_tiny_checkpoint
from tests.unit.test_precision import _tiny

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf_cache")


@pytest.fixture(scope="module")
def llama(cache: Path) -> Path:
    return ensure_tiny_checkpoint("llama", cache)


def _policy(path: Any, **kw: Any) -> dict[str, Any]:
    """The precision tests' one-rank CPU config (``_tiny``) on the HF checkpoint at ``path``."""
    hf = {"kind": "hf", "model_name_or_path": str(path), "tokenizer_name_or_path": None, "dtype": "float32",
          "attn_implementation": "sdpa", "trust_remote_code": False, "device": "cpu", "model": {"max_seq_len": 64}}
    return _tiny(**{**hf, "generation": {"max_new_tokens": 4, "temperature": 1.0}, **kw})


# --- the offline checkpoint -----------------------------------------------------------------
def test_tiny_checkpoint_is_laid_out_like_a_hub_download(llama: Path) -> None:
    names = {p.name for p in llama.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= names
    assert not any(n.endswith((".bin", ".pt", ".pth")) for n in names)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(llama), local_files_only=True)
    assert type(model).__name__ == "LlamaForCausalLM"
    tok = transformers.AutoTokenizer.from_pretrained(str(llama), local_files_only=True)
    assert tok.chat_template and len(tok) == model.config.vocab_size
    assert json.loads((llama / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_builder_loads_the_same_weights_as_from_pretrained(llama: Path) -> None:
    ours = build_model(_policy(llama), vocab_size=1, seed=123)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(llama), local_files_only=True)
    ids = torch.tensor([[1, 5, 9, 30, 2]])
    assert torch.equal(ours(ids), ref(input_ids=ids).logits)


def test_make_tiny_is_deterministic_and_ensure_reuses(tmp_path: Path, cache: Path, llama: Path) -> None:
    again = make_tiny_checkpoint("llama", tmp_path / "again")
    for name in ("tokenizer.json", "config.json", "model.safetensors"):
        assert (again / name).read_bytes() == (llama / name).read_bytes(), name
    stamp = (llama / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_checkpoint("llama", cache) == llama
    assert (llama / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="--arch got 'bert'"):
        make_tiny_checkpoint("bert", tmp_path / "x")


# --- validation before Ray ------------------------------------------------------------------
def test_missing_directory_and_hub_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"policy\.model_name_or_path: directory .* does not exist.*make_tiny"):
        validate_hf_policy(_policy(tmp_path / "nope"))
    with pytest.raises(ValueError, match=r"policy\.model_name_or_path: 'Qwen/Qwen2\.5-0\.5B' looks like a HuggingFace hub name.*no downloads"):
        validate_hf_policy(_policy("Qwen/Qwen2.5-0.5B"))
    with pytest.raises(ValueError, match=r"policy\.model_name_or_path: required with policy=hf"):
        validate_policy(_policy(""))
    with pytest.raises(ValueError, match=r"policy\.dtype: got 'float16'"):
        validate_policy(_policy(tmp_path, dtype="float16"))
    with pytest.raises(ValueError, match=r"policy\.attn_implementation: got 'flash'"):
        validate_policy(_policy(tmp_path, attn_implementation="flash"))
    with pytest.raises(ValueError, match=r"policy\.kind: got 'vllm'; legal values: \['hf', 'hf_vlm', 'tiny'\]"):
        validate_policy({"kind": "vllm"})


def test_checkpoint_problems_name_the_key(tmp_path: Path, llama: Path) -> None:
    no_weights = tmp_path / "no_weights"
    shutil.copytree(llama, no_weights)
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"policy\.model_name_or_path: .* holds no \*\.safetensors"):
        validate_hf_policy(_policy(no_weights))

    bert = tmp_path / "bert"
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32)
    transformers.BertForMaskedLM(cfg).save_pretrained(str(bert))
    with pytest.raises(ValueError, match=r"policy\.model_name_or_path: .* is a BertForMaskedLM checkpoint, not a causal"):
        validate_hf_policy(_policy(bert))

    no_eos = tmp_path / "no_eos"
    shutil.copytree(llama, no_eos)
    tok_cfg = json.loads((no_eos / "tokenizer_config.json").read_text())
    tok_cfg["eos_token"] = None
    (no_eos / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    with pytest.raises(ValueError, match=r"policy\.tokenizer_name_or_path: tokenizer at .* has no eos token"):
        validate_hf_policy(_policy(llama, tokenizer_name_or_path=str(no_eos)))

    with pytest.raises(ValueError, match=r"policy\.model\.max_seq_len: 4096 exceeds the checkpoint's max_position_embeddings=128"):
        validate_hf_policy(_policy(llama, model={"max_seq_len": 4096}))
    validate_hf_policy(_policy(llama))  # the intact checkpoint passes


def _edit_json(path: Path, **values: Any) -> None:
    data = json.loads(path.read_text()) if path.is_file() else {}
    data.update(values)
    path.write_text(json.dumps(data))


def test_another_models_smaller_tokenizer_is_refused_by_its_special_ids(tmp_path: Path, llama: Path) -> None:
    """A tokenizer with fewer tokens than the embedding passes the size check; its eos id (here
    its bos token made eos) disagrees with the model's config.json and names both."""
    other = make_tiny_checkpoint("llama", tmp_path / "other", vocab_size=270)
    tok_cfg = json.loads((other / "tokenizer_config.json").read_text())
    _edit_json(other / "tokenizer_config.json", eos_token=tok_cfg["bos_token"])
    small = build_tokenizer(_policy(llama, tokenizer_name_or_path=str(other)))
    model_cfg = json.loads((llama / "config.json").read_text())
    assert small.vocab_size < model_cfg["vocab_size"] and small.eos_id != model_cfg["eos_token_id"]
    with pytest.raises(ValueError) as err:
        validate_hf_policy(_policy(llama, tokenizer_name_or_path=str(other)))
    msg = str(err.value)
    assert msg.startswith(f"policy.tokenizer_name_or_path: the tokenizer at {str(other)!r} has eos id {small.eos_id} "), msg
    assert f"policy.model_name_or_path={str(llama)!r} declares config.json:eos_token_id={model_cfg['eos_token_id']}" in msg, msg


@pytest.mark.parametrize("name", ["eos", "bos", "pad"])
@pytest.mark.parametrize("file_name", ["config.json", "generation_config.json"])
def test_special_ids_must_agree_with_the_models_files(tmp_path: Path, llama: Path, name: str, file_name: str) -> None:
    model = tmp_path / "model"
    shutil.copytree(llama, model)
    tok = build_tokenizer(_policy(llama))
    ours = {"eos": tok.eos_id, "bos": tok.bos_id, "pad": tok.pad_id}[name]
    _edit_json(model / file_name, **{f"{name}_token_id": ours + 5})
    with pytest.raises(ValueError, match=rf"^policy\.tokenizer_name_or_path: .* has {name} id {ours} .* declares "
                                         rf".*{file_name}:{name}_token_id={ours + 5}"):
        validate_hf_policy(_policy(model))
    # A list (generation_config.json's eos often is one) holding the tokenizer's id agrees
    # (transformers allows a list in config.json for eos only).
    fixed = [ours + 5, ours] if name == "eos" or file_name == "generation_config.json" else ours
    _edit_json(model / file_name, **{f"{name}_token_id": fixed})
    validate_hf_policy(_policy(model))


def test_a_tokenizer_larger_than_the_embedding_is_refused_naming_both_sizes(tmp_path: Path, llama: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(llama, model)
    size = build_tokenizer(_policy(llama)).vocab_size
    _edit_json(model / "config.json", vocab_size=size - 1)
    with pytest.raises(ValueError, match=rf"has {size} tokens but the model has only {size - 1} embedding rows "
                                         rf"\(config\.json:vocab_size={size - 1} of policy\.model_name_or_path="):
        validate_hf_policy(_policy(model))


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_every_tiny_architecture_passes_validation(cache: Path, arch: str) -> None:
    validate_hf_policy(_policy(ensure_tiny_checkpoint(arch, cache)))


# --- tokenizer adapter ----------------------------------------------------------------------
def test_tokenizer_adapter_layout_and_chat_template(llama: Path) -> None:
    tok = build_tokenizer(_policy(llama))
    turns = [{"role": "user", "content": "37+5="}, {"role": "assistant", "content": "42"}]
    text = tok.apply_chat_template(turns[:1], add_generation_prompt=True)
    assert text == "<|im_start|>user\n37+5=<|im_end|>\n<|im_start|>assistant\n"
    prompt = tok.encode_prompt(text)
    assert prompt[0] == tok.bos_id
    assert tok.decode(prompt[1:]) == "<|im_start|>user\n37+5="  # stops at the first eos
    response = tok.encode_response("42")
    assert response[-1] == tok.eos_id and tok.decode(response) == "42"
    assert tok.decode(prompt + response, skip_special=True, stop_at_eos=False).endswith("42")
    with pytest.raises(ValueError, match="outside vocabulary"):
        tok.decode([tok.vocab_size])


# --- workers in-process ---------------------------------------------------------------------
def _rollout_batch(worker: Any, tok: Any) -> Any:
    from nemo_dp.distributed.batched_data_dict import BatchedDataDict

    prompts = [tok.encode_prompt(tok.apply_chat_template([{"role": "user", "content": f"{a}+{b}="}], True))
               for a, b in [(1, 2), (30, 4), (5, 66), (7, 8)]]
    g = worker.generate({"prompts": prompts, "seeds": [1, 2, 3, 4]}, False)
    lp = worker.get_logprobs(g)["logprobs"]
    assert float((lp * g["token_mask"] - g["generation_logprobs"]).abs().max()) <= 1e-5
    return BatchedDataDict({
        "input_ids": g["input_ids"], "input_lengths": g["input_lengths"], "token_mask": g["token_mask"],
        "sample_mask": torch.ones(4), "prev_logprobs": lp,
    })


def test_policy_worker_trains_an_hf_model(llama: Path) -> None:
    from nemo_dp.algorithms.loss_functions import NLLLoss
    from nemo_dp.models.policy.worker import PolicyWorker

    cfg = _policy(llama)
    tok = build_tokenizer(cfg)
    w = PolicyWorker(rank=0, world_size=1, policy_cfg=cfg, vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                     eos_id=tok.eos_id, seed=0)
    data = _rollout_batch(w, tok)
    losses = [w.train(data, NLLLoss())["per_step"][0]["loss"] for _ in range(8)]
    assert losses[-1] < 0.7 * losses[0]
    ref = w.get_reference_policy_logprobs(data)["reference_logprobs"]
    assert torch.equal(ref, data["prev_logprobs"])  # the reference copy did not move
    state = w.get_state(include_weights=True)
    w2 = PolicyWorker(rank=0, world_size=1, policy_cfg=cfg, vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                      eos_id=tok.eos_id, seed=0)
    w2.load_state(state, None)
    assert w2.weights_checksum() == w.weights_checksum()


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_value_worker_on_an_hf_backbone(arch: str, cache: Path) -> None:
    from nemo_dp.algorithms.ppo_losses import ClippedValueLossFn
    from nemo_dp.models.policy.worker import PolicyWorker
    from nemo_dp.models.value.worker import ValueWorker

    cfg = _policy(ensure_tiny_checkpoint(arch, cache))
    tok = build_tokenizer(cfg)
    kw = dict(rank=0, world_size=1, policy_cfg=cfg, vocab_size=tok.vocab_size, pad_id=tok.pad_id,
              eos_id=tok.eos_id, seed=0)
    policy, critic = PolicyWorker(**kw), ValueWorker(**kw)
    data = _rollout_batch(policy, tok)
    assert float(critic.get_values(data)["values"].abs().sum()) == 0.0  # zero head
    copied = critic.init_trunk_from(policy.get_state(include_weights=True)["model"])
    assert copied == len(policy.model.state_dict())
    frozen = critic.model.backbone.lm_head_only_parameters()
    assert len(frozen) == (0 if arch == "gpt2" else 1)  # GPT-2 ties its head to the embeddings
    assert all(not p.requires_grad for p in frozen)
    data["returns"] = data["token_mask"].float() * torch.tensor([[1.0], [-1.0], [0.5], [0.0]])
    loss_fn = ClippedValueLossFn(value_clip=10.0)
    first = None
    for _ in range(40):
        data["values"] = critic.get_values(data)["values"]
        out = critic.train(data, loss_fn)["per_step"][0]["value_loss"]
        first = out if first is None else first
    assert out < 0.5 * first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_policy_worker_on_cuda_matches_cpu(llama: Path) -> None:
    from nemo_dp.models.policy.worker import PolicyWorker

    outs = {}
    for device in ("cpu", "cuda"):
        cfg = _policy(llama, device=device)
        tok = build_tokenizer(cfg)
        w = PolicyWorker(rank=0, world_size=1, policy_cfg=cfg, vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                         eos_id=tok.eos_id, seed=0)
        assert next(w.model.parameters()).device.type == device
        outs[device] = _rollout_batch(w, tok)
    torch.testing.assert_close(outs["cuda"]["prev_logprobs"], outs["cpu"]["prev_logprobs"], rtol=1e-4, atol=1e-4)


def test_cuda_without_a_device_is_a_clear_error(llama: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    from nemo_dp.models.policy.worker import PolicyWorker

    with pytest.raises(RuntimeError, match="policy.device=cuda but this worker sees no CUDA device"):
        PolicyWorker(rank=0, world_size=1, policy_cfg=_policy(llama, device="cuda"), vocab_size=10, pad_id=0,
                     eos_id=2, seed=0)


def test_bfloat16_policy_generates_and_trains(llama: Path) -> None:
    from nemo_dp.algorithms.loss_functions import NLLLoss
    from nemo_dp.models.policy.worker import PolicyWorker

    cfg = _policy(llama, dtype="bfloat16", attn_implementation="eager")
    tok = build_tokenizer(cfg)
    w = PolicyWorker(rank=0, world_size=1, policy_cfg=cfg, vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                     eos_id=tok.eos_id, seed=0)
    assert next(w.model.parameters()).dtype == torch.bfloat16
    prompts = [tok.encode_prompt("1+2="), tok.encode_prompt("30+4=")]
    g = w.generate({"prompts": prompts, "seeds": [1, 2]}, False)
    assert g["generation_logprobs"].dtype == torch.float32
    from nemo_dp.distributed.batched_data_dict import BatchedDataDict

    data = BatchedDataDict({"input_ids": g["input_ids"].repeat(2, 1), "input_lengths": g["input_lengths"].repeat(2),
                            "token_mask": g["token_mask"].repeat(2, 1), "sample_mask": torch.ones(4)})
    out = w.train(data, NLLLoss())["per_step"][0]
    assert torch.isfinite(torch.tensor([out["loss"], out["grad_norm"]])).all() and out["grad_norm"] > 0


def test_prepare_builds_only_the_default_cache_path_on_first_use_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from nemo_dp.models.builders import prepare_policy

    monkeypatch.chdir(tmp_path)
    cfg = _policy(".cache/nemo_dp/tiny-gpt2")
    with pytest.raises(ValueError, match="does not exist"):
        validate_policy(cfg)
    prepare_policy(cfg)
    assert "building the offline tiny gpt2 checkpoint" in capsys.readouterr().out
    validate_policy(cfg)
    assert json.loads((tmp_path / ".cache/nemo_dp/tiny-gpt2/config.json").read_text())["model_type"] == "gpt2"
    prepare_policy(_policy(tmp_path / ".cache/nemo_dp/tiny-gpt2"))  # the same path, absolute: exists
    assert capsys.readouterr().out == ""
    # Any other tiny-<arch> path is no magic: nothing is created, validation names the key.
    for elsewhere in (tmp_path / "missing" / "dir" / "tiny-qwen2", tmp_path / "cache" / "tiny-gpt2"):
        prepare_policy(_policy(elsewhere))
        assert not elsewhere.exists() and not elsewhere.parent.exists()
        with pytest.raises(ValueError, match=r"^policy\.model_name_or_path: directory .* does not exist.*only the "
                                             r"default cache path \.cache/nemo_dp/tiny-<arch> is built"):
            validate_policy(_policy(elsewhere))
    other = _policy(tmp_path / "my-model")
    prepare_policy(other)  # not a tiny-<arch> name: left for validation to report
    assert not (tmp_path / "my-model").exists()
    prepare_policy({"kind": "tiny"})  # the tiny family has nothing to prepare


def test_workers_get_absolute_model_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative ``policy.model_name_or_path`` means the driver's directory: a worker on a
    joined cluster starts in its node's directory, so the workers get it made absolute."""
    from omegaconf import OmegaConf

    from nemo_dp.models.builders import policy_for_workers

    monkeypatch.chdir(tmp_path)
    cfg = OmegaConf.create({"kind": "hf", "model_name_or_path": ".cache/m", "tokenizer_name_or_path": None,
                            "n": 2, "dp_size": "${n}"})  # fmt: skip
    out = policy_for_workers(cfg)
    assert out == {"kind": "hf", "model_name_or_path": str(tmp_path / ".cache" / "m"),
                   "tokenizer_name_or_path": None, "n": 2, "dp_size": 2}  # fmt: skip
    assert cfg.model_name_or_path == ".cache/m"  # the run's own config keeps what the user wrote
    home = policy_for_workers({"model_name_or_path": "/abs/m", "tokenizer_name_or_path": "~/tok"})
    assert home == {"model_name_or_path": "/abs/m", "tokenizer_name_or_path": str(Path.home() / "tok")}
