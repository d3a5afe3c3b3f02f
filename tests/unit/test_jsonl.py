"""jsonl loaders: good files load in order; malformed lines name file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_dp.data.arithmetic import Problem
from nemo_dp.data.jsonl import load_rl_jsonl, load_sft_jsonl


def test_load_sft(tmp_path: Path) -> None:
    path = tmp_path / "sft.jsonl"
    path.write_text(
        json.dumps({"prompt": "hi=", "response": "yo", "extra": 1}) + "\n\n" + json.dumps({"prompt": "1+1=", "response": "2"}) + "\n"
    )
    assert load_sft_jsonl(path) == [("hi=", "yo"), ("1+1=", "2")]


def test_load_rl(tmp_path: Path) -> None:
    path = tmp_path / "rl.jsonl"
    path.write_text(json.dumps({"prompt": "2*3=", "answer": "6"}) + "\n")
    assert load_rl_jsonl(path) == [Problem("2*3=", "6")]


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("{not json", "malformed JSON line"),
        ("[1, 2]", "expected a JSON object, got list"),
        (json.dumps({"prompt": "a"}), "missing field 'response'"),
        (json.dumps({"prompt": "a", "response": 3}), "field 'response' must be a string, got int"),
    ],
)
def test_malformed_line_named(tmp_path: Path, line: str, fragment: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "ok", "response": "ok"}) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=rf"bad\.jsonl:2: {fragment}"):
        load_sft_jsonl(path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match="no records"):
        load_rl_jsonl(path)
