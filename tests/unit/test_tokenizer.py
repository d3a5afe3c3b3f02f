"""CharTokenizer: stable ids, round trips, specials, and errors naming the culprit."""

from __future__ import annotations

import pytest

from nemo_dp.models.tiny.tokenizer import CharTokenizer
from nemo_dp.models.protocol import Tokenizer


def test_special_ids_and_vocab() -> None:
    tok = CharTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    chars = [tok.decode([i]) for i in range(3, tok.vocab_size)]
    assert len(set(chars)) == len(chars) == tok.vocab_size - 3  # one distinct character per id
    assert tok.encode("".join(chars)) == list(range(3, tok.vocab_size))
    # Digits and operators come first after the specials: part of the checkpoint format.
    assert tok.encode("0123456789+-*=") == list(range(3, 17))


def test_round_trip() -> None:
    tok = CharTokenizer()
    text = "37+5=42 Hello, World! (x*y)/2"
    assert tok.decode(tok.encode(text)) == text


def test_prompt_response_layout_and_decode_stops_at_eos() -> None:
    tok = CharTokenizer()
    ids = tok.encode_prompt("1+1=") + tok.encode_response("2") + [tok.pad_id, tok.pad_id]
    assert ids[0] == tok.bos_id
    assert ids[-3] == tok.eos_id
    assert tok.decode(ids) == "<bos>1+1=2"
    assert tok.decode(ids, skip_special=True) == "1+1=2"
    assert tok.decode(ids[:-3] + [tok.eos_id] + tok.encode("9"), skip_special=True) == "1+1=2"
    assert tok.decode(ids[:-3] + [tok.eos_id] + tok.encode("9"), stop_at_eos=False) == "<bos>1+1=2<eos>9"
    assert tok.decode(ids[:-3] + [tok.eos_id] + tok.encode("9"), stop_at_eos=False, skip_special=True) == "1+1=29"


def test_specials_inside_a_response_are_visible() -> None:
    # An exact-match reward must not accept "4<pad>2" or "<bos>42" as "42".
    tok = CharTokenizer()
    assert tok.decode(tok.encode("4") + [tok.pad_id] + tok.encode("2") + [tok.eos_id]) == "4<pad>2"
    assert tok.decode([tok.bos_id] + tok.encode("42")) == "<bos>42"


def test_unknown_character_is_named() -> None:
    tok = CharTokenizer()
    with pytest.raises(ValueError, match="unknown character '€' at position 2"):
        tok.encode("ab€")


def test_out_of_range_id() -> None:
    tok = CharTokenizer()
    with pytest.raises(ValueError, match=f"token id {tok.vocab_size} outside vocabulary"):
        tok.decode([tok.vocab_size])


def test_protocol_and_plain_chat_concatenation() -> None:
    tok = CharTokenizer()
    assert isinstance(tok, Tokenizer)
    assert tok.chat_template is None
    turns = [{"role": "user", "content": "3+4="}, {"role": "assistant", "content": "7"}]
    assert tok.apply_chat_template(turns, add_generation_prompt=False) == "3+4=7"
    assert tok.apply_chat_template(turns[:1], add_generation_prompt=True) == "3+4="
    with pytest.raises(ValueError, match=r"messages\[1\]\.role: got 'robot'"):
        tok.apply_chat_template([turns[0], {"role": "robot", "content": "x"}], add_generation_prompt=False)
    with pytest.raises(ValueError, match=r"messages\[0\]\.content: must be a string"):
        tok.apply_chat_template([{"role": "user", "content": 3}], add_generation_prompt=False)
