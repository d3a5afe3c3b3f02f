"""Loading user datasets from jsonl files; a fault raises ``DatasetError`` naming file, line and field.

SFT lines: ``{"prompt", "response"}`` or ``{"messages"}``; RL lines: ``{"prompt"|"messages", "answer"}``
(``columns`` renames fields).  Blank lines, a BOM and extra fields are accepted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Optional

from nemo_dp.data.arithmetic import Problem
from nemo_dp.data.chat import ROLES, ChatExample, Message, SFTExample, render_prompt
from nemo_dp.data.columns import Columns
from nemo_dp.data.errors import DatasetError

__all__ = [
    "SFTRecord", "RLRecord", "read_sft_jsonl", "read_rl_jsonl", "load_sft_jsonl", "load_rl_jsonl", "nonblank_lines",
    "scan_jsonl", "RowFields", "sft_example", "rl_fields", "render_rl_prompt",
]


@dataclass(frozen=True)
class SFTRecord:
    """One SFT example (a ``(prompt, response)`` pair or a ``ChatExample``) with its 1-based line."""

    example: SFTExample
    line: int


@dataclass(frozen=True)
class RLRecord:
    """One RL problem (a conversation prompt already rendered, ``messages`` kept) with its 1-based line."""

    problem: Problem
    line: int
    messages: Optional[tuple[Message, ...]] = None


def _objects(path: str, key: str | None) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise DatasetError(
            "file does not exist", key=key, path=path, fix="point it at an existing jsonl file"
        ) from None
    except IsADirectoryError:
        raise DatasetError("is a directory, not a jsonl file", key=key, path=path) from None
    except OSError as exc:
        raise DatasetError(f"cannot be opened: {exc.strerror}", key=key, path=path) from exc
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(f"not UTF-8 text: {exc.reason}", key=key, path=path, line=lineno) from None
            if lineno == 1:
                line = line.removeprefix("\ufeff")
            if not line.strip():
                continue
            try:
                obj: Any = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(
                    f"malformed JSON line: {exc.msg} (column {exc.colno})", key=key, path=path, line=lineno
                ) from None
            if not isinstance(obj, dict):
                raise DatasetError(f"expected a JSON object, got {type(obj).__name__}", key=key, path=path, line=lineno)
            yield lineno, obj


class RowFields:
    """Field access on one record, raising ``DatasetError`` at its file:line (1-based) or table row (0-based)."""

    def __init__(
        self, obj: dict[str, Any], path: str, line: int | None, key: str | None, row: int | None = None
    ) -> None:
        self.obj, self.path, self.line, self.key, self.row = obj, path, line, key, row

    def fail(self, problem: str, field: str | None = None) -> DatasetError:
        return DatasetError(problem, key=self.key, path=self.path, line=self.line, field=field, row=self.row)

    def string(self, name: str) -> str:
        if name not in self.obj:
            raise self.fail("is missing", name)
        value = self.obj[name]
        if not isinstance(value, str):
            raise self.fail(f"must be a string, got {_type(value)}", name)
        if not value.strip():
            raise self.fail("is empty", name)
        return value

    def answer(self, name: str = "answer") -> str:
        if name not in self.obj:
            raise self.fail("is missing", name)
        value = self.obj[name]
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise self.fail(f"must be a string or an integer, got {_type(value)}", name)
        return str(value)

    def messages(self, name: str = "messages") -> tuple[Message, ...]:
        value = self.obj[name]
        if not isinstance(value, list):
            raise self.fail(f"must be a list of {{role, content}} objects, got {_type(value)}", name)
        if not value:
            raise self.fail("must not be empty", name)
        out: list[Message] = []
        for i, turn in enumerate(value):
            where = f"{name}[{i}]"
            if not isinstance(turn, dict):
                raise self.fail(f"must be an object with 'role' and 'content', got {_type(turn)}", where)
            for part in ("role", "content"):
                if part not in turn:
                    raise self.fail("is missing", f"{where}.{part}")
                if not isinstance(turn[part], str):
                    raise self.fail(f"must be a string, got {_type(turn[part])}", f"{where}.{part}")
            if turn["role"] not in ROLES:
                raise self.fail(f"is {turn['role']!r}, not a legal role; legal roles: {list(ROLES)}", f"{where}.role")
            out.append(Message(role=turn["role"], content=turn["content"]))
        return tuple(out)

    def exclusive(self, a: str, b: str) -> str:
        has_a, has_b = a in self.obj, b in self.obj
        if has_a and has_b:
            raise self.fail(f"has both {a!r} and {b!r}; give exactly one")
        if not has_a and not has_b:
            raise self.fail(f"needs field {a!r} or {b!r}")
        return a if has_a else b


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _read_records(
    path: str | os.PathLike[str], key: str | None, columns: Columns | None, record: Callable[[RowFields, Columns], Any]
) -> list[Any]:
    """``record(line, columns)`` of each record of a jsonl file, in file order; a file without any is refused."""
    spath = os.fspath(path)
    col = columns or Columns()
    rows = [record(RowFields(obj, spath, lineno, key), col) for lineno, obj in _objects(spath, key)]
    if not rows:
        raise DatasetError("no records", key=key, path=spath, fix="the file holds no non-blank line")
    return rows


def sft_example(line: RowFields, col: Columns) -> SFTExample:
    """The ``(prompt, response)`` pair or conversation of one record (``DatasetError`` if malformed)."""
    if line.exclusive(col.messages, col.prompt) == col.prompt:
        return (line.string(col.prompt), line.string(col.response))
    messages = line.messages(col.messages)
    if messages[-1].role != "assistant":
        raise line.fail(
            f"is {messages[-1].role!r}; an SFT conversation must end with an 'assistant' turn (the text to learn)",
            f"{col.messages}[{len(messages) - 1}].role",
        )
    return ChatExample(messages)


def rl_fields(line: RowFields, col: Columns) -> tuple[str, Optional[tuple[Message, ...]], str]:
    """``(prompt, messages, answer)`` of one RL record (``DatasetError`` if malformed); ``messages`` is None for
    a text prompt, and ``prompt`` is ``""`` for a conversation until ``render_rl_prompt``."""
    if line.exclusive(col.messages, col.prompt) == col.prompt:
        return line.string(col.prompt), None, line.answer(col.answer)
    messages = line.messages(col.messages)
    if messages[-1].role == "assistant":
        raise line.fail(
            "is 'assistant'; an RL prompt conversation must end with a 'user' or 'system' "
            f"turn (the reference answer goes in {col.answer!r})",
            f"{col.messages}[{len(messages) - 1}].role",
        )
    return "", messages, line.answer(col.answer)


def render_rl_prompt(line: RowFields, col: Columns, messages: tuple[Message, ...], tokenizer: Any | None) -> str:
    """An RL prompt conversation rendered to text (``tokenizer``'s chat template if any), failing at ``line``."""
    try:
        return render_prompt(messages, tokenizer)
    except ValueError as exc:
        raise line.fail(f"cannot be rendered by the tokenizer's chat template: {exc}", col.messages) from exc


def read_sft_jsonl(
    path: str | os.PathLike[str], *, key: str | None = None, columns: Columns | None = None
) -> list[SFTRecord]:
    """The records of an SFT jsonl file named by config ``key`` (``DatasetError`` if missing, malformed or empty)."""
    return _read_records(path, key, columns, lambda line, col: SFTRecord(sft_example(line, col), line.line))


def read_rl_jsonl(
    path: str | os.PathLike[str], *, tokenizer: Any | None = None, key: str | None = None,
    columns: Columns | None = None,
) -> list[RLRecord]:
    """Like :func:`read_sft_jsonl`; ``tokenizer`` renders ``messages`` prompts (its chat template if any)."""

    def record(line: RowFields, col: Columns) -> RLRecord:
        prompt, messages, answer = rl_fields(line, col)
        if messages is not None:
            prompt = render_rl_prompt(line, col, messages, tokenizer)
        return RLRecord(Problem(prompt=prompt, answer=answer), line.line, messages)

    return _read_records(path, key, columns, record)


def load_sft_jsonl(path: str | os.PathLike[str], *, key: str | None = None) -> list[SFTExample]:
    """Like :func:`read_sft_jsonl`, but the examples only."""
    return [r.example for r in read_sft_jsonl(path, key=key)]


def load_rl_jsonl(
    path: str | os.PathLike[str], *, tokenizer: Any | None = None, key: str | None = None
) -> list[Problem]:
    """Like :func:`read_rl_jsonl`, but the problems only."""
    return [r.problem for r in read_rl_jsonl(path, tokenizer=tokenizer, key=key)]


def nonblank_lines(path: str | os.PathLike[str]) -> list[int]:
    """The 1-based line number of each record (non-blank line) of a jsonl file known to be readable UTF-8."""
    with open(path, "rb") as fh:
        lines = [raw.decode("utf-8", errors="replace").removeprefix("\ufeff") for raw in fh]
    return [n for n, line in enumerate(lines, start=1) if line.strip()]


def scan_jsonl(path: str | os.PathLike[str], *, key: str | None = None) -> int:
    """The number of records of a jsonl file, failing (``DatasetError``) at the first line that is no JSON object."""
    return len(_read_records(path, key, None, lambda line, col: line.line))
