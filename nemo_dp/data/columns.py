"""Which dataset column holds each field the data layer reads (``env.columns``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Columns", "columns_of"]


@dataclass(frozen=True)
class Columns:
    """Column names of the fields a dataset row gives.

    Attributes:
        prompt: The prompt text (RL) or the SFT prompt.
        messages: A conversation of ``{role, content}`` turns (instead of ``prompt``).
        answer: The RL reference answer.
        response: The SFT response to learn.
    """

    prompt: str = "prompt"
    messages: str = "messages"
    answer: str = "answer"
    response: str = "response"

    def reserved(self) -> tuple[str, ...]:
        """The mapped names of all four fields."""
        return (self.prompt, self.messages, self.answer, self.response)


def columns_of(env_cfg: Any) -> Columns:
    """The ``env.columns`` mapping of an ``env`` node, dataclass or DictConfig (defaults without one)."""
    node = getattr(env_cfg, "columns", None)
    if node is None:
        return Columns()
    return Columns(**{k: str(getattr(node, k)) for k in ("prompt", "messages", "answer", "response")})
