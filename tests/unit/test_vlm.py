"""The tiny Qwen2-VL policy: offline build, ``from_pretrained`` load, generation with images
through the KV cache, per-token log-probs with image inputs, and a training step.

The checkpoint is built once per module (random weights, a few seconds); every test drives the
real transformers model.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from nemo_dp.data.multimodal_utils import PackedTensor
from nemo_dp.data.visual_task import COLOUR_NAMES, VisualTask
from nemo_dp.models.generation import generate
from nemo_dp.models.hf.make_tiny_vlm import BUILD_FILE, BUILD_VERSION, IMAGE_TOKEN, ensure_tiny_vlm_checkpoint
from nemo_dp.models.hf.vlm import load_vlm
from nemo_dp.models.protocol import CausalLM
from nemo_dp.models.token_ops import token_logprobs_from_logits

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_vlm_checkpoint(tmp_path_factory.mktemp("vlm_cache"))


@pytest.fixture(scope="module")
def loaded(vlm_dir: Path):
    return load_vlm(vlm_dir)


def _batch(proc, n: int = 4, seed: int = 0):
    problems = VisualTask("digit", seed=seed).train_problems(n)
    return proc.pack([proc.encode_messages(p.messages()) for p in problems])


def test_checkpoint_layout_and_processor(vlm_dir: Path, loaded) -> None:
    names = {p.name for p in vlm_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json"} <= names
    config = json.loads((vlm_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2_vl"
    model, proc = loaded
    template = proc.tokenizer.chat_template
    assert template is not None and "<|image_pad|>" in template
    assert proc.tokenizer.hf_tokenizer.convert_tokens_to_ids(IMAGE_TOKEN) == model.image_token_id
    # different image sizes -> different patch counts and grids, and as many placeholders
    ids, pix, grid = _batch(proc)
    counts = [int(g.prod() // 4) for g in grid.tensors]
    assert len(set(tuple(g.tolist()[0]) for g in grid.tensors)) > 1
    for row, g, p, c in zip(ids, grid.tensors, pix.tensors, counts):
        assert row.count(model.image_token_id) == c
        assert p.shape[0] == int(g.prod())
    with pytest.raises(ValueError, match="6 image placeholder tokens but its images need 0"):
        model.rope_positions(torch.tensor([ids[0]]), None, None)


def test_every_answer_of_every_visual_kind_is_one_token(loaded) -> None:
    _, proc = loaded
    hf = proc.tokenizer.hf_tokenizer
    for answer in [*map(str, range(10)), *COLOUR_NAMES]:
        assert len(hf.encode(answer, add_special_tokens=False)) == 1, answer


def test_a_cached_build_of_another_builder_version_is_rebuilt(vlm_dir: Path, tmp_path: Path, capsys) -> None:
    import shutil

    stale = tmp_path / "tiny-qwen2-vl"
    shutil.copytree(vlm_dir, stale)
    assert ensure_tiny_vlm_checkpoint(tmp_path) == stale
    assert "rebuilding" not in capsys.readouterr().out  # current: reused as is
    record = json.loads((stale / BUILD_FILE).read_text())
    assert record["version"] == BUILD_VERSION
    (stale / BUILD_FILE).unlink()  # as written before the build file existed
    (stale / "tokenizer.json").write_text("{}")
    assert ensure_tiny_vlm_checkpoint(tmp_path) == stale
    assert f"version None, want {BUILD_VERSION}); rebuilding it" in capsys.readouterr().out
    assert json.loads((stale / BUILD_FILE).read_text()) == record
    assert (stale / "tokenizer.json").read_bytes() == (vlm_dir / "tokenizer.json").read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-qwen2-vl"]


def test_bound_model_is_a_causal_lm(loaded) -> None:
    model, proc = loaded
    _, pix, grid = _batch(proc)
    bound = model.with_images(pix, grid)
    assert isinstance(bound, CausalLM)
    assert {id(p) for p in bound.parameters()} == {id(p) for p in model.parameters()}
    with pytest.raises(ValueError, match="both"):
        model.with_images(pix, None)


@pytest.mark.parametrize("greedy", [True, False])
def test_cached_generation_matches_the_full_forward(loaded, greedy: bool) -> None:
    model, proc = loaded
    ids, pix, grid = _batch(proc, n=4, seed=1)
    bound = model.with_images(pix, grid)
    tok = proc.tokenizer
    out = generate(bound, ids, max_new_tokens=6, eos_id=tok.eos_id, pad_id=tok.pad_id, greedy=greedy, temperature=1.0, seeds=[11, 12, 13, 14])
    assert out["input_ids"].shape[0] == 4 and int(out["token_mask"].sum()) > 0
    for i, row in enumerate(ids):
        assert out["input_ids"][i, : len(row)].tolist() == row
    with torch.no_grad():
        full = token_logprobs_from_logits(bound(out["input_ids"]), out["input_ids"])
    mask = out["token_mask"].bool()
    torch.testing.assert_close(full[mask], out["generation_logprobs"][mask], atol=1e-5, rtol=0)
    # generation is reproducible from the seeds
    again = generate(bound, ids, max_new_tokens=6, eos_id=tok.eos_id, pad_id=tok.pad_id, greedy=greedy, temperature=1.0, seeds=[11, 12, 13, 14])
    assert torch.equal(again["input_ids"], out["input_ids"])


def test_log_probs_depend_on_the_image(loaded) -> None:
    model, proc = loaded
    problems = VisualTask("digit", seed=3).train_problems(40)
    by_grid: dict[tuple, list] = {}
    for p in problems:
        enc = proc.encode_messages(p.messages())
        by_grid.setdefault(tuple(enc.image_grid_thw.tolist()[0]), []).append(enc)
    a, b = next(v for v in by_grid.values() if len(v) >= 2)[:2]  # same size, different pixels
    assert not torch.equal(a.pixel_values, b.pixel_values)
    ids = torch.tensor([a.input_ids])
    with torch.no_grad():
        la = model.with_images(a.pixel_values, a.image_grid_thw)(ids)
        lb = model.with_images(b.pixel_values, b.image_grid_thw)(ids)
    assert not torch.allclose(la[0, -1], lb[0, -1])
    with torch.no_grad():  # the logits of the last positions only, as a response-only loss asks
        tail = model.with_images(a.pixel_values, a.image_grid_thw)(ids, logits_from=ids.shape[1] - 3)
    assert tail.shape[1] == 3 and torch.allclose(tail, la[:, -3:], atol=1e-5)


def test_a_training_step_changes_the_log_probs_of_the_answer(loaded, tmp_path: Path) -> None:
    model, proc = loaded
    problems = VisualTask("digit", seed=4).train_problems(2)
    rows, pixes, grids = [], [], []
    for p in problems:
        enc = proc.encode_messages(p.messages())
        rows.append(enc.input_ids + proc.tokenizer.encode_response(p.answer))
        pixes.append(enc.pixel_values)
        grids.append(enc.image_grid_thw)
    width = max(len(r) for r in rows)
    ids = torch.full((2, width), proc.tokenizer.pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    student = copy.deepcopy(model)
    bound = student.with_images(PackedTensor(pixes, 0), PackedTensor(grids, 0))
    opt = torch.optim.AdamW(student.parameters(), lr=1e-2)
    before = token_logprobs_from_logits(bound(ids), ids).detach()
    for _ in range(3):
        loss = -token_logprobs_from_logits(bound(ids), ids)[:, -3:].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = token_logprobs_from_logits(bound(ids), ids).detach()
    assert after[:, -3:].mean() > before[:, -3:].mean()
    vision_grads = [p.grad for n, p in student.hf.named_parameters() if "visual" in n and p.grad is not None]
    assert vision_grads and any(float(g.abs().sum()) > 0 for g in vision_grads), "gradients reach the vision tower"
    # save and load back with from_pretrained
    student.save_pretrained(tmp_path / "ck")
    proc.save_pretrained(tmp_path / "ck")
    reloaded, _ = load_vlm(tmp_path / "ck")
    with torch.no_grad():
        again = token_logprobs_from_logits(reloaded.with_images(PackedTensor(pixes, 0), PackedTensor(grids, 0))(ids), ids)
    torch.testing.assert_close(again, after, atol=1e-6, rtol=0)


def test_load_refuses_what_is_not_a_qwen2_vl_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_vlm(tmp_path / "missing")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="'llama'"):
        load_vlm(tmp_path)
