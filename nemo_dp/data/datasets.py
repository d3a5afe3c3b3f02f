"""Datasets, a resumable epoch loader, and the SFT collator."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

import torch

from nemo_dp.data.arithmetic import ArithmeticTask, Problem
from nemo_dp.data.chat import ChatExample, SFTExample, tokenize_sft_example
from nemo_dp.data.jsonl import load_rl_jsonl, load_sft_jsonl
from nemo_dp.data.image_rows import is_image_example

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class _Sized(Protocol[T_co]):
    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> T_co: ...


class SFTDataset:
    """SFT examples: (prompt, response) pairs and/or ``ChatExample`` conversations (``ValueError`` if empty)."""

    def __init__(self, pairs: Sequence[SFTExample]) -> None:
        if not pairs:
            raise ValueError("SFTDataset: no examples")
        self.pairs: Sequence[SFTExample] = (
            [ex if isinstance(ex, ChatExample) or is_image_example(ex) else (str(ex[0]), str(ex[1])) for ex in pairs]
            if isinstance(pairs, list)
            else pairs
        )

    @classmethod
    def from_arithmetic(cls, task: ArithmeticTask, n: int) -> SFTDataset:
        """``n`` training problems of ``task`` as (prompt, answer) pairs."""
        return cls([(p.prompt, p.answer) for p in task.train_problems(n)])

    @classmethod
    def from_jsonl(cls, path: str, *, key: str | None = None) -> SFTDataset:
        """Examples from an SFT jsonl file (``DatasetError`` naming the line at fault)."""
        return cls(load_sft_jsonl(path, key=key))

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> SFTExample:
        return self.pairs[index]


class RLPromptDataset:
    """Problems (prompt + reference answer) for RL (``ValueError`` if empty)."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        if not problems:
            raise ValueError("RLPromptDataset: no problems")
        self.problems: Sequence[Problem] = list(problems) if isinstance(problems, (list, tuple)) else problems

    @classmethod
    def from_arithmetic(cls, task: ArithmeticTask, n: int) -> RLPromptDataset:
        """``n`` training problems of ``task``."""
        return cls(task.train_problems(n))

    @classmethod
    def from_jsonl(cls, path: str, *, tokenizer: Any | None = None, key: str | None = None) -> RLPromptDataset:
        """Like :meth:`SFTDataset.from_jsonl`, for an RL jsonl file."""
        return cls(load_rl_jsonl(path, tokenizer=tokenizer, key=key))

    def __len__(self) -> int:
        return len(self.problems)

    def __getitem__(self, index: int) -> Problem:
        return self.problems[index]


class EpochLoader(Generic[T]):
    """Deterministic, resumable batch loader: a resumed run sees exactly the uninterrupted run's batches.

    Each epoch visits a permutation of the dataset (a function of ``seed`` and the epoch only, or
    the identity without ``shuffle``) in full batches; the last partial batch is dropped.
    ``ValueError`` if ``batch_size`` is not in ``1 .. len(dataset)``.
    """

    def __init__(self, dataset: _Sized[T], batch_size: int, seed: int, shuffle: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"EpochLoader: batch_size must be >= 1, got {batch_size}")
        if batch_size > len(dataset):
            raise ValueError(f"EpochLoader: batch_size {batch_size} exceeds dataset size {len(dataset)}")
        self.dataset, self.batch_size, self.seed, self.shuffle = dataset, batch_size, seed, shuffle
        self.epoch = self.cursor = 0
        self.last_batch_indices: list[int] = []
        self._order: list[int] | None = None

    def _epoch_order(self) -> list[int]:
        if self._order is None:
            order = list(range(len(self.dataset)))
            if self.shuffle:
                random.Random(f"epoch-loader-{self.seed}-{self.epoch}").shuffle(order)
            self._order = order
        return self._order

    def next_batch(self) -> list[T]:
        """The next ``batch_size`` examples; also sets ``last_batch_indices`` (their dataset indices)."""
        if self.cursor + self.batch_size > len(self.dataset):
            self.epoch += 1
            self.cursor = 0
            self._order = None
        order = self._epoch_order()
        idx = order[self.cursor : self.cursor + self.batch_size]
        self.cursor += self.batch_size
        self.last_batch_indices = idx
        return [self.dataset[i] for i in idx]

    def state_dict(self) -> dict[str, Any]:
        """Position of the loader (plus the settings that must match on resume)."""
        return {
            "epoch": self.epoch, "cursor": self.cursor, "seed": self.seed, "batch_size": self.batch_size,
            "shuffle": self.shuffle, "dataset_len": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` of a loader with the same settings and dataset size.

        Raises:
            KeyError: A field is missing.
            ValueError: A setting differs (naming it) or the position is out of range.
        """
        for key in ("epoch", "cursor", "seed", "batch_size", "shuffle", "dataset_len"):
            if key not in state:
                raise KeyError(f"EpochLoader.load_state_dict: missing field {key!r}")
        current = self.state_dict()
        for key in ("seed", "batch_size", "shuffle", "dataset_len"):
            if state[key] != current[key]:
                raise ValueError(
                    f"EpochLoader.load_state_dict: {key} is {state[key]!r} in the state but "
                    f"{current[key]!r} in this loader"
                )
        if not 0 <= state["cursor"] <= len(self.dataset) or state["epoch"] < 0:
            raise ValueError(
                f"EpochLoader.load_state_dict: invalid position epoch={state['epoch']}, cursor={state['cursor']}"
            )
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
        self._order = None


def collate_sft(examples: Sequence[SFTExample], tokenizer: Any, max_seq_len: int | None = None) -> Any:
    """Tokenise (``tokenize_sft_example``) and right-pad SFT examples into a ``BatchedDataDict``.

    It holds ``input_ids`` int64 [B, S] (padded with ``pad_id``), ``input_lengths`` int32 [B],
    ``token_mask`` int32 [B, S] (1 on the learned tokens) and ``sample_mask`` float32 [B] (ones).
    ``ValueError`` for an empty batch, an unknown character, or an example over ``max_seq_len``.
    """
    from nemo_dp.distributed.batched_data_dict import BatchedDataDict

    if not examples:
        raise ValueError("collate_sft: empty batch")
    if is_image_example(examples[0]):
        from nemo_dp.data.visual_collate import collate_visual_sft

        return collate_visual_sft(examples, tokenizer, max_seq_len=max_seq_len)
    rows = [tokenize_sft_example(ex, tokenizer) for ex in examples]
    for i, row in enumerate(rows):
        if max_seq_len is not None and len(row.ids) > max_seq_len:
            raise ValueError(f"collate_sft: example {i} has {len(row.ids)} tokens > max_seq_len={max_seq_len}")
    width = max(len(r.ids) for r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
    token_mask = torch.zeros((len(rows), width), dtype=torch.int32)
    for i, row in enumerate(rows):
        input_ids[i, : len(row.ids)] = torch.tensor(row.ids, dtype=torch.long)
        token_mask[i, : len(row.ids)] = torch.tensor(row.loss_mask, dtype=torch.int32)
    return BatchedDataDict(
        {
            "input_ids": input_ids,
            "input_lengths": torch.tensor([len(r.ids) for r in rows], dtype=torch.int32),
            "token_mask": token_mask,
            "sample_mask": torch.ones(len(rows), dtype=torch.float32),
        }
    )
