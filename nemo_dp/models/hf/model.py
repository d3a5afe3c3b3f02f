"""``HFCausalLM``: a HuggingFace ``*ForCausalLM`` behind the ``CausalLM`` protocol; prefill / decode pass an
attention mask and per-row positions, so left-padded prompts match the right-padded training forward."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

__all__ = ["HFCausalLM", "HFWrapper"]


class HFWrapper(nn.Module):
    """A loaded transformers model with an LM head, held as ``self.hf``: what its adapters share."""

    def __init__(self, hf_model: Any) -> None:
        super().__init__()
        self.hf = hf_model

    @property
    def vocab_size(self) -> int:
        """Rows of the output embedding (the logits' last dimension)."""
        return int(self.hf.get_output_embeddings().weight.shape[0])

    def lm_head_only_parameters(self) -> list[nn.Parameter]:
        """The output embedding's parameters unless tied to the input embedding (GPT-2: none)."""
        head = self.hf.get_output_embeddings()
        shared = {id(p) for p in self.hf.get_input_embeddings().parameters()}
        return [p for p in head.parameters() if id(p) not in shared]

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """``save_pretrained`` of the wrapped model (config + safetensors)."""
        self.hf.save_pretrained(os.fspath(directory))


class HFCausalLM(HFWrapper):
    """Protocol adapter around a loaded transformers causal LM (``AutoModelForCausalLM``)."""

    @property
    def max_positions(self) -> int:
        return int(self.hf.config.max_position_embeddings)

    @property
    def hidden_size(self) -> int:
        return int(self.hf.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, logits_from: int = 0) -> torch.Tensor:
        """Cache-free causal forward (logits in the model's dtype)."""
        if logits_from:
            keep = int(input_ids.shape[1]) - int(logits_from)
            return self.hf(input_ids=input_ids, use_cache=False, logits_to_keep=keep).logits
        return self.hf(input_ids=input_ids, use_cache=False).logits

    @contextlib.contextmanager
    def attention_implementation(self, name: str) -> Iterator[None]:
        """Run the block with the model's attention set to ``name`` (``sdpa`` | ``eager``), restored on exit."""
        before = str(self.hf.config._attn_implementation)
        if name == before:
            yield
            return
        self.hf.set_attn_implementation(name)
        try:
            yield
        finally:
            self.hf.set_attn_implementation(before)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The base model's ``last_hidden_state`` (after its final norm)."""
        return self.hf.base_model(input_ids=input_ids, use_cache=False).last_hidden_state

    def prefill(
        self, input_ids: torch.Tensor, key_valid: torch.Tensor, positions: torch.Tensor, max_len: int
    ) -> tuple[torch.Tensor, Any]:
        """Left-padded prompts through the model, opening its own KV cache (``max_len`` unused)."""
        # Sampling reads the last column only.
        return self._cached_step(input_ids, key_valid, positions, logits_to_keep=1)

    def decode(
        self, tokens: torch.Tensor, positions: torch.Tensor, key_valid: torch.Tensor, cache: Any
    ) -> tuple[torch.Tensor, Any]:
        """One token per row through ``past_key_values``."""
        return self._cached_step(tokens, key_valid, positions, past_key_values=cache)

    def _cached_step(
        self, input_ids: torch.Tensor, key_valid: torch.Tensor, positions: torch.Tensor, **extra: Any
    ) -> tuple[torch.Tensor, Any]:
        out = self.hf(
            input_ids=input_ids, attention_mask=key_valid.long(), position_ids=positions, use_cache=True, **extra
        )
        return out.logits[:, -1], out.past_key_values
