"""The datasets a configuration names, built in one place for training and for the pre-Ray check.

A ``DataSource`` is a user's table (read lazily; cached per process, so check and trainer share one
parse) or the built-in arithmetic generator, with the config key to change.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Optional, Union, overload

from nemo_dp.data.answer import with_row
from nemo_dp.data.arithmetic import ArithmeticTask, Problem
from nemo_dp.data.chat import ChatExample, Message, SFTExample, render_prompt
from nemo_dp.data.columns import Columns, columns_of
from nemo_dp.data.errors import DatasetError
from nemo_dp.data import visual_sources as _visual
from nemo_dp.data.image_sources import is_image_jsonl, read_image_rows
from nemo_dp.data.jsonl import read_rl_jsonl, read_sft_jsonl, render_rl_prompt, rl_fields, sft_example
from nemo_dp.data.tables import Table, check_rows, open_table

__all__ = [
    "DataSource", "data_setting", "arithmetic_task", "sft_source", "rl_source", "val_source", "build_val_problems",
]

Row = Union[SFTExample, Problem]

#: Each dataset's key and the older name it still answers to.
DATA_KEYS: dict[str, tuple[str, str]] = {
    "sft": ("sft_data", "sft_jsonl"), "rl": ("rl_data", "rl_jsonl"), "val": ("val_data", "val_jsonl"),
}


@dataclass(frozen=True)
class DataSource:
    """One configured dataset and its rows.

    Attributes:
        key: The config key to change: the data key (``env.rl_data``) or the generator's size key.
        path: What the data key holds (a file, glob or directory); None for the generator.
        total: Rows in the whole table (``rows`` may be its first ``val_samples``).
        memo: Results computed from the rows once per process (token lengths per tokenizer).
        lines: Each row's line in ``path`` when read without a table (an image jsonl file), else None.
    """

    key: str
    path: Optional[str]
    rows: Sequence[Any]
    table: Optional[Table] = None
    total: int = 0
    memo: dict[Any, Any] = field(default_factory=dict, compare=False)
    lines: Optional[tuple[int, ...]] = None

    @property
    def label(self) -> str:
        """The file path or the generator, for messages."""
        return self.path if self.path is not None else "the built-in arithmetic generator"

    def locate(self, i: int) -> dict[str, Optional[int]]:
        """Where row ``i`` is, as ``DatasetError`` keywords (``line`` for jsonl, else ``row``)."""
        if self.lines is not None:
            return {"line": self.lines[i], "row": None}
        if self.table is None:
            return {"line": None, "row": None}
        return self.table.locate(i)


class _TableRows(Sequence[Any]):
    """The rows of a checked table, built on access (``stop``: only the first rows)."""

    def __init__(self, table: Table, col: Columns, kind: str, tokenizer: Any, stop: Optional[int] = None) -> None:
        self.table, self.col, self.kind, self.tokenizer = table, col, kind, tokenizer
        self.n = len(table) if stop is None else min(int(stop), len(table))

    def __len__(self) -> int:
        return self.n

    def _build(self, i: int, row: dict[str, Any]) -> Any:
        fields = self.table.fields(i, row)
        col = self.col
        if self.kind == "sft":
            return sft_example(fields, col)
        prompt, messages, answer = rl_fields(fields, col)
        if messages is not None:
            prompt = render_rl_prompt(fields, col, messages, self.tokenizer)
        chat = messages is not None
        shown = row[col.messages] if chat else row[col.prompt]
        others = {k: v for k, v in row.items() if k not in (col.prompt, col.messages)}
        return Problem(prompt=prompt, answer=with_row(answer, shown, chat=chat, columns=others))

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.n))]
        i = int(index)
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(f"row {index} out of range for {self.n} rows")
        return self._build(i, self.table.dataset[i])

    def __iter__(self) -> Iterator[Any]:
        for i, row in enumerate(self.table.iter_rows(self.n)):
            yield self._build(i, row)

    def prompt_texts(self) -> Iterator[str]:
        """The RL prompt text of each row, reading only the prompt column of text prompts."""
        if self.kind == "rl" and self.col.messages not in self.table.column_names:
            yield from self.table.column_values(self.col.prompt, self.n)
            return
        for problem in self:
            yield problem.prompt


def data_setting(env_cfg: Any, role: str) -> tuple[Optional[str], Optional[str]]:
    """The key and value that set dataset ``role`` (``"sft"``, ``"rl"``, ``"val"``) in ``env``, or ``(None, None)``;
    ``DatasetError`` when both the key and its older name are set."""
    new, old = DATA_KEYS[role]
    a, b = getattr(env_cfg, new, None), getattr(env_cfg, old, None)
    if a is not None and b is not None:
        raise DatasetError(
            f"env.{new} and env.{old} are both set; env.{old} is the older name of env.{new}: set one", key=f"env.{new}"
        )
    if a is not None:
        return f"env.{new}", str(a)
    if b is not None:
        return f"env.{old}", str(b)
    return None, None


def _table_source(env_cfg: Any, role: str, kind: str, tokenizer: Any, stop: Optional[int] = None) -> Optional[DataSource]:
    key, spec = data_setting(env_cfg, role)
    if key is None or spec is None:
        return None
    split = getattr(env_cfg, "split", None)
    col = columns_of(env_cfg)
    if is_image_jsonl(spec, col):
        rows, lines = read_image_rows(spec, kind="sft" if kind == "sft" else "rl", columns=col, key=key)
        total = len(rows)
        if stop is not None:
            rows, lines = rows[: int(stop)], lines[: int(stop)]
        return DataSource(key, spec, rows, total=total, lines=lines)

    def strict(path: str) -> Any:
        if kind == "sft":
            return read_sft_jsonl(path, key=key, columns=col)
        return read_rl_jsonl(path, key=key, columns=col, tokenizer=tokenizer)

    table = open_table(spec, key=key, split=None if split is None else str(split), strict=strict)
    check_rows(table, kind, col)
    rows = _TableRows(table, col, kind, tokenizer, stop)
    return DataSource(key, spec, rows, table=table, total=len(table), memo=table.memo)


@lru_cache(maxsize=8)
def _task(digits: int, operators: tuple[str, ...], seed: int) -> ArithmeticTask:
    return ArithmeticTask(digits, operators, seed)


def arithmetic_task(env_cfg: Any) -> ArithmeticTask:
    """The built-in task ``env`` describes, one shared instance per setting (draws do not change it)."""
    return _task(int(env_cfg.digits), tuple(str(op) for op in env_cfg.operators), int(env_cfg.seed))


def _chat_format(env_cfg: Any) -> bool:
    fmt = str(getattr(env_cfg, "format", "plain") or "plain")
    if fmt not in ("plain", "chat"):
        raise DatasetError(f"unknown format {fmt!r}; legal values: ['plain', 'chat']", key="env.format")
    return fmt == "chat"


def _generated(key: str, draw: Any, n: int, *, answer_column: Optional[str] = None) -> DataSource:
    """Generated problems; with ``answer_column`` (RL) each answer carries its row ``{answer_column: answer}``."""
    try:
        problems = draw(n)
    except ValueError as exc:
        raise DatasetError(str(exc), key=key, fix=f"lower {key} or raise env.digits") from exc
    if answer_column is not None:
        problems = [
            Problem(prompt=p.prompt, answer=with_row(p.answer, p.prompt, columns={answer_column: p.answer}))
            for p in problems
        ]
    return DataSource(key=key, path=None, rows=problems, total=len(problems))


def sft_source(env_cfg: Any, num_samples: int, *, num_samples_key: str) -> DataSource:
    """SFT examples: ``env.sft_data`` when set, else ``num_samples`` (config ``num_samples_key``) generated pairs;
    ``DatasetError`` names the key, file, line and field at fault."""
    if _visual.is_visual_env(env_cfg):
        rows = _visual.visual_sft_rows(env_cfg, int(num_samples), num_samples_key=num_samples_key)
        return DataSource(num_samples_key, None, list(rows), total=len(rows))
    table = _table_source(env_cfg, "sft", "sft", None)
    if table is not None:
        return table
    src = _generated(num_samples_key, arithmetic_task(env_cfg).train_problems, int(num_samples))
    if _chat_format(env_cfg):
        rows: list[Any] = [ChatExample((Message("user", p.prompt), Message("assistant", p.answer))) for p in src.rows]
    else:
        rows = [(p.prompt, p.answer) for p in src.rows]
    return DataSource(src.key, None, rows, total=len(rows))


def rl_source(env_cfg: Any, num_prompts: int, *, num_prompts_key: str, tokenizer: Any | None) -> DataSource:
    """Like :func:`sft_source`, but ``Problem`` rows of ``env.rl_data``; ``tokenizer`` renders ``messages`` prompts."""
    return _problem_source(env_cfg, num_prompts, num_prompts_key, tokenizer, held_out=False)


def val_source(env_cfg: Any, val_samples: int, *, val_samples_key: str, tokenizer: Any | None) -> DataSource:
    """Like :func:`rl_source`, but the first ``val_samples`` of ``env.val_data`` (every row of a file is checked)."""
    return _problem_source(env_cfg, val_samples, val_samples_key, tokenizer, held_out=True)


def _problem_source(env_cfg: Any, n: Any, key: str, tokenizer: Any | None, *, held_out: bool) -> DataSource:
    if _visual.is_visual_env(env_cfg):
        if held_out:
            rows = _visual.visual_val_rows(env_cfg, int(n), val_samples_key=key)
        else:
            rows = _visual.visual_rl_rows(env_cfg, int(n), num_prompts_key=key)
        return DataSource(key, None, list(rows), total=len(rows))
    table = _table_source(env_cfg, "val" if held_out else "rl", "rl", tokenizer, stop=int(n) if held_out else None)
    if table is not None:
        return table
    task = arithmetic_task(env_cfg)
    problems = task.eval_problems if held_out else task.train_problems
    src = _generated(key, problems, int(n), answer_column=columns_of(env_cfg).answer)
    if not _chat_format(env_cfg):
        return src
    rows = [
        Problem(
            prompt=render_prompt((Message("user", p.prompt),), tokenizer),
            answer=with_row(p.answer, [{"role": "user", "content": p.prompt}], chat=True, columns=p.answer.columns),
        )
        for p in src.rows
    ]
    return DataSource(src.key, None, rows, total=src.total)


def build_val_problems(master_config: Any, tokenizer: Any | None = None) -> list[Problem]:
    """The ``algorithm.val_samples`` held-out problems of a phase config (fewer if ``env.val_data`` holds fewer)."""
    src = val_source(
        master_config.env, int(master_config.algorithm.val_samples), val_samples_key="algorithm.val_samples",
        tokenizer=tokenizer,
    )
    return list(src.rows)
