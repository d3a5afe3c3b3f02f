"""``HFTokenizer``: a transformers tokenizer behind the ``Tokenizer`` protocol (pad falls back to eos)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nemo_dp.models.chat import check_messages, concat_messages

__all__ = ["HFTokenizer"]


class HFTokenizer:
    """Protocol adapter around a loaded ``PreTrainedTokenizerBase``; ``ValueError`` without an eos token."""

    def __init__(self, tokenizer: Any, source: str = "<in-memory>") -> None:
        self._tok = tokenizer
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError(
                f"policy.tokenizer_name_or_path: tokenizer at {source!r} has no eos token; set "
                "\"eos_token\" in its tokenizer_config.json (generation stops rows at eos)"
            )
        self._eos = int(eos)
        pad = tokenizer.pad_token_id
        self._pad = int(pad) if pad is not None else self._eos
        bos = tokenizer.bos_token_id
        self._bos = int(bos) if bos is not None else None
        self._bos_text = tokenizer.bos_token if bos is not None else None

    @property
    def hf_tokenizer(self) -> Any:
        return self._tok

    @property
    def pad_id(self) -> int:
        """Pad id (eos when the tokenizer has no pad token)."""
        return self._pad

    @property
    def eos_id(self) -> int:
        return self._eos

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def vocab_size(self) -> int:
        """``len(tokenizer)`` (added tokens included)."""
        return len(self._tok)

    @property
    def chat_template(self) -> str | None:
        template = getattr(self._tok, "chat_template", None)
        return template if isinstance(template, str) and template else None

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """The wrapped tokenizer's ``save_pretrained`` (``tokenizer.json``, its config, specials)."""
        self._tok.save_pretrained(os.fspath(directory))

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` without added bos / eos (special-token text maps to its id)."""
        return list(self._tok.encode(text, add_special_tokens=False))

    def encode_prompt(self, prompt: str) -> list[int]:
        """``[bos] + encode(prompt)``; no bos when the tokenizer has none or the text already starts with it."""
        ids = self.encode(prompt)
        if self._bos is None or (self._bos_text and prompt.startswith(self._bos_text)):
            return ids
        return [self._bos] + ids

    def encode_response(self, response: str) -> list[int]:
        """``encode(response) + [eos]``."""
        return self.encode(response) + [self._eos]

    def decode(self, ids: Iterable[int], stop_at_eos: bool = True, skip_special: bool = False) -> str:
        """Text of ``ids`` (ints or 0-d tensors); ``ValueError`` for an id outside the vocabulary."""
        out: list[int] = []
        for raw in ids:
            tid = int(raw)
            if tid < 0 or tid >= self.vocab_size:
                raise ValueError(f"HFTokenizer: token id {tid} outside vocabulary of size {self.vocab_size}")
            if stop_at_eos and tid == self._eos:
                break
            out.append(tid)
        return str(self._tok.decode(out, skip_special_tokens=skip_special))

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
        """Render ``{role, content}`` turns with the chat template, or concatenate them (``ValueError``: bad turn)."""
        check_messages(messages)
        if self.chat_template is None:
            return concat_messages(messages)
        return str(
            self._tok.apply_chat_template(
                [dict(m) for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt
            )
        )
