"""Loading user tasks from jsonl files.

SFT lines are ``{"prompt": ..., "response": ...}``; RL lines are ``{"prompt": ..., "answer":
...}``. Anything else is rejected with the file and line at fault, before training starts.
"""

from __future__ import annotations

import json
import os
from typing import Any

from nemo_dp.data.arithmetic import Problem


def _read_objects(path: str | os.PathLike[str], fields: tuple[str, ...]) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj: Any = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: malformed JSON line: {exc.msg}") from exc
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            for field in fields:
                if field not in obj:
                    raise ValueError(f"{path}:{lineno}: missing field {field!r}")
                if not isinstance(obj[field], str):
                    raise ValueError(
                        f"{path}:{lineno}: field {field!r} must be a string, got {type(obj[field]).__name__}"
                    )
            rows.append({f: obj[f] for f in fields})
    if not rows:
        raise ValueError(f"{path}: no records")
    return rows


def load_sft_jsonl(path: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """Load SFT pairs.

    Args:
        path: jsonl file with ``prompt`` and ``response`` strings per line (blank lines skipped;
            extra fields ignored).

    Returns:
        ``(prompt, response)`` pairs in file order.

    Raises:
        ValueError: On a malformed line (naming file and line) or an empty file.
    """
    return [(r["prompt"], r["response"]) for r in _read_objects(path, ("prompt", "response"))]


def load_rl_jsonl(path: str | os.PathLike[str]) -> list[Problem]:
    """Load RL prompts with reference answers.

    Args:
        path: jsonl file with ``prompt`` and ``answer`` strings per line.

    Returns:
        Problems in file order.

    Raises:
        ValueError: On a malformed line (naming file and line) or an empty file.
    """
    return [Problem(prompt=r["prompt"], answer=r["answer"]) for r in _read_objects(path, ("prompt", "answer"))]
