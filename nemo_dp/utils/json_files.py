"""JSON files and JSON lines: reading with a caller-chosen error for text that is not JSON, atomic writing."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["load_json", "json_lines", "write_json", "write_json_lines"]


def load_json(path: Path, bad_json: Callable[[Exception], Exception]) -> Any:
    """The JSON document a UTF-8 file holds; ``bad_json(exc)`` (chained) is raised when it is not UTF-8 JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_json(exc) from exc


def json_lines(
    lines: Iterable[str], bad_json: Callable[[int, json.JSONDecodeError], Exception]
) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line; ``bad_json(lineno, exc)`` (chained) for one that is no JSON."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise bad_json(lineno, exc) from exc
        yield lineno, value


def write_json(path: Path, value: Any, **dumps_kwargs: Any) -> None:
    """Replace ``path`` atomically by ``json.dumps(value, **dumps_kwargs)`` (parent directories are created)."""
    _replace_text(path, json.dumps(value, **dumps_kwargs))


def write_json_lines(path: Path, records: Iterable[Any]) -> None:
    """Replace ``path`` atomically by one JSON line per record (parent directories are created)."""
    _replace_text(path, "".join(json.dumps(rec) + "\n" for rec in records))


def _replace_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
