"""The datasets a configuration names, built in one place for training and for the check
before Ray starts.

Each dataset is either a jsonl file (``env.sft_jsonl``, ``env.rl_jsonl``, ``env.val_jsonl``)
or the built-in arithmetic generator sized by an ``algorithm`` key, presented plain or, with
``env.format=chat``, as one-turn conversations (rendered by the tokenizer's chat template). ``DataSource`` says which,
names the config key a user would change, and carries the rows with their line numbers, so
that the preflight check (``nemo_dp.data.validation``) and the trainer inputs load exactly
the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional, Union

from nemo_dp.data.arithmetic import ArithmeticTask, Problem
from nemo_dp.data.chat import ChatExample, Message, SFTExample, render_prompt
from nemo_dp.data.datasets import RLPromptDataset, SFTDataset
from nemo_dp.data.errors import DatasetError
from nemo_dp.data import visual_sources as _visual
from nemo_dp.data.jsonl import read_rl_jsonl, read_sft_jsonl

__all__ = [
    "DataSource",
    "arithmetic_task",
    "sft_source",
    "rl_source",
    "val_source",
    "build_train_dataset",
    "build_val_problems",
]

Row = Union[SFTExample, Problem]


@dataclass(frozen=True)
class DataSource:
    """One configured dataset and its rows.

    Attributes:
        key: The config key to change for this dataset: the jsonl key (``env.sft_jsonl``) or
            the generator's size key (``algorithm.num_train_samples``).
        path: The jsonl file, or None for the built-in generator.
        rows: SFT examples or RL problems, in dataset order.
        lines: The 1-based file line of each row (None for generated rows).
    """

    key: str
    path: Optional[str]
    rows: list[Any]
    lines: list[Optional[int]]

    @property
    def label(self) -> str:
        """Where the rows come from, for messages: the file path or the generator."""
        return self.path if self.path is not None else "the built-in arithmetic generator"


@lru_cache(maxsize=8)
def _task(digits: int, operators: tuple[str, ...], seed: int) -> ArithmeticTask:
    return ArithmeticTask(digits, operators, seed)


def arithmetic_task(env_cfg: Any) -> ArithmeticTask:
    """The built-in task ``env`` describes (``env.digits``, ``env.operators``, ``env.seed``).

    One instance per setting is shared, so its enumerated problem space is built once for the
    check before Ray starts and the trainers' datasets (draws do not change the instance).
    """
    return _task(int(env_cfg.digits), tuple(str(op) for op in env_cfg.operators), int(env_cfg.seed))


def _chat_format(env_cfg: Any) -> bool:
    fmt = str(getattr(env_cfg, "format", "plain") or "plain")
    if fmt not in ("plain", "chat"):
        raise DatasetError(f"unknown format {fmt!r}; legal values: ['plain', 'chat']", key="env.format")
    return fmt == "chat"


def _as_chat(problems: list[Problem], tokenizer: Any | None) -> list[Problem]:
    return [Problem(prompt=render_prompt((Message("user", p.prompt),), tokenizer), answer=p.answer) for p in problems]


def _generated(key: str, draw: Any, n: int) -> DataSource:
    try:
        problems = draw(n)
    except ValueError as exc:
        raise DatasetError(str(exc), key=key, fix=f"lower {key} or raise env.digits") from exc
    return DataSource(key=key, path=None, rows=problems, lines=[None] * len(problems))


def sft_source(env_cfg: Any, num_samples: int, *, num_samples_key: str) -> DataSource:
    """SFT examples: ``env.sft_jsonl`` when set, else ``num_samples`` generated pairs.

    Args:
        env_cfg: The ``env`` node.
        num_samples: Generated examples (ignored for a file).
        num_samples_key: The key holding ``num_samples``, e.g. ``algorithm.num_train_samples``.

    Returns:
        The source; rows are ``(prompt, response)`` pairs and/or ``ChatExample``.

    Raises:
        DatasetError: Naming the key, file, line and field at fault.
    """
    if _visual.is_visual_env(env_cfg):
        rows = _visual.visual_sft_rows(env_cfg, int(num_samples), num_samples_key=num_samples_key)
        return DataSource(num_samples_key, None, list(rows), [None] * len(rows))
    if env_cfg.sft_jsonl is not None:
        path = str(env_cfg.sft_jsonl)
        records = read_sft_jsonl(path, key="env.sft_jsonl")
        return DataSource("env.sft_jsonl", path, [r.example for r in records], [r.line for r in records])
    src = _generated(num_samples_key, arithmetic_task(env_cfg).train_problems, int(num_samples))
    if _chat_format(env_cfg):
        rows: list[Any] = [ChatExample((Message("user", p.prompt), Message("assistant", p.answer))) for p in src.rows]
    else:
        rows = [(p.prompt, p.answer) for p in src.rows]
    return DataSource(src.key, None, rows, src.lines)


def rl_source(env_cfg: Any, num_prompts: int, *, num_prompts_key: str, tokenizer: Any | None) -> DataSource:
    """RL problems: ``env.rl_jsonl`` when set, else ``num_prompts`` generated problems.

    Args:
        env_cfg: The ``env`` node.
        num_prompts: Generated problems (ignored for a file).
        num_prompts_key: The key holding ``num_prompts``, e.g. ``algorithm.num_train_prompts``.
        tokenizer: Renders ``messages`` prompts (chat template when it has one).

    Returns:
        The source; rows are ``Problem``.

    Raises:
        DatasetError: Naming the key, file, line and field at fault.
    """
    if _visual.is_visual_env(env_cfg):
        rows = _visual.visual_rl_rows(env_cfg, int(num_prompts), num_prompts_key=num_prompts_key)
        return DataSource(num_prompts_key, None, list(rows), [None] * len(rows))
    if env_cfg.rl_jsonl is not None:
        path = str(env_cfg.rl_jsonl)
        records = read_rl_jsonl(path, tokenizer=tokenizer, key="env.rl_jsonl")
        return DataSource("env.rl_jsonl", path, [r.problem for r in records], [r.line for r in records])
    src = _generated(num_prompts_key, arithmetic_task(env_cfg).train_problems, int(num_prompts))
    if _chat_format(env_cfg):
        return DataSource(src.key, None, _as_chat(src.rows, tokenizer), src.lines)
    return src


def val_source(env_cfg: Any, val_samples: int, *, val_samples_key: str, tokenizer: Any | None) -> DataSource:
    """Held-out problems: the first ``val_samples`` of ``env.val_jsonl``, else generated ones.

    Every line of a file is parsed (a malformed line fails even past ``val_samples``).

    Args:
        env_cfg: The ``env`` node.
        val_samples: How many problems validation uses.
        val_samples_key: The key holding ``val_samples``, e.g. ``algorithm.val_samples``.
        tokenizer: Renders ``messages`` prompts (chat template when it has one).

    Returns:
        The source; rows are ``Problem``.

    Raises:
        DatasetError: Naming the key, file, line and field at fault.
    """
    if _visual.is_visual_env(env_cfg):
        rows = _visual.visual_val_rows(env_cfg, int(val_samples), val_samples_key=val_samples_key)
        return DataSource(val_samples_key, None, list(rows), [None] * len(rows))
    if env_cfg.val_jsonl is not None:
        path = str(env_cfg.val_jsonl)
        records = read_rl_jsonl(path, tokenizer=tokenizer, key="env.val_jsonl")[: int(val_samples)]
        return DataSource("env.val_jsonl", path, [r.problem for r in records], [r.line for r in records])
    src = _generated(val_samples_key, arithmetic_task(env_cfg).eval_problems, int(val_samples))
    if _chat_format(env_cfg):
        return DataSource(src.key, None, _as_chat(src.rows, tokenizer), src.lines)
    return src


def build_train_dataset(master_config: Any, tokenizer: Any | None = None) -> Union[SFTDataset, RLPromptDataset]:
    """The training dataset of a phase config (``algorithm.name`` sft, grpo or ppo).

    Args:
        master_config: The phase's root config (a warm start is its own SFT phase config).
        tokenizer: Renders RL ``messages`` prompts.

    Returns:
        An ``SFTDataset`` for SFT, an ``RLPromptDataset`` for GRPO / PPO.

    Raises:
        DatasetError: Naming the key, file, line and field at fault.
        ValueError: On an unknown algorithm name.
    """
    algo = master_config.algorithm
    env_cfg = master_config.env
    if algo.name == "sft":
        return SFTDataset(
            sft_source(env_cfg, int(algo.num_train_samples), num_samples_key="algorithm.num_train_samples").rows
        )
    if algo.name in ("grpo", "ppo"):
        src = rl_source(
            env_cfg, int(algo.num_train_prompts), num_prompts_key="algorithm.num_train_prompts", tokenizer=tokenizer
        )
        return RLPromptDataset(src.rows)
    raise ValueError(f"algorithm.name: no dataset for {algo.name!r}; legal values: ['sft', 'grpo', 'ppo']")


def build_val_problems(master_config: Any, tokenizer: Any | None = None) -> list[Problem]:
    """The held-out problems of a phase config.

    Args:
        master_config: The phase's root config.
        tokenizer: Renders ``messages`` prompts.

    Returns:
        ``algorithm.val_samples`` problems (fewer when ``env.val_jsonl`` holds fewer).

    Raises:
        DatasetError: Naming the key, file, line and field at fault.
    """
    src = val_source(
        master_config.env,
        int(master_config.algorithm.val_samples),
        val_samples_key="algorithm.val_samples",
        tokenizer=tokenizer,
    )
    return list(src.rows)
