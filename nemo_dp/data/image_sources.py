"""A user's image dataset (``env.sft_data`` / ``env.rl_data`` / ``env.val_data``) as trainer rows.

A jsonl file whose ``messages`` hold image parts (see :mod:`nemo_dp.data.images`) is recognised by
:func:`is_image_jsonl` and parsed by :func:`read_image_rows` (every image decoded, faults naming key,
``file:line``, field and path) into ``ImageSFTExample`` or ``Problem`` rows with an ``ImagePrompt``.
:func:`image_prompt_lengths` checks the policy's image processor and row lengths before Ray.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Optional

from nemo_dp.data.answer import with_row
from nemo_dp.data.arithmetic import Problem
from nemo_dp.data.columns import Columns
from nemo_dp.data.errors import DatasetError
from nemo_dp.data.image_rows import ImagePrompt, ImageSFTExample
from nemo_dp.data.images import has_image_parts, parse_image_messages
from nemo_dp.utils.json_files import json_lines

__all__ = ["ImageRows", "image_prompt_lengths", "is_image_jsonl", "is_image_rows", "read_image_rows"]

Kind = Literal["sft", "rl"]
#: ``(rows, line of each row)``.
ImageRows = tuple[list[Any], tuple[int, ...]]


def is_image_jsonl(spec: str, columns: Columns) -> bool:
    """Whether ``spec`` is a jsonl file with at least one row whose messages hold an image part.

    ``columns.messages`` names the turns' column.  Lines that are not JSON objects are skipped
    (the reader that takes the file reports them).
    """
    path = Path(spec)
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    with path.open(encoding="utf-8") as fh:
        for text in fh:
            if '"image"' not in text:  # cheap: only a line naming an image part is parsed
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and has_image_parts(obj.get(columns.messages)):
                return True
    return False


def _text_of(content: Any, fail: Any, field: str) -> str:
    if isinstance(content, str):
        return content
    if any(p["type"] != "text" for p in content):
        raise fail("must be text: an SFT response (the last assistant turn) cannot hold images", field)
    return "".join(p["text"] for p in content)


def _answer(obj: Mapping[str, Any], col: Columns, fail: Any) -> str:
    if col.answer not in obj:
        raise fail("is missing; an RL row needs the reference answer", col.answer)
    value = obj[col.answer]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise fail(f"must be a string or an integer, got {type(value).__name__}", col.answer)
    return str(value)


def _row(obj: Any, kind: Kind, col: Columns, file: Path, lineno: int, key: Optional[str]) -> Any:
    def fail(problem: str, field: Optional[str] = None) -> DatasetError:
        return DatasetError(problem, key=key, path=str(file), line=lineno, field=field)

    if not isinstance(obj, dict):
        raise fail(f"must be a JSON object, got {type(obj).__name__}")
    turns = parse_image_messages(obj.get(col.messages), jsonl_path=file, line=lineno, key=key)
    last, last_field = turns[-1], f"messages[{len(turns) - 1}]"
    if kind == "sft":
        if last["role"] != "assistant":
            raise fail(
                f"is {last['role']!r}; an SFT conversation must end with an 'assistant' turn", f"{last_field}.role"
            )
        if len(turns) < 2:
            raise fail("holds only the assistant's turn; an SFT conversation needs a prompt before it", "messages")
        response = _text_of(last["content"], fail, f"{last_field}.content")
        return ImageSFTExample(ImagePrompt(tuple(turns[:-1])), response)
    if last["role"] == "assistant":
        raise fail("is 'assistant'; an RL prompt must end before the answer", f"{last_field}.role")
    answer = _answer(obj, col, fail)
    others = {k: v for k, v in obj.items() if k not in (col.prompt, col.messages)}
    return Problem(prompt=ImagePrompt(tuple(turns)), answer=with_row(answer, turns, chat=True, columns=others))


@lru_cache(maxsize=8)
def _read(path: str, version: tuple[int, int], kind: Kind, col: Columns, key: Optional[str]) -> ImageRows:
    del version  # part of the cache key only: an edited file is read again
    file = Path(path)
    rows: list[Any] = []
    lines: list[int] = []
    with file.open(encoding="utf-8") as fh:
        for lineno, obj in json_lines(
            fh, lambda n, exc: DatasetError(f"is not valid JSON: {exc.msg}", key=key, path=path, line=n)
        ):
            rows.append(_row(obj, kind, col, file, lineno, key))
            lines.append(lineno)
    if not rows:
        raise DatasetError("holds no rows", key=key, path=path)
    return rows, tuple(lines)


def read_image_rows(spec: str, *, kind: Kind, columns: Columns, key: Optional[str]) -> ImageRows:
    """Parse and check every row of an image jsonl file (cached per file version and setting).

    ``kind`` is ``"sft"`` (conversations ending with the assistant's turn) or ``"rl"`` (prompt
    turns plus the ``columns.answer`` column; held-out sets too).  Image paths are relative to
    the file.

    Returns:
        ``(rows, lines)``: ``ImageSFTExample`` or ``Problem`` rows in file order (a fresh
        list), and each row's line number.

    Raises:
        DatasetError: Bad JSON, a malformed row, a missing or unreadable image (key,
            ``file:line``, field and path), or an empty file.
    """
    path = str(Path(spec))
    stat = Path(path).stat()
    rows, lines = _read(path, (stat.st_mtime_ns, stat.st_size), kind, columns, key)
    return list(rows), lines


def is_image_rows(rows: Sequence[Any]) -> bool:
    """Whether ``rows`` came from :func:`read_image_rows`."""
    if not rows:
        return False
    first = rows[0]
    return isinstance(first, ImageSFTExample) or isinstance(getattr(first, "prompt", None), ImagePrompt)


def image_prompt_lengths(
    rows: Sequence[Any], lines: Sequence[int], tokenizer: Any, *, key: str, path: str, sft: bool
) -> list[int]:
    """Token count of each :func:`read_image_rows` row as the policy's workers encode it.

    A vision-language tokenizer (``policy=hf_vlm``) carries its image processor as ``processor``.
    With ``sft`` the rows are SFT examples (prompt plus response and eos) rather than prompts.

    Raises:
        DatasetError: The policy reads no images (use ``policy=hf_vlm``), or a row cannot be
            encoded (naming ``file:line``).
    """
    processor = getattr(tokenizer, "processor", None)
    if processor is None:
        first = next((i for i, r in enumerate(rows) if r.prompt.image_paths()), 0)
        raise DatasetError(
            "holds image parts, but the policy reads text only (its tokenizer has no image processor)",
            key=key,
            path=path,
            line=lines[first],
            fix="use policy=hf_vlm (a vision-language model) for an image dataset",
        )
    out: list[int] = []
    for row, line in zip(rows, lines):
        try:
            n = len(processor.encode_messages(row.prompt.messages()).input_ids)
            if sft:
                n += len(tokenizer.encode_response(row.response))
        except (OSError, ValueError) as exc:
            raise DatasetError(
                f"cannot be encoded by the policy's processor: {exc}", key=key, path=path, line=line
            ) from exc
        out.append(n)
    return out
