"""What the data layer needs from a tokenizer, stated as a protocol."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional, Protocol, runtime_checkable

__all__ = ["TextTokenizer", "ChatTemplateTokenizer", "has_chat_template"]


@runtime_checkable
class TextTokenizer(Protocol):
    """Encode / decode text; ``encode`` adds no special tokens."""

    @property
    def pad_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def bos_id(self) -> Optional[int]: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...


@runtime_checkable
class ChatTemplateTokenizer(TextTokenizer, Protocol):
    """A tokenizer that may carry a chat template."""

    @property
    def chat_template(self) -> Optional[str]: ...

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str: ...


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` has a non-empty ``chat_template`` and a callable ``apply_chat_template``."""
    template = getattr(tokenizer, "chat_template", None)
    return bool(template) and callable(getattr(tokenizer, "apply_chat_template", None))
