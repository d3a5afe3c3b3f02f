"""The ``policy=tiny`` character tokenizer: a fixed vocabulary in code, no chat template."""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping, Sequence

from nemo_dp.models.chat import concat_messages

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"

# Order is part of the checkpoint format: appending is safe, reordering is not.
_CHARACTERS: str = (
    string.digits
    + "+-*="
    + " "
    + string.ascii_lowercase
    + string.ascii_uppercase
    + ".,:;!?()'\"/_#%<>[]{}&@$^|~`\\\n"
)


class CharTokenizer:
    """Fixed-vocabulary character tokenizer: ids 0, 1, 2 are pad, bos, eos, then ``_CHARACTERS`` in order."""

    def __init__(self) -> None:
        self._specials: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)
        self._id_to_char: list[str] = list(self._specials) + list(_CHARACTERS)
        self._char_to_id: dict[str, int] = {c: i + len(self._specials) for i, c in enumerate(_CHARACTERS)}

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def bos_id(self) -> int:
        return 1

    @property
    def eos_id(self) -> int:
        return 2

    @property
    def vocab_size(self) -> int:
        """Number of token ids (specials included)."""
        return len(self._id_to_char)

    @property
    def chat_template(self) -> str | None:
        """None: the char tokenizer has no chat template."""
        return None

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
        """Concatenate the turns' contents (no template; ``add_generation_prompt`` is ignored)."""
        return concat_messages(messages)

    def encode(self, text: str) -> list[int]:
        """One id per character of ``text``; ``ValueError`` naming a character outside the vocabulary."""
        ids: list[int] = []
        for pos, ch in enumerate(text):
            tid = self._char_to_id.get(ch)
            if tid is None:
                raise ValueError(f"CharTokenizer: unknown character {ch!r} at position {pos} in {text!r}")
            ids.append(tid)
        return ids

    def encode_prompt(self, prompt: str) -> list[int]:
        """``[bos] + encode(prompt)``."""
        return [self.bos_id] + self.encode(prompt)

    def encode_response(self, response: str) -> list[int]:
        """``encode(response) + [eos]``."""
        return self.encode(response) + [self.eos_id]

    def decode(self, ids: Iterable[int], stop_at_eos: bool = True, skip_special: bool = False) -> str:
        """Text of ``ids`` (ints or 0-d tensors); ``ValueError`` for an id outside the vocabulary.

        Specials are rendered as ``<pad>`` / ``<bos>`` / ``<eos>`` unless ``skip_special``, so an
        exact-match reward cannot be gamed by specials that a silent skip would hide.
        """
        out: list[str] = []
        for raw in ids:
            tid = int(raw)
            if tid < 0 or tid >= len(self._id_to_char):
                raise ValueError(f"CharTokenizer: token id {tid} outside vocabulary of size {self.vocab_size}")
            if tid == self.eos_id and stop_at_eos:
                break
            if skip_special and tid in (self.pad_id, self.bos_id, self.eos_id):
                continue
            out.append(self._id_to_char[tid])
        return "".join(out)
