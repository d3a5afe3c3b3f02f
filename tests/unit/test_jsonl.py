"""jsonl loaders: good files (both SFT shapes, both RL shapes, the samples under tests/data)
load in order; every kind of malformed line fails naming the file, the line and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_dp.data.arithmetic import Problem
from nemo_dp.data.chat import ChatExample, Message
from nemo_dp.data.errors import DatasetError
from nemo_dp.data.jsonl import load_rl_jsonl, load_sft_jsonl, read_rl_jsonl, read_sft_jsonl
from nemo_dp.models.tiny.tokenizer import CharTokenizer

DATA = Path(__file__).resolve().parents[1] / "data"
GOOD_SFT = {"prompt": "ok", "response": "ok"}
GOOD_RL = {"prompt": "ok", "answer": "1"}


def _write(tmp_path: Path, *objs: object, name: str = "bad.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return path


def test_load_sft(tmp_path: Path) -> None:
    path = tmp_path / "sft.jsonl"
    path.write_text(
        json.dumps({"prompt": "hi=", "response": "yo", "extra": 1})
        + "\n\n"
        + json.dumps({"prompt": "1+1=", "response": "2"})
        + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
        + "\n"
    )
    assert load_sft_jsonl(path) == [
        ("hi=", "yo"),
        ("1+1=", "2"),
        ChatExample((Message("user", "a"), Message("assistant", "b"))),
    ]
    assert [r.line for r in read_sft_jsonl(path)] == [1, 3, 4]


def test_load_rl(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {"prompt": "2*3=", "answer": "6"},
        {"prompt": "2*4=", "answer": 8},
        {"messages": [{"role": "system", "content": "S."}, {"role": "user", "content": "U"}], "answer": "7"},
        name="rl.jsonl",
    )
    assert load_rl_jsonl(path) == [Problem("2*3=", "6"), Problem("2*4=", "8"), Problem("S.U", "7")]
    third = read_rl_jsonl(path)[2]
    assert third.line == 3 and third.messages == (Message("system", "S."), Message("user", "U"))


def test_sample_files_load_and_encode_with_the_char_tokenizer() -> None:
    tok = CharTokenizer()
    chat = load_sft_jsonl(DATA / "sft_chat.jsonl")
    pairs = load_sft_jsonl(DATA / "sft_prompt_response.jsonl")
    assert len(chat) == len(pairs) == 16
    assert all(isinstance(x, ChatExample) for x in chat) and all(isinstance(x, tuple) for x in pairs)
    assert any(sum(m.role == "assistant" for m in x.messages) == 2 for x in chat)  # multi-turn present
    for name in ("rl_prompt.jsonl", "rl_messages.jsonl"):
        problems = load_rl_jsonl(DATA / name, tokenizer=tok)
        assert len(problems) == 16
        for p in problems:
            tok.encode(p.prompt)


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("{not json", r"malformed JSON line: Expecting property name enclosed in double quotes \(column 2\)"),
        ("[1, 2]", "expected a JSON object, got list"),
        ({"prompt": "a"}, "field 'response' is missing"),
        ({"prompt": "a", "response": 3}, "field 'response' must be a string, got int"),
        ({"response": "a"}, "needs field 'messages' or 'prompt'"),
        ({"prompt": "a", "response": "b", "messages": []}, "has both 'messages' and 'prompt'"),
        ({"messages": []}, "field 'messages' must not be empty"),
        ({"messages": "hi"}, "field 'messages' must be a list of {role, content} objects, got str"),
        ({"messages": ["hi"]}, "field 'messages\\[0\\]' must be an object with 'role' and 'content', got str"),
        ({"messages": [{"role": "user"}]}, "field 'messages\\[0\\].content' is missing"),
        ({"messages": [{"role": "user", "content": None}]}, "field 'messages\\[0\\].content' must be a string, got null"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]},
            "field 'messages\\[1\\].role' is 'bot', not a legal role; legal roles: \\['system', 'user', 'assistant'\\]",
        ),
        (
            {"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]},
            "field 'messages\\[1\\].role' is 'user'; an SFT conversation must end with an 'assistant' turn",
        ),
    ],
)
def test_malformed_sft_line_named(tmp_path: Path, line: object, fragment: str) -> None:
    path = _write(tmp_path, GOOD_SFT, line)
    with pytest.raises(DatasetError, match=rf"bad\.jsonl:2: {fragment}") as info:
        read_sft_jsonl(path, key="env.sft_jsonl")
    assert info.value.key == "env.sft_jsonl" and info.value.line == 2 and info.value.path == str(path)
    assert str(info.value).startswith("env.sft_jsonl: ")


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ({"prompt": "a"}, "field 'answer' is missing"),
        ({"prompt": "a", "answer": 1.5}, "field 'answer' must be a string or an integer, got float"),
        ({"prompt": "a", "answer": True}, "field 'answer' must be a string or an integer, got bool"),
        ({"prompt": ["a"], "answer": "1"}, "field 'prompt' must be a string, got list"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "answer": "1"},
            "field 'messages\\[1\\].role' is 'assistant'; an RL prompt conversation must end with a 'user'",
        ),
        ({"messages": [{"role": "tool", "content": "a"}], "answer": "1"}, "field 'messages\\[0\\].role' is 'tool'"),
    ],
)
def test_malformed_rl_line_named(tmp_path: Path, line: object, fragment: str) -> None:
    path = _write(tmp_path, GOOD_RL, GOOD_RL, line)
    with pytest.raises(DatasetError, match=rf"bad\.jsonl:3: {fragment}") as info:
        load_rl_jsonl(path)
    assert info.value.line == 3


def test_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(json.dumps(GOOD_SFT).encode() + b"\n" + b'{"prompt": "\xff", "response": "a"}\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: not UTF-8 text"):
        load_sft_jsonl(path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(DatasetError, match="empty.jsonl: no records"):
        load_rl_jsonl(path)


def test_missing_file_and_directory_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"^env.rl_jsonl: .*nope.jsonl: file does not exist; point it at"):
        load_rl_jsonl(tmp_path / "nope.jsonl", key="env.rl_jsonl")
    with pytest.raises(DatasetError, match=r"^env.sft_jsonl: .*: is a directory"):
        load_sft_jsonl(tmp_path, key="env.sft_jsonl")
