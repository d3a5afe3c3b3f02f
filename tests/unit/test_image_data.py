"""Unit tests of users' image datasets as trainer rows (``nemo_dp.data.image_sources``).

What is isolated: the data side on composed configs (``env.sft_data`` / ``env.rl_data`` /
``env.val_data`` naming image jsonl files written into a temporary directory), the check before
Ray (``validate_datasets``) with a real tiny Qwen2-VL tokenizer or the text-only ``tiny``
policy, and the worker helper that loads and encodes the images; no Ray, no trainer.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from nemo_dp.config import register_configs, validate_config
from nemo_dp.data.arithmetic import Problem
from nemo_dp.data.columns import Columns
from nemo_dp.data.datasets import SFTDataset, collate_sft
from nemo_dp.data.errors import DatasetError
from nemo_dp.data.image_rows import ImagePrompt, ImageSFTExample
from nemo_dp.data.image_sources import is_image_jsonl
from nemo_dp.data.sources import rl_source, sft_source, val_source
from nemo_dp.data.validation import validate_datasets
from nemo_dp.data.visual_task import VisualTask
from nemo_dp.models.builders import build_tokenizer
from nemo_dp.models.policy.images import encode_visual_prompts, wire_prompt

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nemo_dp.models.hf.make_tiny_vlm import ensure_tiny_vlm_checkpoint

    return ensure_tiny_vlm_checkpoint(tmp_path_factory.mktemp("vlm"))


def _turns(image: str, question: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": question}]}]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture()
def data(tmp_path: Path) -> dict[str, Path]:
    """Four PNGs in ``imgs/`` and SFT / RL jsonl files naming them relative to the file."""
    (tmp_path / "imgs").mkdir()
    rl, sft = [], []
    for i, p in enumerate(VisualTask("digit", seed=1).train_problems(4)):
        p.image().save(tmp_path / "imgs" / f"{i}.png")
        turns = _turns(f"imgs/{i}.png", p.question)
        rl.append({"messages": turns, "answer": p.answer, "level": i})
        sft.append({"messages": [*turns, {"role": "assistant", "content": p.answer}]})
    return {"rl": _write(tmp_path / "rl.jsonl", rl), "sft": _write(tmp_path / "sft.jsonl", sft)}


def _cfg(model_dir: Path | None, *overrides: str) -> Any:
    policy = ["policy=tiny"] if model_dir is None else ["policy=hf_vlm", f"policy.model_name_or_path={model_dir}"]
    register_configs(REPO_ROOT / "recipes")
    with initialize_config_dir(str(REPO_ROOT / "conf"), version_base=None):
        return compose(
            "config",
            overrides=[
                "~recipe", *policy, "policy.train_global_batch_size=4", "policy.train_micro_batch_size=2",
                *overrides,
            ],
        )


def _grpo(model_dir: Path | None, data: dict[str, Path], *overrides: str) -> Any:
    return _cfg(
        model_dir, "algorithm=grpo", "algorithm.num_prompts_per_step=4",
        f"env.rl_data={data['rl']}", f"env.val_data={data['rl']}", *overrides,
    )


def test_rows_carry_resolved_image_paths_and_the_answer_row(data: dict[str, Path], model_dir: Path) -> None:
    cfg = _grpo(model_dir, data)
    tok = build_tokenizer(cfg.policy)
    src = rl_source(cfg.env, 0, num_prompts_key="algorithm.num_train_prompts", tokenizer=tok)
    assert src.key == "env.rl_data" and src.path == str(data["rl"]) and src.lines == (1, 2, 3, 4)
    row = src.rows[0]
    assert isinstance(row, Problem) and isinstance(row.prompt, ImagePrompt)
    assert row.prompt.image_paths() == [str(data["rl"].parent.resolve() / "imgs" / "0.png")]
    assert row.answer.chat and row.answer.columns["level"] == 0 and row.answer.prompt[0]["role"] == "user"
    # The driver hands the prompt on as it is; a worker loads and encodes its image.
    assert tok.encode_prompt(row.prompt) is row.prompt and wire_prompt(row.prompt) is row.prompt
    worker = SimpleNamespace(cfg=cfg.policy)
    ids, images = encode_visual_prompts(worker, [row.prompt, [1, 2, 3]])
    assert ids[1] == [1, 2, 3] and ids[0].count(tok.processor.image_token_id) > 0
    assert images["pixel_values"].tensors[1] is None and images["image_grid_thw"].tensors[0].shape == (1, 3)
    val = val_source(cfg.env, 2, val_samples_key="algorithm.val_samples", tokenizer=tok)
    assert len(val.rows) == 2 and val.total == 4 and val.lines == (1, 2)
    assert "[image 0.png]" in str(row.prompt)


def test_sft_rows_collate_with_their_images(data: dict[str, Path], model_dir: Path) -> None:
    cfg = _cfg(model_dir, "algorithm=sft", f"env.sft_data={data['sft']}")
    tok = build_tokenizer(cfg.policy)
    src = sft_source(cfg.env, 0, num_samples_key="algorithm.num_train_samples")
    examples = SFTDataset(src.rows)
    assert all(isinstance(ex, ImageSFTExample) for ex in examples.pairs)
    batch = collate_sft([examples[0], examples[1]], tok)
    assert len(batch["pixel_values"]) == 2 and batch["input_ids"].shape[0] == 2
    # The learned tokens are the answer and its eos.
    learned = batch["input_ids"][0][batch["token_mask"][0].bool()].tolist()
    assert learned == tok.encode_response(examples[0].response)


def test_validation_before_ray_checks_image_datasets(data: dict[str, Path], model_dir: Path) -> None:
    cfg = _grpo(model_dir, data, "algorithm.warm_start.enabled=true", f"env.sft_data={data['sft']}")
    report = validate_datasets(validate_config(cfg), build_tokenizer(cfg.policy))
    assert [(c.phase, c.role, c.key) for c in report.checks] == [
        ("warm_start", "train", "env.sft_data"), ("warm_start", "val", "env.val_data"),
        ("grpo", "train", "env.rl_data"), ("grpo", "val", "env.val_data"),
    ]
    assert all(0 < c.longest <= c.limit and c.rows == 4 for c in report.checks)
    assert report.checks[2].columns == ("answer", "level")


def test_a_missing_image_fails_before_ray_naming_key_line_field_and_path(
    data: dict[str, Path], model_dir: Path
) -> None:
    rows = [json.loads(line) for line in data["rl"].read_text().splitlines()]
    rows[2]["messages"][0]["content"][0]["image"] = "imgs/nope.png"
    _write(data["rl"], rows)
    cfg = _grpo(model_dir, data)
    with pytest.raises(DatasetError) as info:
        validate_datasets(validate_config(cfg), build_tokenizer(cfg.policy))
    err = info.value
    where = ("env.rl_data", str(data["rl"]), 3, "messages[0].content[0].image")
    assert (err.key, err.path, err.line, err.field) == where
    assert "imgs/nope.png" in str(err) and "does not exist" in str(err)


def test_a_prompt_longer_than_max_seq_len_is_refused_naming_the_key(data: dict[str, Path], model_dir: Path) -> None:
    cfg = _grpo(model_dir, data, "policy.model.max_seq_len=24", "policy.generation.max_new_tokens=2")
    with pytest.raises(DatasetError, match=r"policy\.model\.max_seq_len") as info:
        validate_datasets(validate_config(cfg), build_tokenizer(cfg.policy))
    assert info.value.key == "env.rl_data" and info.value.line == 1
    assert "raise policy.model.max_seq_len" in str(info.value)


def test_a_text_only_policy_is_refused_with_the_fix(data: dict[str, Path]) -> None:
    cfg = _cfg(None, "algorithm=sft", f"env.sft_data={data['sft']}")
    with pytest.raises(DatasetError, match="use policy=hf_vlm") as info:
        validate_datasets(validate_config(cfg), build_tokenizer(cfg.policy))
    assert (info.value.key, info.value.path, info.value.line) == ("env.sft_data", str(data["sft"]), 1)


def test_bad_rows_name_file_line_and_field(tmp_path: Path, data: dict[str, Path]) -> None:
    png = data["rl"].parent / "imgs" / "0.png"
    last_image = [*_turns(str(png), "q"), {"role": "assistant", "content": [{"type": "image", "image": str(png)}]}]
    bad = _write(tmp_path / "bad.jsonl", [{"messages": last_image}])
    cfg = _cfg(None, "algorithm=sft", f"env.sft_jsonl={bad}")
    with pytest.raises(DatasetError, match="cannot hold images") as info:
        sft_source(cfg.env, 0, num_samples_key="algorithm.num_train_samples")
    assert (info.value.key, info.value.line, info.value.field) == ("env.sft_jsonl", 1, "messages[1].content")
    no_answer = _write(tmp_path / "noanswer.jsonl", [{"messages": _turns(str(png), "q")}])
    cfg = _cfg(None, f"env.rl_data={no_answer}")
    with pytest.raises(DatasetError, match="is missing") as info:
        rl_source(cfg.env, 0, num_prompts_key="algorithm.num_train_prompts", tokenizer=None)
    assert (info.value.line, info.value.field) == (1, "answer")


def test_only_jsonl_files_with_image_parts_take_the_image_path(tmp_path: Path, data: dict[str, Path]) -> None:
    text = _write(tmp_path / "text.jsonl", [{"messages": [{"role": "user", "content": "an image?"}], "answer": "1"}])
    assert is_image_jsonl(str(data["rl"]), Columns()) and not is_image_jsonl(str(text), Columns())
    renamed = _write(tmp_path / "renamed.jsonl", [{"turns": _turns("imgs/0.png", "q"), "answer": "1"}])
    assert not is_image_jsonl(str(renamed), Columns()) and is_image_jsonl(str(renamed), Columns(messages="turns"))


def test_the_visual_task_refuses_a_data_key(data: dict[str, Path], model_dir: Path) -> None:
    cfg = _cfg(model_dir, "env=visual", "algorithm=sft", f"env.sft_jsonl={data['sft']}")
    with pytest.raises(DatasetError, match="env=visual generates its own data") as info:
        validate_datasets(validate_config(cfg), build_tokenizer(cfg.policy))
    assert info.value.key == "env.sft_jsonl" and "env=arith" in str(info.value)
