"""Schema of the ``env`` config group: where training and validation data come from and how
responses are rewarded.

Kept apart from the other group schemas because the data layer owns these keys; the root
schema types its ``env`` node with this dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

__all__ = ["ENV_NAMES", "ENV_REWARDS", "ENV_FORMATS", "EnvConfig"]

#: Legal values of ``env.name``.
ENV_NAMES: tuple[str, ...] = ("arithmetic", "visual")
#: Legal values of ``env.reward`` (mirrors ``nemo_dp.environments.REWARD_NAMES``).
ENV_REWARDS: tuple[str, ...] = ("auto", "exact", "math")
#: Legal values of ``env.format`` (how the built-in task's examples are presented).
ENV_FORMATS: tuple[str, ...] = ("plain", "chat")
_OPERATORS: tuple[str, ...] = ("+", "-", "*")


def _one_of(key: str, value: object, legal: tuple[str, ...]) -> None:
    if value not in legal:
        raise ValueError(f"{key}: got {value!r}; legal values: {list(legal)}")


@dataclass
class EnvConfig:
    """``env``: the task that supplies SFT examples, RL prompts and the verifiable reward.

    With ``sft_jsonl`` / ``rl_jsonl`` set, training data comes from those files (validation
    still uses the arithmetic generator's held-out partition unless ``val_jsonl`` is set).
    SFT files hold ``{"prompt", "response"}`` or ``{"messages"}`` lines; RL and validation
    files hold ``{"prompt" | "messages", "answer"}`` lines. ``reward``: ``exact`` (the response
    equals the answer), ``math`` (its final answer does: ``#### 42``, ``\\boxed{42}`` or the
    last number) or ``auto`` (``math`` when ``rl_jsonl`` or ``val_jsonl`` is set, ``exact``
    otherwise). ``format``: how the built-in generator presents its problems: ``plain``
    (``"37+5="`` -> ``"42"``) or ``chat`` (a one-turn conversation, rendered with the
    tokenizer's chat template when it has one; identical to ``plain`` without one).
    ``name: visual`` selects the built-in visual task instead (``visual_kind``: ``digit`` or
    ``count``; images rendered from ``seed``; needs ``policy=hf_vlm``).
    """

    name: str = "arithmetic"
    digits: int = 2
    operators: list[str] = field(default_factory=lambda: ["+"])
    seed: int = 0
    sft_jsonl: Optional[str] = None
    rl_jsonl: Optional[str] = None
    val_jsonl: Optional[str] = None
    reward: str = "auto"
    format: str = "plain"
    visual_kind: str = "digit"  # env=visual: "digit" | "count" (nemo_dp.data.visual_task)

    def __post_init__(self) -> None:
        _one_of("env.name", self.name, ENV_NAMES)
        if not self.digits >= 1:
            raise ValueError(f"env.digits: must be >= 1, got {self.digits!r}")
        if not self.operators:
            raise ValueError(f"env.operators: must not be empty; legal values: {list(_OPERATORS)}")
        for op in self.operators:
            _one_of("env.operators", op, _OPERATORS)
        _one_of("env.reward", self.reward, ENV_REWARDS)
        _one_of("env.format", self.format, ENV_FORMATS)
        for key in ("sft_jsonl", "rl_jsonl", "val_jsonl"):
            value = getattr(self, key)
            if value is not None and not str(value).strip():
                raise ValueError(f"env.{key}: must be a file path or null, got an empty string")
