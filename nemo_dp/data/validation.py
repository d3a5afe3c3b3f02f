"""Check every configured dataset on the driver before Ray starts, with the trainers' own ``data.sources``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from nemo_dp.data.arithmetic import Problem
from nemo_dp.data.chat import ChatExample, encode_prompt_text, tokenize_sft_example
from nemo_dp.data.columns import columns_of
from nemo_dp.data.errors import DatasetError, UnknownCharacterError
from nemo_dp.data.image_sources import image_prompt_lengths, is_image_rows
from nemo_dp.data.sources import DataSource, rl_source, sft_source, val_source
from nemo_dp.data.visual_sources import is_visual_env, validate_visual_datasets

__all__ = ["DatasetCheck", "DatasetReport", "get_dotted", "sft_phases", "validate_datasets"]

_MAX_SEQ_LEN_KEY = "policy.model.max_seq_len"
_NEW_TOKENS_KEY = "policy.generation.max_new_tokens"


@dataclass(frozen=True)
class DatasetCheck:
    """What was checked for one dataset (``longest``: RL prompts count ``max_new_tokens``); ``columns``: for a
    rewarded set, what a reward function receives besides ``completions`` and ``prompts``."""

    phase: str
    role: str
    key: str
    source: str
    rows: int
    longest: int
    limit: int
    note: str = ""
    columns: tuple[str, ...] = ()

    def describe(self) -> str:
        line = (
            f"{self.phase} {self.role}: {self.rows} rows from {self.source} ({self.key}), "
            f"longest {self.longest} / {self.limit} tokens"
        )
        return f"{line}; NOTE: {self.note}" if self.note else line


@dataclass
class DatasetReport:
    """The outcome of ``validate_datasets``: one ``DatasetCheck`` per dataset, in run order."""

    checks: list[DatasetCheck] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [c.describe() for c in self.checks]

    def reward_columns(self) -> list[tuple[str, tuple[str, ...]]]:
        """``(key, columns)`` of every rewarded set: what reward functions are called with."""
        return [(c.key, c.columns) for c in self.checks if c.role == "val" or c.phase in ("grpo", "ppo")]


def _unencodable(text: str, tokenizer: Any) -> Optional[str]:
    try:
        tokenizer.encode(text)
    except UnknownCharacterError as exc:
        return exc.char
    except ValueError:
        for ch in dict.fromkeys(text):
            try:
                tokenizer.encode(ch)
            except ValueError:
                return ch
        return text
    return None


def _text_fields(row: Any) -> list[tuple[str, str]]:
    if isinstance(row, ChatExample):
        return [(f"messages[{i}].content", m.content) for i, m in enumerate(row.messages)]
    if isinstance(row, Problem):
        return [("prompt", row.prompt)]
    return [("prompt", row[0]), ("response", row[1])]


def _encoding_error(src: DataSource, i: int, exc: ValueError, tokenizer: Any) -> DatasetError:
    for name, text in _text_fields(src.rows[i]):
        bad = _unencodable(text, tokenizer)
        if bad is not None:
            shown = f"character {bad!r}" if len(bad) == 1 else f"text {bad!r}"
            return DatasetError(
                f"holds {shown}, which the tokenizer cannot encode",
                key=src.key,
                path=src.label,
                field=name if src.path is not None else None,
                fix="remove it from the data or use a tokenizer whose vocabulary has it",
                **src.locate(i),
            )
    return DatasetError(f"cannot be tokenized: {exc}", key=src.key, path=src.label, **src.locate(i))


def _lengths(src: DataSource, tokenizer: Any, *, sft: bool) -> list[int]:
    """Token count of every row; kept on the source's table, so each is tokenized once."""
    memo_key = ("sft" if sft else "rl", len(src.rows), getattr(src.rows, "col", None))
    hit = src.memo.get(memo_key)
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    out: list[int] = []
    if src.lines is not None and is_image_rows(src.rows):
        out = image_prompt_lengths(src.rows, src.lines, tokenizer, key=src.key, path=src.label, sft=sft)
        src.memo[memo_key] = (tokenizer, out)
        return out
    texts = getattr(src.rows, "prompt_texts", None)
    items: Any = src.rows if sft else texts() if texts is not None else (row.prompt for row in src.rows)
    for i, item in enumerate(items):
        try:
            out.append(len(tokenize_sft_example(item, tokenizer).ids if sft else encode_prompt_text(item, tokenizer)))
        except DatasetError:  # a row the chat template cannot render names itself
            raise
        except ValueError as exc:
            raise _encoding_error(src, i, exc, tokenizer) from exc
    src.memo[memo_key] = (tokenizer, out)
    return out


