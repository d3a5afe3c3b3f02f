"""The seams between the workers and whatever model / tokenizer a run trains.

:class:`CausalLM`, :class:`Tokenizer` and :class:`LossFn`.  Token ids are int64 ``[B, S]``;
training batches are right-padded, generation left-padded (``prefill`` takes per-row positions
and a key-validity mask).  A model is also a ``torch.nn.Module``.
"""

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

        Args:
            input_ids: int64 ``[B, S]`` (right padding does not affect valid positions).
            logits_from: First position whose logits are returned (``0 <= logits_from < S``), so
                a loss reading only the response skips the LM head and log-softmax on the prompt.
        """
        ...

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Last-layer hidden states after the final norm (what the LM head reads), float ``[B, S, hidden_size]``."""
        ...

    def prefill(
        self, input_ids: torch.Tensor, key_valid: torch.Tensor, positions: torch.Tensor, max_len: int
    ) -> tuple[torch.Tensor, Any]:
        """Run left-padded prompts and open a KV cache.

        Args:
            input_ids: int64 ``[B, W]`` left-padded prompts.
            key_valid: bool ``[B, W]``, True on real (non-pad) tokens.
            positions: int64 ``[B, W]`` position ids (0 at each row's first real token).
            max_len: Most positions the cache will hold (``W`` + new tokens).

        Returns:
            ``(logits of the last column [B, V], cache)``; the cache is opaque to callers.
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
        """Parameters used only by the LM head (not by :meth:`hidden_states`).

        A value model built on this backbone freezes them; a head tied to the input
        embeddings is not listed.
        """
        ...

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Write config + safetensors weights to ``directory`` (created if missing) for its family's loader."""
        ...


@runtime_checkable
class Tokenizer(Protocol):
    """What datasets, collate functions, rewards and generation need from a tokenizer.

    ``encode`` adds no special tokens; ``encode_prompt`` / ``encode_response`` lay a sequence
    out the way every trainer does: ``[bos]? + prompt + response + [eos]``.
    """

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

        ``add_generation_prompt`` appends the prefix of an assistant turn.  Special tokens appear
        as text (``encode`` maps them).
        """
        ...


class LossFn(Protocol):
    """A training loss as the workers call it (implemented by the algorithms layer).

    ``global_valid_tokens`` / ``global_valid_seqs`` are the counts over the whole global
    batch (all ranks, all microbatches), so summing microbatch losses gives the batch mean.

    A loss whose class sets ``reads_masked_logprobs_only = True`` receives the logits of the
    positions from one before the micro-batch's first ``token_mask`` column on (``[B, K, V]``,
    see ``token_logprobs_from_logits``); any other loss receives all ``[B, S, V]``.
    """

    def __call__(
        self, logits: torch.Tensor, mb: Mapping[str, torch.Tensor], global_valid_tokens: float, global_valid_seqs: float
    ) -> tuple[torch.Tensor, dict[str, float]]: ...
