"""Chat rendering and the SFT loss mask: exact on assistant content + end-of-turn only.

Checked with the character tokenizer (no template: plain concatenation) and with a real
HuggingFace tokenizer built here: a byte-level BPE trained with the ``tokenizers`` library on a
few lines, wrapped in ``transformers.PreTrainedTokenizerFast`` with a small chat template (no
downloads). ``HFChatTokenizer`` below adapts it to the data layer's tokenizer protocol; it
isolates these tests from the model layer's own HF tokenizer wrapper.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

import pytest

from nemo_dp.data.chat import (
    ChatExample,
    ChatTemplateError,
    Message,
    render_prompt,
    tokenize_sft_example,
)
from nemo_dp.data.datasets import collate_sft
from nemo_dp.data.protocol import ChatTemplateTokenizer, TextTokenizer, has_chat_template
from nemo_dp.models.tiny.tokenizer import CharTokenizer

IM_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_TRAIN_LINES = [
    "You add two numbers. Reply with the sum only.",
    "12+7= 19. And 19+1? 20. What is 60+34? 94",
    "The quick brown fox jumps over the lazy dog.",
    "assistant user system hello world",
] * 20


class HFChatTokenizer:
    """``PreTrainedTokenizerFast`` seen through the data layer's tokenizer protocol."""

    def __init__(self, hf: Any) -> None:
        self.hf = hf

    @property
    def pad_id(self) -> int:
        return int(self.hf.pad_token_id)

    @property
    def eos_id(self) -> int:
        return int(self.hf.eos_token_id)

    @property
    def bos_id(self) -> Optional[int]:
        return self.hf.bos_token_id

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def chat_template(self) -> Optional[str]:
        return self.hf.chat_template

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def encode_prompt(self, prompt: str) -> list[int]:
        bos = self.hf.bos_token
        if bos is None or prompt.startswith(bos):
            return self.encode(prompt)
        return [int(self.hf.bos_token_id)] + self.encode(prompt)

    def decode(self, ids: Iterable[int]) -> str:
        return str(self.hf.decode(list(ids)))

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
        return str(
            self.hf.apply_chat_template(
                [dict(m) for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt
            )
        )


def build_hf_tokenizer(
    template: Optional[str] = IM_TEMPLATE, *, eos: str = "<|im_end|>", bos: Optional[str] = "<|bos|>"
) -> HFChatTokenizer:
    """A byte-level BPE trained on a few lines, as a HF fast tokenizer with ``template``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|bos|>", "<|im_start|>", "<|im_end|>", "<|end|>"]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    core.train_from_iterator(_TRAIN_LINES, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<|pad|>", eos_token=eos, bos_token=bos)
    hf.chat_template = template
    return HFChatTokenizer(hf)


@pytest.fixture(scope="module")
def hf_tok() -> HFChatTokenizer:
    return build_hf_tokenizer()


CONVERSATION = ChatExample(
    (
        Message("system", "You add two numbers."),
        Message("user", "12+7="),
        Message("assistant", "19"),
        Message("user", "And 19+1?"),
        Message("assistant", "20"),
    )
)


def _learned(ids: list[int], mask: list[int]) -> list[int]:
    return [t for t, m in zip(ids, mask) if m]


def test_protocols_hold() -> None:
    tok = CharTokenizer()
    assert isinstance(tok, TextTokenizer) and not has_chat_template(tok)
    hf = build_hf_tokenizer()
    assert isinstance(hf, ChatTemplateTokenizer) and has_chat_template(hf)
    assert not has_chat_template(build_hf_tokenizer(None))


def test_char_tokenizer_plain_concatenation_masks_assistant_turns_and_eos() -> None:
    tok = CharTokenizer()
    out = tokenize_sft_example(CONVERSATION, tok)
    e = tok.encode
    expected_ids = (
        [tok.bos_id] + e("You add two numbers.") + e("12+7=") + e("19") + [tok.eos_id] + e("And 19+1?") + e("20")
        + [tok.eos_id]
    )
    expected_mask = (
        [0] * (1 + len("You add two numbers.") + len("12+7=")) + [1, 1, 1] + [0] * len("And 19+1?") + [1, 1, 1]
    )
    assert out.ids == expected_ids
    assert out.loss_mask == expected_mask


def test_pair_is_the_one_turn_conversation_bit_for_bit() -> None:
    tok = CharTokenizer()
    pairs = [("1+1=", "2"), ("10+10=", "20")]
    chats = [ChatExample((Message("user", p), Message("assistant", r))) for p, r in pairs]
    a, b = collate_sft(pairs, tok), collate_sft(chats, tok)
    for k in ("input_ids", "input_lengths", "token_mask", "sample_mask"):
        assert a[k].dtype == b[k].dtype and a[k].tolist() == b[k].tolist()
    # The layout the built-in task has always used.
    assert a["input_ids"][0, :7].tolist() == [tok.bos_id] + tok.encode("1+1=2") + [tok.eos_id]
    assert a["token_mask"][0].tolist() == [0] * 5 + [1, 1] + [0] * 3


def test_hf_template_mask_is_exact(hf_tok: HFChatTokenizer) -> None:
    out = tokenize_sft_example(CONVERSATION, hf_tok)
    e, eos = hf_tok.encode, hf_tok.eos_id
    head = "<|bos|><|im_start|>system\nYou add two numbers.<|im_end|>\n<|im_start|>user\n12+7=<|im_end|>\n"
    head += "<|im_start|>assistant\n"
    mid = "<|im_start|>user\nAnd 19+1?<|im_end|>\n<|im_start|>assistant\n"
    pieces = [(e(head), 0), (e("19") + [eos], 1), (e("\n"), 0), (e(mid), 0), (e("20") + [eos], 1), (e("\n"), 0)]
    assert out.ids == [t for ids, _ in pieces for t in ids]
    assert out.loss_mask == [m for ids, m in pieces for _ in ids]
    # One bos only: the template's (none added on top).
    assert out.ids.count(hf_tok.bos_id) == 1 and out.ids[0] == hf_tok.bos_id
    assert hf_tok.decode(_learned(out.ids, out.loss_mask)) == "19<|im_end|>20<|im_end|>"
    # The role header that precedes each answer is prompt, not learned.
    assert "assistant" not in hf_tok.decode(_learned(out.ids, out.loss_mask))


def test_hf_template_without_bos_gets_one_bos_like_the_rl_prompt() -> None:
    tok = build_hf_tokenizer(IM_TEMPLATE.replace("{{ bos_token }}", ""))
    conv = ChatExample((Message("user", "12+7="), Message("assistant", "19")))
    out = tokenize_sft_example(conv, tok)
    prompt = render_prompt(conv.messages[:1], tok)
    assert not prompt.startswith("<|bos|>")
    prompt_ids = tok.encode_prompt(prompt)
    assert prompt_ids[0] == tok.bos_id and out.ids[: len(prompt_ids)] == prompt_ids
    assert out.loss_mask[: len(prompt_ids)] == [0] * len(prompt_ids)
    assert out.ids.count(tok.bos_id) == 1
    assert tok.decode(_learned(out.ids, out.loss_mask)) == "19<|im_end|>"


def test_hf_template_without_eos_in_the_turn_appends_eos(hf_tok: HFChatTokenizer) -> None:
    template = IM_TEMPLATE.replace("<|im_end|>", "<|end|>")
    tok = build_hf_tokenizer(template)
    conv = ChatExample((Message("user", "12+7="), Message("assistant", "19")))
    out = tokenize_sft_example(conv, tok)
    assert out.ids[-1] == tok.eos_id
    assert tok.decode(_learned(out.ids, out.loss_mask)) == "19<|end|>\n<|im_end|>"


def test_hf_tokenizer_without_template_concatenates(hf_tok: HFChatTokenizer) -> None:
    tok = build_hf_tokenizer(None)
    out = tokenize_sft_example(ChatExample((Message("user", "12+7="), Message("assistant", "19"))), tok)
    assert out.ids == [tok.bos_id] + tok.encode("12+7=") + tok.encode("19") + [tok.eos_id]
    assert out.loss_mask == [0] * (1 + len(tok.encode("12+7="))) + [1] * (len(tok.encode("19")) + 1)


def test_collate_pads_chat_rows_with_their_masks(hf_tok: HFChatTokenizer) -> None:
    short = ChatExample((Message("user", "1+1="), Message("assistant", "2")))
    batch = collate_sft([CONVERSATION, short], hf_tok, max_seq_len=None)
    rows = [tokenize_sft_example(x, hf_tok) for x in (CONVERSATION, short)]
    for i, row in enumerate(rows):
        n = len(row.ids)
        assert int(batch["input_lengths"][i]) == n
        assert batch["input_ids"][i, :n].tolist() == row.ids
        assert batch["token_mask"][i, :n].tolist() == row.loss_mask
        assert set(batch["input_ids"][i, n:].tolist()) <= {hf_tok.pad_id}
        assert batch["token_mask"][i, n:].sum() == 0


def test_template_that_rewrites_earlier_turns_is_refused() -> None:
    # Marks the last turn, so the conversation up to a turn is not a prefix of the whole one.
    template = "{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m['content'] }}{% endfor %}"
    tok = build_hf_tokenizer(template)
    with pytest.raises(ChatTemplateError, match="turn 1 .assistant."):
        tokenize_sft_example(ChatExample((Message("user", "hi"), Message("assistant", "yo"))), tok)


def test_render_prompt(hf_tok: HFChatTokenizer) -> None:
    msgs = (Message("system", "Be brief."), Message("user", "12+7="))
    assert render_prompt(msgs, CharTokenizer()) == "Be brief.12+7="
    assert render_prompt(msgs, None) == "Be brief.12+7="
    assert render_prompt(msgs, hf_tok) == (
        "<|bos|><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n12+7=<|im_end|>\n<|im_start|>assistant\n"
    )


def test_unknown_example_shape_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="got list"):
        tokenize_sft_example(["a", "b"], CharTokenizer())  # type: ignore[arg-type]