def _check_lengths(
    src: DataSource, lengths: Sequence[int], *, extra: int, limit: int, limit_key: str, what: str
) -> int:
    totals = [n + extra for n in lengths]
    over = [i for i, n in enumerate(totals) if n > limit]
    if over:
        first = over[0]
        need = max(totals)
        tail = f" with {_NEW_TOKENS_KEY}={extra}" if extra else ""
        fix = f"raise {limit_key} to at least {need}"
        fix += f" or lower {_NEW_TOKENS_KEY}" if extra else ""
        fix += f", or shorten or drop the {len(over)} row(s) this long"
        raise DatasetError(
            f"{what} has {lengths[first]} tokens{tail}: {totals[first]} > {limit_key}={limit}",
            key=src.key,
            path=src.label,
            fix=fix,
            **src.locate(first),
        )
    return max(totals)


def _check_size(src: DataSource, batch: int, batch_key: str) -> None:
    if len(src.rows) < batch:
        what = "file holds" if src.path is not None else "generator yields"
        raise DatasetError(
            f"the {what} {len(src.rows)} rows, fewer than {batch_key}={batch} (one batch)",
            key=src.key,
            path=src.path,
            fix=f"add rows or lower {batch_key}",
        )


def _reward_columns(src: DataSource, env_cfg: Any) -> tuple[str, ...]:
    col = columns_of(env_cfg)
    if src.lines is not None and is_image_rows(src.rows):
        return tuple(src.rows[0].answer.columns)
    if src.table is None:
        return (col.answer,)
    return tuple(c for c in src.table.column_names if c not in (col.prompt, col.messages))


def get_dotted(node: Any, dotted: str) -> Any:
    """``node.a.b`` for ``dotted`` ``"a.b"`` (attribute access at every level)."""
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def sft_phases(algo: Any, sft_phase: Callable[[str, str, str], None]) -> bool:
    """Check a run's SFT phases with ``sft_phase(phase, num_samples_key, val_samples_key)``; return whether the
    run is all SFT (else an enabled ``warm_start`` was checked and the RL phase is left to the caller)."""
    if str(algo.name) == "sft":
        sft_phase("sft", "algorithm.num_train_samples", "algorithm.val_samples")
        return True
    warm = getattr(algo, "warm_start", None)
    if warm is not None and bool(warm.enabled):
        sft_phase("warm_start", "algorithm.warm_start.num_train_samples", "algorithm.warm_start.val_samples")
    return False


def validate_datasets(
    cfg: Any, tokenizer: Any, *, max_seq_len: Optional[int] = None, max_seq_len_key: str = _MAX_SEQ_LEN_KEY
) -> DatasetReport:
    """Open, parse, tokenize and length-check every dataset ``cfg`` (root config) will use.

    Per phase (an enabled ``algorithm.warm_start`` first): every row tokenizes and fits ``max_seq_len``
    (default: the value of ``max_seq_len_key``; prompts plus ``max_new_tokens``), and a training set
    holds at least one batch.  ``DatasetError`` names the first problem's key, file:line and field.
    """
    if is_visual_env(cfg.env):
        return validate_visual_datasets(cfg, tokenizer)
    limit = int(max_seq_len if max_seq_len is not None else get_dotted(cfg, max_seq_len_key))
    new_tokens = int(cfg.policy.generation.max_new_tokens)
    sft_batch = int(cfg.policy.train_global_batch_size)
    env_cfg, algo = cfg.env, cfg.algorithm
    report = DatasetReport()

    def longest_prompt(src: DataSource) -> int:
        lengths = _lengths(src, tokenizer, sft=False)
        return _check_lengths(src, lengths, extra=new_tokens, limit=limit, limit_key=max_seq_len_key, what="prompt")

    def sft_phase(phase: str, num_key: str, val_key: str) -> None:
        src = sft_source(env_cfg, int(get_dotted(cfg, num_key)), num_samples_key=num_key)
        longest = _check_lengths(
            src, _lengths(src, tokenizer, sft=True), extra=0, limit=limit, limit_key=max_seq_len_key, what="example"
        )
        _check_size(src, sft_batch, "policy.train_global_batch_size")
        report.checks.append(DatasetCheck(phase, "train", src.key, src.label, len(src.rows), longest, limit))
        val(phase, val_key)

    def val(phase: str, val_key: str) -> None:
        want = int(get_dotted(cfg, val_key))
        src = val_source(env_cfg, want, val_samples_key=val_key, tokenizer=tokenizer)
        longest = longest_prompt(src)
        note = ""
        if src.path is not None and len(src.rows) < want:
            note = f"the file holds {len(src.rows)} rows, fewer than {val_key}={want}: all {len(src.rows)} are used"
        report.checks.append(
            DatasetCheck(phase, "val", src.key, src.label, len(src.rows), longest, limit, note, _reward_columns(src, env_cfg))
        )

    name = str(algo.name)
    if sft_phases(algo, sft_phase):
        return report
    src = rl_source(
        env_cfg, int(algo.num_train_prompts), num_prompts_key="algorithm.num_train_prompts", tokenizer=tokenizer
    )
    longest = longest_prompt(src)
    _check_size(src, int(algo.num_prompts_per_step), "algorithm.num_prompts_per_step")
    report.checks.append(
        DatasetCheck(name, "train", src.key, src.label, len(src.rows), longest, limit, columns=_reward_columns(src, env_cfg))
    )
    val(name, "algorithm.val_samples")
    return report
