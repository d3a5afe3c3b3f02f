"""Chat jsonl rows whose messages hold images: parsing, path resolution and image checks.

Content parts are ``{"type": "text", ...}`` or ``{"type": "image", "image": "<path>"}`` (paths
relative to the jsonl file).  Every image is decoded at parse time, so a bad one fails before
anything starts with a ``DatasetError`` naming key, ``file:line``, field and path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from nemo_dp.data.chat import ROLES
from nemo_dp.data.errors import DatasetError
from nemo_dp.utils.json_files import json_lines

__all__ = [
    "ImageChatRow", "has_image_parts", "image_paths", "load_image", "load_image_jsonl", "parse_image_messages",
    "with_loaded_images",
]

Kind = Literal["rl", "sft"]


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


@dataclass(frozen=True)
class _Where:
    key: str | None
    path: str
    line: int

    def fail(self, problem: str, field: str | None = None) -> DatasetError:
        return DatasetError(problem, key=self.key, path=self.path, line=self.line, field=field)


def has_image_parts(messages: Any) -> bool:
    """Whether any turn's content is a list holding an ``{"type": "image"}`` part."""
    if not isinstance(messages, list):
        return False
    for turn in messages:
        content = turn.get("content") if isinstance(turn, Mapping) else None
        if isinstance(content, list) and any(isinstance(p, Mapping) and p.get("type") == "image" for p in content):
            return True
    return False


def load_image(path: str | Path) -> Any:
    """Open and fully decode an image file as an RGB ``PIL.Image.Image``.

    Raises:
        FileNotFoundError: The file does not exist.
        OSError: Pillow cannot read it (``PIL.UnidentifiedImageError`` is an ``OSError``).
    """
    from PIL import Image

    with Image.open(path) as img:
        img.load()
        return img.convert("RGB")


def _image_path(part: Mapping[str, Any], base_dir: Path, where: _Where, field: str) -> str:
    value = part.get("image")
    if not isinstance(value, str) or not value:
        raise where.fail(f"must be a non-empty path string, got {_type(value)}", field)
    resolved = Path(value) if Path(value).is_absolute() else base_dir / value
    if not resolved.is_file():
        raise where.fail(f"names image {value!r}, but {str(resolved)!r} does not exist", field)
    try:
        load_image(resolved)
    except OSError as exc:
        raise where.fail(f"names image {str(resolved)!r}, which cannot be read as an image: {exc}", field) from exc
    return str(resolved)


