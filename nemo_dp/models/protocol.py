"""The seams between the workers and a run's model, tokenizer and loss (token ids: int64 ``[B, S]``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["CausalLM", "Tokenizer", "ChatMessage", "LossFn"]

#: One chat turn: ``{"role": "system" | "user" | "assistant", "content": str}``.
ChatMessage = Mapping[str, str]


@runtime_checkable
class CausalLM(Protocol):
    """What the workers need from a causal language model (a ``torch.nn.Module``; calling it runs :meth:`forward`)."""

    @property
    def max_positions(self) -> int:
        """Longest sequence (prompt + response) the model can attend over."""
        ...

    @property
    def hidden_size(self) -> int:
        """Width of :meth:`hidden_states` (the input of a value head)."""
        ...

    @property
    def vocab_size(self) -> int:
        """Number of logits per position."""
        ...

    def forward(self, input_ids: torch.Tensor, logits_from: int = 0) -> torch.Tensor:
        """Full causal forward: logits ``[B, S - logits_from, V]``; position ``t`` predicts token ``t + 1``.

        ``logits_from`` (``0 <= logits_from < S``) lets a loss reading only the response skip the
        LM head on the prompt; right padding does not affect valid positions.
        """
        ...

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Last-layer hidden states after the final norm (what the LM head reads), float ``[B, S, hidden_size]``."""
        ...

    def prefill(
        self, input_ids: torch.Tensor, key_valid: torch.Tensor, positions: torch.Tensor, max_len: int
    ) -> tuple[torch.Tensor, Any]:
        """Run left-padded prompts ``[B, W]`` and open a KV cache of up to ``max_len`` positions.

        ``key_valid`` is True on real tokens; ``positions`` is 0 at each row's first real token.
        Returns ``(logits of the last column [B, V], cache)``; the cache is opaque to callers.
        """
        ...

    def decode(
        self, tokens: torch.Tensor, positions: torch.Tensor, key_valid: torch.Tensor, cache: Any
    ) -> tuple[torch.Tensor, Any]:
        """Feed one new token per row (``tokens``, ``positions``: int64 ``[B, 1]``) through the cache.

        ``key_valid`` is bool ``[B, L]`` over every cached key plus the new one; ``cache`` comes
        from :meth:`prefill` or the previous :meth:`decode`.  Returns ``(logits [B, V], cache)``.
        """
        ...

    def lm_head_only_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters used only by the LM head (a value model freezes them); a tied head is not listed."""
        ...

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Write config + safetensors weights to ``directory`` (created if missing) for its family's loader."""
        ...


@runtime_checkable
class Tokenizer(Protocol):
    """What datasets, rewards and generation need from a tokenizer (``[bos]? + prompt + response + [eos]``)."""

    @property
    def pad_id(self) -> int:
        """Padding id (may equal ``eos_id`` for tokenizers without a pad token)."""
        ...

    @property
    def eos_id(self) -> int:
        """End-of-sequence id: generation stops a row when it samples it."""
        ...

    @property
    def bos_id(self) -> int | None:
        """Beginning-of-sequence id, or ``None`` when the tokenizer has none."""
        ...

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can produce (specials included)."""
        ...

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's chat template, or ``None``."""
        ...

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` without special tokens."""
        ...

    def encode_prompt(self, prompt: str) -> list[int]:
        """``[bos]? + encode(prompt)``."""
        ...

    def encode_response(self, response: str) -> list[int]:
        """``encode(response) + [eos]``."""
        ...

    def decode(self, ids: Iterable[int], stop_at_eos: bool = True, skip_special: bool = False) -> str:
        """Text of ``ids``, stopping at the first eos by default."""
        ...

    def apply_chat_template(self, messages: Sequence[ChatMessage], add_generation_prompt: bool) -> str:
        """Render chat turns to text (the chat template, or plain concatenation without one).

        ``add_generation_prompt`` appends an assistant turn's prefix; specials appear as text.
        """
        ...


class LossFn(Protocol):
    """A training loss as the workers call it (implemented by the algorithms layer).

    The counts cover the whole global batch, so summing microbatch losses gives the batch mean.  A
    loss class with ``reads_masked_logprobs_only = True`` receives logits from one before the first
    ``token_mask`` column (``[B, K, V]``); any other loss receives all ``[B, S, V]``.
    """

    def __call__(
        self, logits: torch.Tensor, mb: Mapping[str, torch.Tensor], global_valid_tokens: float, global_valid_seqs: float
    ) -> tuple[torch.Tensor, dict[str, float]]: ...
