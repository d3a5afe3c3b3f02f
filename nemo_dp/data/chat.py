"""Rendering examples to token ids with a loss mask that is 1 exactly on assistant content and its end of turn.

Without a chat template: ``[bos] + p + r + [eos]``; with one, the rendered text is split at turn
boundaries and each piece tokenized alone (no token straddles one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

from nemo_dp.data.protocol import has_chat_template

__all__ = [
    "ROLES", "Message", "ChatExample", "SFTExample", "TokenizedExample", "ChatTemplateError", "tokenize_sft_example",
    "render_prompt", "encode_prompt_text",
]

ROLES: tuple[str, ...] = ("system", "user", "assistant")


@dataclass(frozen=True)
class Message:
    """One conversation turn (``role`` one of ``ROLES``)."""

    role: str
    content: str


@dataclass(frozen=True)
class ChatExample:
    """A conversation for SFT (non-empty, the last turn the assistant's): loss on the assistant turns only."""

    messages: tuple[Message, ...]


SFTExample = Union[tuple[str, str], ChatExample]


@dataclass(frozen=True)
class TokenizedExample:
    """Token ids with their loss mask (0/1 per token, 1 = learned)."""

    ids: list[int]
    loss_mask: list[int]


class ChatTemplateError(ValueError):
    """A chat template renders a conversation's prefixes inconsistently (no exact turn split)."""


def _plain(messages: Sequence[Message], tokenizer: Any) -> TokenizedExample:
    bos = tokenizer.bos_id
    ids: list[int] = [] if bos is None else [int(bos)]
    mask = [0] * len(ids)
    for m in messages:
        learned = m.role == "assistant"
        piece = list(tokenizer.encode(m.content)) + ([int(tokenizer.eos_id)] if learned else [])
        ids.extend(piece)
        mask.extend([int(learned)] * len(piece))
    return TokenizedExample(ids=ids, loss_mask=mask)


def _render(tokenizer: Any, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
    turns = [{"role": m.role, "content": m.content} for m in messages]
    text = tokenizer.apply_chat_template(turns, add_generation_prompt=add_generation_prompt)
    if not isinstance(text, str):
        raise ChatTemplateError(f"apply_chat_template returned {type(text).__name__}, not the rendered text")
    return text


def _template_pieces(messages: Sequence[Message], tokenizer: Any) -> list[tuple[str, bool]]:
    pieces: list[tuple[str, bool]] = []
    done = ""
    for i, m in enumerate(messages):
        if m.role != "assistant":
            continue
        prefix = _render(tokenizer, messages[:i], add_generation_prompt=True)
        full = _render(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if not prefix.startswith(done) or not full.startswith(prefix):
            raise ChatTemplateError(
                f"the chat template renders turn {i} (assistant) so that the conversation up to it "
                "is not a prefix of the conversation including it; the loss mask cannot be split "
                "exactly at turn boundaries"
            )
        pieces.append((prefix[len(done) :], False))
        pieces.append((full[len(prefix) :], True))
        done = full
    whole = _render(tokenizer, messages, add_generation_prompt=False)
    if not whole.startswith(done):
        raise ChatTemplateError("the chat template renders the whole conversation differently from its prefixes")
    if len(whole) > len(done):
        pieces.append((whole[len(done) :], False))
    return pieces


def encode_prompt_text(text: str, tokenizer: Any) -> list[int]:
    """Ids of a sequence's leading (prompt) text: the tokenizer's ``encode_prompt``, else ``[bos]? + encode(text)``.

    RL prompts are encoded this way too, so an SFT conversation and the RL prompt of the same
    turns start with the same ids.
    """
    encode_prompt = getattr(tokenizer, "encode_prompt", None)
    if callable(encode_prompt):
        return list(encode_prompt(text))
    bos = tokenizer.bos_id
    return ([] if bos is None else [int(bos)]) + list(tokenizer.encode(text))


def _templated(messages: Sequence[Message], tokenizer: Any) -> TokenizedExample:
    eos = int(tokenizer.eos_id)
    ids: list[int] = []
    mask: list[int] = []
    for k, (text, learned) in enumerate(_template_pieces(messages, tokenizer)):
        piece = encode_prompt_text(text, tokenizer) if k == 0 else list(tokenizer.encode(text)) if text else []
        if learned and eos not in piece:
            piece.append(eos)
        cut = piece.index(eos) + 1 if learned else 0  # learned up to and including the first eos
        ids.extend(piece)
        mask.extend([1] * cut + [0] * (len(piece) - cut))
    return TokenizedExample(ids=ids, loss_mask=mask)


def tokenize_sft_example(example: SFTExample, tokenizer: Any) -> TokenizedExample:
    """Token ids and loss mask of a ``(prompt, response)`` pair or a ``ChatExample``.

    Raises:
        TypeError: ``example`` is neither shape.
        ChatTemplateError: The template cannot be split exactly at turn boundaries.
        ValueError: What the tokenizer raises for text it cannot encode.
    """
    if isinstance(example, ChatExample):
        if has_chat_template(tokenizer):
            return _templated(example.messages, tokenizer)
        return _plain(example.messages, tokenizer)
    if isinstance(example, tuple) and len(example) == 2:
        prompt, response = example
        return _plain((Message("user", prompt), Message("assistant", response)), tokenizer)
    raise TypeError(f"SFT example must be a (prompt, response) pair or a ChatExample, got {type(example).__name__}")


def render_prompt(messages: Sequence[Message], tokenizer: Any | None) -> str:
    """The text the policy continues: the chat template's rendering with a generation prompt (``ChatTemplateError``
    if it is no text), else the contents."""
    if tokenizer is not None and has_chat_template(tokenizer):
        return _render(tokenizer, messages, add_generation_prompt=True)
    return "".join(m.content for m in messages)