def _parse_content(content: Any, base_dir: Path, where: _Where, field: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise where.fail(f"must be a string or a non-empty list of text / image parts, got {_type(content)}", field)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        pfield = f"{field}[{j}]"
        if not isinstance(part, Mapping):
            raise where.fail(f"must be an object with a 'type', got {_type(part)}", pfield)
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise where.fail(f"must be a string, got {_type(text)}", f"{pfield}.text")
            parts.append({"type": "text", "text": text})
        elif kind == "image":
            parts.append({"type": "image", "image": _image_path(part, base_dir, where, f"{pfield}.image")})
        else:
            raise where.fail(f"is {kind!r}; a part's type is 'text' or 'image'", f"{pfield}.type")
    return parts


def parse_image_messages(
    messages: Any, *, jsonl_path: str | Path, line: int, key: str | None = None
) -> list[dict[str, Any]]:
    """Check one row's ``messages`` and return its turns as plain dicts, image paths resolved.

    Image paths are relative to ``jsonl_path``'s directory and come back absolute; every image is
    decoded.  ``line`` is 1-based; ``key`` names the file's config key in errors.

    Raises:
        DatasetError: A malformed turn or part, a missing image or one Pillow cannot read
            (naming ``file:line``, the field and the path).
    """
    where = _Where(key, str(jsonl_path), line)
    if not isinstance(messages, list) or not messages:
        raise where.fail(f"must be a non-empty list of {{role, content}} objects, got {_type(messages)}", "messages")
    base_dir = Path(jsonl_path).resolve().parent
    out: list[dict[str, Any]] = []
    for i, turn in enumerate(messages):
        field = f"messages[{i}]"
        if not isinstance(turn, Mapping) or "role" not in turn or "content" not in turn:
            raise where.fail("must be an object with 'role' and 'content'", field)
        role = turn["role"]
        if role not in ROLES:
            raise where.fail(f"is {role!r}, not one of {list(ROLES)}", f"{field}.role")
        out.append({"role": role, "content": _parse_content(turn["content"], base_dir, where, f"{field}.content")})
    return out


def image_paths(turns: Sequence[Mapping[str, Any]]) -> list[str]:
    """The ``"image"`` paths of the image parts of ``turns``, in order."""
    return [
        p["image"] for turn in turns if isinstance(turn["content"], list) for p in turn["content"] if p["type"] == "image"
    ]


def with_loaded_images(turns: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``turns`` with each image part's path replaced by the loaded RGB ``PIL`` image."""
    out: list[dict[str, Any]] = []
    for turn in turns:
        content = turn["content"]
        if isinstance(content, list):
            content = [
                {"type": "image", "image": load_image(p["image"])} if p["type"] == "image" else dict(p)
                for p in content
            ]
        out.append({"role": turn["role"], "content": content})
    return out


@dataclass(frozen=True)
class ImageChatRow:
    """One parsed row and its line number.

    Attributes:
        messages: The turns (image parts hold resolved paths); for SFT the last is the assistant's.
        answer: The RL reference answer (``None`` for SFT).
    """

    messages: tuple[dict[str, Any], ...]
    answer: str | None
    line: int

    def image_paths(self) -> list[str]:
        """Like :func:`image_paths`."""
        return image_paths(self.messages)

    def messages_with_images(self) -> list[dict[str, Any]]:
        """Like :func:`with_loaded_images`."""
        return with_loaded_images(self.messages)


def _answer(obj: Mapping[str, Any], where: _Where) -> str:
    if "answer" not in obj:
        raise where.fail("is missing; an RL row needs the reference answer", "answer")
    value = obj["answer"]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise where.fail(f"must be a string or an integer, got {_type(value)}", "answer")
    return str(value)


def load_image_jsonl(path: str | Path, *, kind: Kind, key: str | None = None) -> list[ImageChatRow]:
    """Read an RL or SFT jsonl file whose messages may hold image parts: one row per non-blank line.

    ``kind`` is ``"rl"`` (prompt turns ending with a non-assistant turn, plus ``answer``) or
    ``"sft"`` (a conversation ending with the assistant's turn).  Image paths are relative to the file.

    Raises:
        DatasetError: A missing file, bad JSON, a malformed row, a missing or unreadable image
            (``file:line``, field and path), or an empty file.
        ValueError: ``kind`` is neither ``"rl"`` nor ``"sft"``.
    """
    if kind not in ("rl", "sft"):
        raise ValueError(f"load_image_jsonl: kind must be 'rl' or 'sft', got {kind!r}")
    file = Path(path)
    if not file.is_file():
        raise DatasetError("does not exist or is not a file", key=key, path=str(file))
    rows: list[ImageChatRow] = []
    with file.open(encoding="utf-8") as fh:
        for lineno, obj in json_lines(fh, lambda n, e: _Where(key, str(file), n).fail(f"is not valid JSON: {e.msg}")):
            where = _Where(key, str(file), lineno)
            if not isinstance(obj, dict):
                raise where.fail(f"must be a JSON object, got {_type(obj)}")
            messages = parse_image_messages(obj.get("messages"), jsonl_path=file, line=lineno, key=key)
            last = messages[-1]["role"]
            last_field = f"messages[{len(messages) - 1}].role"
            if kind == "sft" and last != "assistant":
                raise where.fail(f"is {last!r}; an SFT conversation must end with an 'assistant' turn", last_field)
            if kind == "rl" and last == "assistant":
                raise where.fail("is 'assistant'; an RL prompt must end before the answer", last_field)
            answer = _answer(obj, where) if kind == "rl" else None
            rows.append(ImageChatRow(tuple(messages), answer, lineno))
    if not rows:
        raise DatasetError("holds no rows", key=key, path=str(file))
    return rows
