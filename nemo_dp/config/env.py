"""Schema of the ``env`` config group: training/validation data and how responses are rewarded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from nemo_dp.data.arithmetic import SUPPORTED_OPERATORS
from nemo_dp.utils.config_checks import at_least, one_of
from nemo_dp.environments.registry import check_reward_entry, is_function_path, reward_entries, single_reward_names

__all__ = ["ENV_NAMES", "ENV_FORMATS", "EnvConfig", "ColumnsConfig", "RewardItem"]

ENV_NAMES: tuple[str, ...] = ("arithmetic", "visual")
ENV_FORMATS: tuple[str, ...] = ("plain", "chat")
_DATA_KEYS: tuple[tuple[str, str], ...] = (("sft_data", "sft_jsonl"), ("rl_data", "rl_jsonl"), ("val_data", "val_jsonl"))


@dataclass
class ColumnsConfig:
    """``env.columns``: the dataset column that holds each field (today's names by default)."""

    prompt: str = "prompt"
    messages: str = "messages"
    answer: str = "answer"
    response: str = "response"


@dataclass
class RewardItem:
    """One ``env.rewards`` entry: ``fn`` a registered reward or a ``module:function`` / ``file.py:function``."""

    fn: str = ""
    weight: float = 1.0
    pattern: Optional[str] = None


@dataclass
class EnvConfig:
    """``env``: the task that supplies SFT examples, RL prompts and the verifiable reward.

    ``sft_data`` / ``rl_data`` / ``val_data`` (or the older ``*_jsonl`` names, not both) name a
    file, glob or ``save_to_disk`` directory; with none set the arithmetic generator supplies the
    data.  ``rewards`` lists several rewards with weights.  ``name: visual`` needs ``policy=hf_vlm``.
    """

    name: str = "arithmetic"
    digits: int = 2
    operators: list[str] = field(default_factory=lambda: ["+"])
    seed: int = 0
    sft_data: Optional[str] = None
    rl_data: Optional[str] = None
    val_data: Optional[str] = None
    sft_jsonl: Optional[str] = None
    rl_jsonl: Optional[str] = None
    val_jsonl: Optional[str] = None
    split: Optional[str] = None
    columns: ColumnsConfig = field(default_factory=ColumnsConfig)
    reward: str = "auto"
    rewards: Optional[list[RewardItem]] = None
    format: str = "plain"
    visual_kind: str = "digit"  # env=visual: "digit" | "count" | "colour" (nemo_dp.data.visual_task)

    def __post_init__(self) -> None:
        one_of("env.name", self.name, ENV_NAMES)
        at_least("env.digits", self.digits, 1)
        if not self.operators:
            raise ValueError(f"env.operators: must not be empty; legal values: {list(SUPPORTED_OPERATORS)}")
        for op in self.operators:
            one_of("env.operators", op, SUPPORTED_OPERATORS)
        if not is_function_path(str(self.reward)) and self.reward not in single_reward_names():
            raise ValueError(
                f"env.reward: got {self.reward!r}; legal values: {list(single_reward_names())} or a function "
                "'package.module:function' / 'path/to/file.py:function'"
            )
        for entry in reward_entries(self):
            check_reward_entry(entry)
        one_of("env.format", self.format, ENV_FORMATS)
        for new, old in _DATA_KEYS:
            for key in (new, old):
                value = getattr(self, key)
                if value is not None and not str(value).strip():
                    raise ValueError(f"env.{key}: must be a file path or null, got an empty string")
            if getattr(self, new) is not None and getattr(self, old) is not None:
                raise ValueError(
                    f"env.{new} and env.{old} are both set; env.{old} is the older name of env.{new}: set one"
                )
        for name in ("prompt", "messages", "answer", "response"):
            if not str(getattr(self.columns, name)).strip():
                raise ValueError(f"env.columns.{name}: must name a column, got an empty string")
        if self.split is not None and not str(self.split).strip():
            raise ValueError("env.split: must name a split or be null, got an empty string")
