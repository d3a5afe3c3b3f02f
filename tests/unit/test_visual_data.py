"""The built-in visual task and chat jsonl rows with image parts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_dp.data.errors import DatasetError
from nemo_dp.data.images import has_image_parts, load_image_jsonl, parse_image_messages
from nemo_dp.data.visual_task import _PALETTE, COLOUR_NAMES, IMAGE_SIZES, VisualTask, exact_match_reward, render


@pytest.mark.parametrize("kind", ["digit", "count", "colour"])
def test_visual_task_is_deterministic_and_held_out_is_disjoint(kind: str) -> None:
    a = VisualTask(kind, seed=3).train_problems(200)
    b = VisualTask(kind, seed=3).train_problems(200)
    assert [p.spec for p in a] == [p.spec for p in b]
    assert a[0].image().tobytes() == b[0].image().tobytes()
    assert len({p.spec for p in a}) == 200
    held = {p.spec for p in VisualTask(kind, seed=99).eval_problems(40)}
    for seed in (0, 3, 7):
        assert held.isdisjoint({p.spec for p in VisualTask(kind, seed=seed).train_problems(200)})
    sizes = {p.image().size for p in a}
    assert len(sizes) > 1 and all(w in IMAGE_SIZES and h in IMAGE_SIZES for w, h in sizes)
    answers = {p.answer for p in a}
    expected = {"digit": {str(d) for d in range(10)}, "count": {"1", "2", "3", "4"}, "colour": set(COLOUR_NAMES)}
    assert answers == expected[kind]


def _fg_pixels(kind: str, spec: tuple[int, ...]) -> int:
    img = render(kind, spec)
    fg = _PALETTE[spec[3]]
    return sum(px == fg for px in img.get_flattened_data())


def test_colour_answer_is_the_digit_colour() -> None:
    # colour: the digit's pixels have the answer's palette colour, the rest the background's
    for p in VisualTask("colour", seed=2).train_problems(30):
        img = render("colour", p.spec)
        colours = {px for px in img.get_flattened_data()}
        assert colours == {_PALETTE[p.spec[3]], _PALETTE[p.spec[4]]}
        assert p.answer == COLOUR_NAMES[p.spec[3]] and p.question == "What colour is the digit?"


def test_rendered_images_show_the_answer() -> None:
    # count: the foreground is exactly `answer` disjoint squares of the spec's side
    for p in VisualTask("count", seed=5).train_problems(30):
        assert _fg_pixels("count", p.spec) == int(p.answer) * p.spec[5] ** 2
    # digit: the same geometry lights more pixels for an 8 (all segments) than for a 1
    base = VisualTask("digit", seed=0).train_problems(1)[0]
    assert 0 < _fg_pixels("digit", (1, *base.spec[1:])) < _fg_pixels("digit", (8, *base.spec[1:]))


def test_exact_match_reward_and_messages() -> None:
    assert exact_match_reward(" 7\n", "7") == 1.0
    assert exact_match_reward("7.", "7") == 0.0
    p = VisualTask("digit", seed=1).train_problems(1)[0]
    msgs = p.messages()
    assert has_image_parts(msgs)
    assert msgs[0]["content"][1] == {"type": "text", "text": "Which digit is shown?"}
    with pytest.raises(ValueError, match="kind"):
        VisualTask("letters")


def _write(tmp_path: Path, rows: list, name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((json.dumps(r) if not isinstance(r, str) else r) + "\n" for r in rows))
    return path


def _image(tmp_path: Path, rel: str) -> None:
    p = VisualTask("digit", seed=0).train_problems(1)[0]
    target = tmp_path / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    p.image().save(target)


def _rl_row(image: str) -> dict:
    return {
        "messages": [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "Which digit?"}]}],
        "answer": 7,
    }


def test_rl_and_sft_rows_resolve_images_relative_to_the_file(tmp_path: Path) -> None:
    _image(tmp_path, "imgs/a.png")
    rl = _write(tmp_path, [_rl_row("imgs/a.png"), "", {"messages": [{"role": "user", "content": "text only"}], "answer": "3"}])
    rows = load_image_jsonl(rl, kind="rl", key="env.rl_jsonl")
    assert [r.line for r in rows] == [1, 3] and rows[0].answer == "7"
    assert rows[0].image_paths() == [str((tmp_path / "imgs/a.png").resolve())]
    loaded = rows[0].messages_with_images()
    assert loaded[0]["content"][0]["image"].mode == "RGB" and loaded[0]["content"][1]["text"] == "Which digit?"
    sft = _write(tmp_path, [{"messages": [*_rl_row("imgs/a.png")["messages"], {"role": "assistant", "content": "7"}]}], "sft.jsonl")
    (row,) = load_image_jsonl(sft, kind="sft")
    assert row.answer is None and row.messages[-1] == {"role": "assistant", "content": "7"}


def test_missing_or_unreadable_images_fail_with_file_line_and_path(tmp_path: Path) -> None:
    _image(tmp_path, "ok.png")
    (tmp_path / "broken.png").write_bytes(b"not an image")
    path = _write(tmp_path, [_rl_row("ok.png"), _rl_row("missing.png")])
    with pytest.raises(DatasetError) as exc:
        load_image_jsonl(path, kind="rl", key="env.rl_jsonl")
    err = exc.value
    assert (err.key, err.path, err.line, err.field) == ("env.rl_jsonl", str(path), 2, "messages[0].content[0].image")
    assert "missing.png" in str(err) and f"{path}:2" in str(err) and str(tmp_path / "missing.png") in str(err)
    path = _write(tmp_path, [_rl_row("broken.png")], "b.jsonl")
    with pytest.raises(DatasetError, match=r"b.jsonl:1: field 'messages\[0\].content\[0\].image'.*broken.png.*cannot be read"):
        load_image_jsonl(path, kind="rl")


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([], "non-empty list"),
        ([{"role": "bot", "content": "x"}], "'messages[0].role'"),
        ([{"role": "user", "content": [{"type": "video"}]}], "'messages[0].content[0].type'"),
        ([{"role": "user", "content": [{"type": "text", "text": 3}]}], "'messages[0].content[0].text'"),
        ([{"role": "user", "content": [{"type": "image", "image": ""}]}], "non-empty path"),
        ([{"role": "user", "content": []}], "non-empty list of text / image parts"),
    ],
)
def test_malformed_messages_name_the_field(tmp_path: Path, messages, fragment: str) -> None:
    with pytest.raises(DatasetError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        parse_image_messages(messages, jsonl_path=tmp_path / "d.jsonl", line=4)


def test_row_level_errors(tmp_path: Path) -> None:
    path = _write(tmp_path, [{"messages": [{"role": "user", "content": "q"}]}])
    with pytest.raises(DatasetError, match="d.jsonl:1: field 'answer' is missing"):
        load_image_jsonl(path.rename(tmp_path / "d.jsonl"), kind="rl")
    path = _write(tmp_path, [{"messages": [{"role": "user", "content": "q"}]}], "s.jsonl")
    with pytest.raises(DatasetError, match="must end with an 'assistant' turn"):
        load_image_jsonl(path, kind="sft")
    with pytest.raises(DatasetError, match="does not exist"):
        load_image_jsonl(tmp_path / "nope.jsonl", kind="sft")
    with pytest.raises(DatasetError, match="not valid JSON"):
        load_image_jsonl(_write(tmp_path, ["{bad"], "j.jsonl"), kind="rl")
