"""Unit tests of the VLM training inputs: ``env=visual`` rows, visual SFT batches, image binding.

What is isolated: the data side (``nemo_dp.data.visual_sources``, ``visual_collate``), the
``hf_vlm`` builder and tokenizer on a real tiny Qwen2-VL built into a temporary directory, and
the worker helpers of ``nemo_dp.models.policy.images`` with the real model; no Ray, no trainer.
The configuration rules (PPO refused, packing refused, visual task without a VLM refused) are
checked on composed configs.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir

from nemo_dp.config import register_configs, validate_config
from nemo_dp.data.datasets import SFTDataset, collate_sft
from nemo_dp.data.errors import DatasetError
from nemo_dp.data.sources import build_val_problems, rl_source, sft_source
from nemo_dp.data.validation import validate_datasets
from nemo_dp.data.visual_task import VisualPrompt, VisualSFTExample
from nemo_dp.models.builders import build_model, build_tokenizer, policy_takes_images, prepare_policy, validate_policy
from nemo_dp.models.policy.images import bind_images, encode_visual_prompts, wire_prompt
from nemo_dp.models.token_ops import token_logprobs_from_logits
from nemo_dp.training.phases import plan_phases
from nemo_dp.utils.packed_tensor import PackedTensor

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nemo_dp.models.hf.make_tiny_vlm import ensure_tiny_vlm_checkpoint

    return ensure_tiny_vlm_checkpoint(tmp_path_factory.mktemp("vlm"))


def _cfg(model_dir: Path | None, *overrides: str):
    """A composed ``env=visual`` config: ``policy=hf_vlm`` at ``model_dir``, or ``policy=tiny``."""
    policy = ["policy=tiny"] if model_dir is None else ["policy=hf_vlm", f"policy.model_name_or_path={model_dir}"]
    register_configs(REPO_ROOT / "recipes")
    with initialize_config_dir(str(REPO_ROOT / "conf"), version_base=None):
        return compose("config", overrides=["~recipe", "env=visual", *policy, *overrides])


@pytest.fixture(scope="module")
def vlm(model_dir: Path):
    cfg = _cfg(model_dir, "algorithm=sft")
    prepare_policy(cfg.policy)  # not the default cache path: leaves the fixture's build alone
    validate_policy(cfg.policy)
    tok = build_tokenizer(cfg.policy)
    model = build_model(cfg.policy, vocab_size=tok.vocab_size, seed=0)
    return cfg, tok, model


def test_prepare_builds_the_tiny_vlm_once_and_validation_accepts_it(vlm, model_dir: Path, capsys) -> None:
    cfg, tok, _ = vlm
    assert (model_dir / "config.json").is_file()
    prepare_policy(cfg.policy)  # present: nothing printed, nothing rebuilt
    assert "building" not in capsys.readouterr().out
    assert policy_takes_images(cfg.policy) and not policy_takes_images(_cfg(None).policy)
    assert tok.processor.image_token_id > 0


def test_only_the_default_cache_path_builds_the_tiny_vlm_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "missing" / "tiny-qwen2-vl"
    prepare_policy(_cfg(elsewhere).policy)
    assert not elsewhere.parent.exists()
    with pytest.raises(ValueError, match=r"^policy\.model_name_or_path: "):
        validate_policy(_cfg(elsewhere).policy)
    default = _cfg(Path(".cache/nemo_dp/tiny-qwen2-vl")).policy
    prepare_policy(default)
    assert "building the offline tiny Qwen2-VL" in capsys.readouterr().out
    validate_policy(default)


def test_visual_rows_carry_specs_and_the_tokenizer_defers_their_encoding(vlm) -> None:
    cfg, tok, _ = vlm
    rows = sft_source(cfg.env, 8, num_samples_key="algorithm.num_train_samples").rows
    assert all(isinstance(r, VisualSFTExample) for r in rows)
    assert SFTDataset(rows)[0] is rows[0]  # kept whole (not turned into a text pair)
    problems = rl_source(cfg.env, 8, num_prompts_key="algorithm.num_train_prompts", tokenizer=tok).rows
    assert isinstance(tok.encode_prompt(problems[0].prompt), VisualPrompt)
    prompt = problems[0].prompt
    assert wire_prompt(prompt) is prompt and wire_prompt((1, 2)) == [1, 2]
    val = build_val_problems(cfg, tok)
    train_specs = {p.spec for p in rl_source(cfg.env, 400, num_prompts_key="k", tokenizer=tok).rows}
    assert not {p.spec for p in val} & train_specs  # held-out split


def test_visual_sft_batch_learns_only_the_answer_and_carries_one_image_per_row(vlm) -> None:
    cfg, tok, _ = vlm
    rows = sft_source(cfg.env, 4, num_samples_key="algorithm.num_train_samples").rows
    batch = collate_sft(rows, tok, max_seq_len=64)
    assert isinstance(batch["pixel_values"], PackedTensor) and len(batch["pixel_values"]) == 4
    for i, ex in enumerate(rows):
        n = int(batch["input_lengths"][i])
        learned = batch["input_ids"][i, :n][batch["token_mask"][i, :n].bool()].tolist()
        assert learned == tok.encode_response(ex.response)
    with pytest.raises(ValueError, match=r"example 0 has \d+ tokens > max_seq_len=8"):
        collate_sft(rows, tok, max_seq_len=8)


def test_bound_images_change_the_log_probs_and_a_text_batch_leaves_the_model_alone(vlm) -> None:
    cfg, tok, model = vlm
    problems = rl_source(cfg.env, 2, num_prompts_key="k", tokenizer=tok).rows
    worker = SimpleNamespace(cfg=cfg.policy)
    ids, images = encode_visual_prompts(worker, [p.prompt for p in problems])
    assert set(images) == {"pixel_values", "image_grid_thw"}
    row = torch.tensor([ids[0]])
    one = {k: v.slice([0]) for k, v in images.items()}
    other = {k: v.slice([1]) for k, v in images.items()}
    if tuple(other["image_grid_thw"].as_tensor()[0].tolist()) == tuple(one["image_grid_thw"].as_tensor()[0].tolist()):
        lp_a = token_logprobs_from_logits(bind_images(model, one)(row), row)
        lp_b = token_logprobs_from_logits(bind_images(model, other)(row), row)
        assert not torch.equal(lp_a, lp_b)
    assert bind_images(model, {"input_ids": row}) is model
    assert encode_visual_prompts(worker, [[1, 2, 3]]) == ([[1, 2, 3]], {})
    with pytest.raises(ValueError, match="needs both"):
        bind_images(model, {"pixel_values": one["pixel_values"]})
    with pytest.raises(ValueError, match="does not read them"):
        bind_images(torch.nn.Linear(1, 1), one)


def test_configuration_rules_refuse_what_a_vlm_cannot_run(vlm, model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"algorithm=ppo: not supported with policy=hf_vlm"):
        plan_phases(_cfg(model_dir, "algorithm=ppo"))
    assert [p.label for p in plan_phases(_cfg(model_dir, "algorithm=grpo", "algorithm.warm_start.enabled=true"))] == [
        "VLM SFT warm start",
        "VLM GRPO",
    ]
    with pytest.raises(ValueError, match=r"policy\.sequence_packing\.enabled: not supported with policy=hf_vlm"):
        validate_policy(_cfg(model_dir, "policy.sequence_packing.enabled=true").policy)
    text = _cfg(None, "algorithm=grpo")
    with pytest.raises(DatasetError, match="needs a policy that reads images"):
        validate_datasets(validate_config(text), build_tokenizer(text.policy))
    short = _cfg(model_dir, "algorithm=grpo", "policy.model.max_seq_len=20")
    with pytest.raises(DatasetError, match=r"raise policy\.model\.max_seq_len to at least"):
        validate_datasets(validate_config(short), vlm[1])


def test_the_bound_model_never_emits_an_image_placeholder(vlm) -> None:
    from nemo_dp.models.hf.vlm import PLACEHOLDER_LOGIT

    cfg, tok, model = vlm
    problems = rl_source(cfg.env, 1, num_prompts_key="k", tokenizer=tok).rows
    ids, images = encode_visual_prompts(SimpleNamespace(cfg=cfg.policy), [problems[0].prompt])
    row = torch.tensor(ids)
    logits = bind_images(model, images)(row)
    assert torch.all(logits[..., tok.processor.image_token_id] == PLACEHOLDER_LOGIT)
    assert torch.isfinite(token_logprobs_from_logits(logits, row)).all()  # prompt placeholders stay finite
