"""Character-level tokenizer (the ``policy=tiny`` tokenizer): a fixed vocabulary in code, so ids are
stable everywhere; no chat template.
"""

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
    """Fixed-vocabulary character tokenizer.

    Ids 0, 1, 2 are pad, bos, eos; the characters of ``_CHARACTERS`` follow in order.
    ``encode`` maps characters only (no special tokens); ``encode_prompt`` and
    ``encode_response`` add bos / eos the way every trainer and collator in nemo_dp lays out a
    sequence: ``[bos] + prompt + response + [eos]``.
    """

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
        """One id per character of ``text``, without special tokens.

        Raises:
            ValueError: A character is not in the vocabulary (the message names it).
        """
        ids: list[int] = []
        for pos, ch in enumerate(text):
            tid = self._char_to_id.get(ch)
            if tid is None:
                raise ValueError(f"CharTokenizer: unknown character {ch!r} at position {pos} in {text!r}")
            ids.append(tid)
        return ids

    def encode_prompt(self, prompt: str) -> list[int]:
        """Encode a prompt as ``[bos] + encode(prompt)``."""
        return [self.bos_id] + self.encode(prompt)

    def encode_response(self, response: str) -> list[int]:
        """Encode a response as ``encode(response) + [eos]``."""
        return self.encode(response) + [self.eos_id]

    def decode(self, ids: Iterable[int], stop_at_eos: bool = True, skip_special: bool = False) -> str:
        """Decode ids to text.

        Special tokens inside the text are rendered as ``<pad>`` / ``<bos>`` / ``<eos>`` by
        default, so that a response containing them never equals a plain answer (an exact-match
        reward must not be gamed by sprinkling specials that a silent skip would hide).

        Args:
            ids: Token ids (ints or 0-d tensors).
            stop_at_eos: Stop at the first eos instead of rendering it.
            skip_special: Drop pad and bos (and eos when not stopping), e.g. for display of a
                whole ``[bos] + prompt + ...`` row.

        Raises:
            ValueError: An id is outside the vocabulary.
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
