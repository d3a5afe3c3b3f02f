"""A reference answer that carries its dataset row to the reward functions.

``Answer`` is the answer string plus what a user's reward function receives besides the
completion (the row's prompt and other columns); built-in rewards use it as a plain string.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["Answer", "with_row"]


class Answer(str):
    """A reference answer string with its row.

    Attributes:
        prompt: The row's prompt as the dataset holds it: a string, or a list of
            ``{"role", "content"}`` turns for chat data.
        chat: Whether the row is chat data (completions are then given as message lists).
        columns: The row's other columns, by their dataset names.
    """

    prompt: Any
    chat: bool
    columns: dict[str, Any]

    def __new__(cls, text: str, *, prompt: Any, chat: bool, columns: Mapping[str, Any]) -> Answer:
        obj = super().__new__(cls, text)
        obj.prompt = prompt
        obj.chat = chat
        obj.columns = dict(columns)
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (str(self), self.prompt, self.chat, self.columns))


def _rebuild(text: str, prompt: Any, chat: bool, columns: dict[str, Any]) -> Answer:
    return Answer(text, prompt=prompt, chat=chat, columns=columns)


def with_row(answer: str, prompt: Any, *, chat: bool = False, columns: Mapping[str, Any] | None = None) -> Answer:
    """``answer`` carrying its row, fields as :class:`Answer` (``columns`` defaults to ``{"answer": answer}``)."""
    return Answer(answer, prompt=prompt, chat=chat, columns=columns if columns is not None else {"answer": answer})
