"""Datasets, EpochLoader (determinism, epochs, exact resume) and the SFT collator."""

from __future__ import annotations

import pytest
import torch

from nemo_dp.data.arithmetic import ArithmeticTask
from nemo_dp.data.datasets import EpochLoader, RLPromptDataset, SFTDataset, collate_sft
from nemo_dp.models.tiny.tokenizer import CharTokenizer


def _ds(n: int = 10) -> SFTDataset:
    return SFTDataset([(f"{i}+0=", str(i)) for i in range(n)])


def test_from_arithmetic() -> None:
    task = ArithmeticTask(2, ("+",), seed=0)
    sft, rl = SFTDataset.from_arithmetic(task, 5), RLPromptDataset.from_arithmetic(task, 5)
    assert [(p.prompt, p.answer) for p in rl.problems] == sft.pairs
    with pytest.raises(ValueError, match="no examples"):
        SFTDataset([])


def test_loader_epochs_cover_dataset_and_drop_last() -> None:
    loader = EpochLoader(_ds(10), batch_size=3, seed=7)
    seen = [loader.next_batch() for _ in range(3)]
    flat = [x for b in seen for x in b]
    assert len(set(flat)) == 9 and loader.epoch == 0
    first_epoch_indices = [loader._epoch_order()[:9]]
    fourth = loader.next_batch()  # a 4th batch of epoch 0 would be partial -> new epoch
    assert loader.epoch == 1 and loader.cursor == 3
    assert fourth == [loader.dataset[i] for i in loader.last_batch_indices]
    # Different epochs use different orders; same seed gives same orders.
    assert [loader._epoch_order()[:9]] != first_epoch_indices
    other = EpochLoader(_ds(10), batch_size=3, seed=7)
    assert [other.next_batch() for _ in range(4)] == seen + [fourth]
    assert EpochLoader(_ds(10), 3, seed=8).next_batch() != seen[0]


def test_no_shuffle_is_in_order() -> None:
    loader = EpochLoader(_ds(5), batch_size=2, seed=0, shuffle=False)
    assert [loader.next_batch() for _ in range(3)] == [_ds(5).pairs[0:2], _ds(5).pairs[2:4], _ds(5).pairs[0:2]]


def test_resume_reproduces_uninterrupted_sequence() -> None:
    ref = EpochLoader(_ds(10), 4, seed=1)
    expected = [ref.next_batch() for _ in range(9)]
    first = EpochLoader(_ds(10), 4, seed=1)
    got = [first.next_batch() for _ in range(5)]
    state = first.state_dict()
    resumed = EpochLoader(_ds(10), 4, seed=1)
    resumed.load_state_dict(state)
    got += [resumed.next_batch() for _ in range(4)]
    assert got == expected


def test_load_state_dict_checks_settings() -> None:
    state = EpochLoader(_ds(10), 4, seed=1).state_dict()
    with pytest.raises(ValueError, match="batch_size is 4 in the state but 5 in this loader"):
        EpochLoader(_ds(10), 5, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="dataset_len is 10 in the state but 9"):
        EpochLoader(_ds(9), 4, seed=1).load_state_dict(state)
    del state["cursor"]
    with pytest.raises(KeyError, match="missing field 'cursor'"):
        EpochLoader(_ds(10), 4, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size 11 exceeds dataset size 10"):
        EpochLoader(_ds(10), 11, seed=1)


def test_collate_sft() -> None:
    tok = CharTokenizer()
    batch = collate_sft([("1+1=", "2"), ("10+10=", "20")], tok)
    ids, mask = batch["input_ids"], batch["token_mask"]
    assert ids.dtype == torch.int64 and mask.dtype == torch.int32
    assert batch["input_lengths"].dtype == torch.int32 and batch["sample_mask"].dtype == torch.float32
    assert batch["input_lengths"].tolist() == [7, 10]
    assert ids[0].tolist() == [tok.bos_id] + tok.encode("1+1=2") + [tok.eos_id] + [tok.pad_id] * 3
    assert mask[0].tolist() == [0] * 5 + [1, 1] + [0] * 3
    assert mask[1].tolist() == [0] * 7 + [1, 1, 1]
    assert batch["sample_mask"].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="example 1 has 10 tokens > max_seq_len=8"):
        collate_sft([("1+1=", "2"), ("10+10=", "20")], tok, max_seq_len=8)


def test_sft_dataset_keeps_conversations_and_reads_both_shapes() -> None:
    from pathlib import Path

    from nemo_dp.data.chat import ChatExample, Message

    chat = ChatExample((Message("user", "1+1="), Message("assistant", "2")))
    ds = SFTDataset([("a", "b"), chat])
    assert ds[0] == ("a", "b") and ds[1] is chat
    data = Path(__file__).resolve().parents[1] / "data"
    tok = CharTokenizer()
    pairs = SFTDataset.from_jsonl(str(data / "sft_prompt_response.jsonl"))
    chats = SFTDataset.from_jsonl(str(data / "sft_chat.jsonl"), key="env.sft_jsonl")
    # Same problems; the chat rows carry a system turn on even lines and a follow-up on every 4th.
    assert chats[1] == ChatExample((Message("user", pairs[1][0]), Message("assistant", pairs[1][1])))
    batch = collate_sft([chats[i] for i in range(len(chats))], tok)
    learned = [
        tok.decode([t for t, m in zip(ids.tolist(), mask.tolist()) if m], stop_at_eos=False)
        for ids, mask in zip(batch["input_ids"], batch["token_mask"])
    ]
    assert learned[0] == pairs[0][1] + "<eos>"
    assert learned[3] == pairs[3][1] + "<eos>" + str(int(pairs[3][1]) + 1) + "<eos>"
    problems = RLPromptDataset.from_jsonl(str(data / "rl_messages.jsonl"), tokenizer=tok)
    assert problems[1].prompt == "Put the final answer in \\boxed{}.Compute 84+67." and problems[1].answer == "151"
