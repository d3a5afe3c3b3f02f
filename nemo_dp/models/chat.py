"""Chat turns to text when a tokenizer has no chat template: plain concatenation of contents."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["CHAT_ROLES", "check_messages", "concat_messages"]

#: Roles a chat turn may have.
CHAT_ROLES: tuple[str, ...] = ("system", "user", "assistant")


def check_messages(messages: Sequence[Mapping[str, str]], where: str = "messages") -> None:
    """Check that ``messages`` is a non-empty list of ``{role, content}`` turns (``ValueError`` prefixed ``where``)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError(f"{where}: must be a non-empty list of {{role, content}} turns")
    for i, turn in enumerate(messages):
        if not isinstance(turn, Mapping):
            raise ValueError(f"{where}[{i}]: must be an object with 'role' and 'content'")
        role, content = turn.get("role"), turn.get("content")
        if role not in CHAT_ROLES:
            raise ValueError(f"{where}[{i}].role: got {role!r}; legal values: {list(CHAT_ROLES)}")
        if not isinstance(content, str):
            raise ValueError(f"{where}[{i}].content: must be a string, got {type(content).__name__}")


def concat_messages(messages: Sequence[Mapping[str, str]]) -> str:
    """The ``{role, content}`` turns' contents concatenated in order (``ValueError`` for a malformed turn)."""
    check_messages(messages)
    return "".join(str(turn["content"]) for turn in messages)
