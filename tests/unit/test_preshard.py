"""shard_meta_for_dp: validation, shard invariants, the
worked examples, order restoration and equal microbatch counts."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_dp.data_plane.driver_mixin import shard_meta_for_dp
from nemo_dp.data_plane.interfaces import KVBatchMeta
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.distributed.packers import PACKER_NAMES

LENGTHS = [1204, 499, 1445, 876, 361, 487, 927, 678]


def _meta(lengths: list[int] = LENGTHS, **kw) -> KVBatchMeta:
    n = len(lengths)
    base = dict(
        partition_id="train",
        task_name="prev_lp",
        sample_ids=[f"u{i}" for i in range(n)],
        fields=["input_ids", "input_lengths"],
        sequence_lengths=list(lengths),
        extra_info={"global_forward_pad_seqlen": 1472, "local_partition_generation": 3,
                    "nested": {"k": 1}},
        tags=[{"row": i} for i in range(n)],
    )
    base.update(kw)
    return KVBatchMeta(**base)


def _dyn(max_tokens: int = 4096, round_to: int = 64) -> dict:
    return {"max_tokens_per_microbatch": max_tokens, "sequence_length_round": round_to,
            "input_key": "input_ids", "input_lengths_key": "input_lengths"}


def _pack(algorithm: str = "first_fit_decreasing", max_tokens: int = 2048, **extra) -> dict:
    return {"max_tokens_per_microbatch": max_tokens, "algorithm": algorithm,
            "sequence_length_pad_multiple": 64, "input_key": "input_ids",
            "input_lengths_key": "input_lengths", **extra}


def _rows(metas: list[KVBatchMeta]) -> list[list[int]]:
    return [[int(s[1:]) for s in m.sample_ids] for m in metas]


def test_validation_errors() -> None:
    with pytest.raises(ValueError, match="empty meta — nothing to shard"):
        shard_meta_for_dp(KVBatchMeta("p", None, []), dp_world=1)
    with pytest.raises(ValueError, match="requires meta.sequence_lengths"):
        shard_meta_for_dp(KVBatchMeta("p", None, ["a", "b"]), dp_world=1)
    misaligned = _meta()
    misaligned.sequence_lengths = [1, 2]  # bypasses __post_init__
    with pytest.raises(ValueError, match="requires meta.sequence_lengths"):
        shard_meta_for_dp(misaligned, dp_world=2)
    with pytest.raises(ValueError, match="Pass at most one of sequence_packing_args / dynamic_batching_args."):
        shard_meta_for_dp(_meta(), dp_world=2, sequence_packing_args=_pack(), dynamic_batching_args=_dyn())
    with pytest.raises(ValueError, match="batch_size"):
        shard_meta_for_dp(_meta(), dp_world=2, batch_size=3)
    with pytest.raises(ValueError, match="dp_world"):
        shard_meta_for_dp(_meta(), dp_world=3)
    with pytest.raises(ValueError, match="dp_world"):
        shard_meta_for_dp(_meta(), dp_world=4, batch_size=2)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dp_world": 2},
        {"dp_world": 2, "batch_size": 4},
        {"dp_world": 2, "dynamic_batching_args": _dyn()},
        {"dp_world": 4, "sequence_packing_args": _pack()},
    ],
    ids=["plain", "chunks", "dynamic", "packing"],
)
def test_shard_invariants(kwargs: dict) -> None:
    meta = _meta()
    snapshot = copy.deepcopy(meta)
    metas, _ = shard_meta_for_dp(meta, **kwargs)
    assert meta == snapshot  # input untouched
    all_ids = [sid for m in metas for sid in m.sample_ids]
    assert sorted(all_ids) == sorted(meta.sample_ids)
    assert len(set(all_ids)) == len(all_ids)
    planned = "dynamic_batching_args" in kwargs or "sequence_packing_args" in kwargs
    for m in metas:
        assert (m.partition_id, m.task_name, m.fields) == ("train", "prev_lp", meta.fields)
        assert m.fields is not meta.fields
        for sid, length, tag in zip(m.sample_ids, m.sequence_lengths, m.tags):
            i = int(sid[1:])
            assert length == LENGTHS[i]
            assert tag == {"row": i}
        for key in ("global_forward_pad_seqlen", "local_partition_generation", "nested"):
            assert m.extra_info[key] == meta.extra_info[key]
        assert m.extra_info is not meta.extra_info
        assert m.extra_info["nested"] is meta.extra_info["nested"]  # shallow copy
        if planned:
            assert "micro_batch_indices" in m.extra_info
            assert "micro_batch_lengths" in m.extra_info
        else:
            assert "micro_batch_indices" not in m.extra_info
    if planned:
        # each shard owns its plan objects
        assert metas[0].extra_info["micro_batch_indices"] is not metas[1].extra_info["micro_batch_indices"]
        metas[0].extra_info["micro_batch_indices"][0].append([9, 9])
        assert [9, 9] not in metas[1].extra_info["micro_batch_indices"][0]


def test_inherited_plan_keys_are_not_copied_to_unplanned_shards() -> None:
    meta = _meta(extra_info={"micro_batch_indices": [[[0, 8]]], "micro_batch_lengths": [[2048]],
                             "pad_to_multiple": 8})
    metas, _ = shard_meta_for_dp(meta, dp_world=2)
    for m in metas:
        assert "micro_batch_indices" not in m.extra_info
        assert "micro_batch_lengths" not in m.extra_info
        assert m.extra_info["pad_to_multiple"] == 8


def test_worked_example_no_packing() -> None:
    metas, order = shard_meta_for_dp(_meta(), dp_world=2)
    assert _rows(metas) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert order is None


def test_worked_example_no_packing_chunks() -> None:
    metas, order = shard_meta_for_dp(_meta(), dp_world=2, batch_size=4)
    assert _rows(metas) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert order == [0, 1, 4, 5, 2, 3, 6, 7]


def test_worked_example_dynamic_batching() -> None:
    metas, order = shard_meta_for_dp(_meta(), dp_world=2, dynamic_batching_args=_dyn())
    assert _rows(metas) == [[4, 1, 3, 0], [5, 7, 6, 2]]
    assert order == [4, 1, 3, 0, 5, 7, 6, 2]
    for m in metas:
        assert m.extra_info["micro_batch_indices"] == [[[0, 3], [3, 4]]]
        assert m.extra_info["micro_batch_lengths"] == [[960, 1472]]
        assert "elem_counts_per_gb" not in m.extra_info


def test_worked_example_width_one_placeholder_bug_vector() -> None:
    """The planner on a width-1 skeleton clamps every length to 1 (what preshard must avoid)."""
    n = len(LENGTHS)
    skeleton = BatchedDataDict({
        "input_ids": torch.zeros(n, 1, dtype=torch.int64),
        "input_lengths": torch.tensor(LENGTHS),
        "sample_mask": torch.ones(n),
        "meta_idx": torch.arange(n),
    })
    shards, order = skeleton.shard_by_batch_size(2, dynamic_batching_args=_dyn())
    assert [s["meta_idx"].tolist() for s in shards] == [[4, 1, 3, 0], [5, 7, 6, 2]]
    for s in shards:
        assert s.micro_batch_indices == [[[0, 4]]]
        assert s.micro_batch_lengths == [[1]]
    metas, _ = shard_meta_for_dp(_meta(), dp_world=2, dynamic_batching_args=_dyn())
    assert metas[0].extra_info["micro_batch_lengths"] != [[1]]


def test_worked_example_packing_dp4() -> None:
    metas, order = shard_meta_for_dp(_meta(), dp_world=4, sequence_packing_args=_pack())
    assert _rows(metas) == [[2, 5], [0, 7], [6, 3], [1, 4]]
    assert order == [2, 5, 0, 7, 6, 3, 1, 4]
    assert [m.extra_info["micro_batch_lengths"] for m in metas] == [[[1984]], [[1920]], [[1856]], [[896]]]
    for m in metas:
        assert m.extra_info["micro_batch_indices"] == [[[0, 2]]]
        assert m.extra_info["elem_counts_per_gb"] == [2]


def test_worked_example_packing_dp2() -> None:
    metas, order = shard_meta_for_dp(_meta(), dp_world=2, sequence_packing_args=_pack())
    assert _rows(metas) == [[2, 5, 6, 3], [0, 7, 1, 4]]
    assert order == [2, 5, 6, 3, 0, 7, 1, 4]
    assert metas[0].extra_info["micro_batch_lengths"] == [[1984, 1856]]
    assert metas[1].extra_info["micro_batch_lengths"] == [[1920, 896]]
    for m in metas:
        assert m.extra_info["micro_batch_indices"] == [[[0, 2], [2, 4]]]
        assert m.extra_info["elem_counts_per_gb"] == [4]


def test_documented_unequal_rank_loads() -> None:
    metas, _ = shard_meta_for_dp(_meta(), dp_world=4, sequence_packing_args=_pack(max_tokens=4096))
    assert [sum(m.extra_info["micro_batch_lengths"][0]) for m in metas] == [4032, 1600, 512, 512]


_MODES = ["plain", "chunks", "dynamic"] + [f"pack:{p}" for p in PACKER_NAMES]


def _mode_kwargs(mode: str, dp: int, bs: int | None, max_tokens: int) -> dict:
    kw: dict = {"dp_world": dp, "batch_size": bs}
    if mode == "dynamic":
        kw["dynamic_batching_args"] = _dyn(max_tokens=max_tokens)
    elif mode.startswith("pack:"):
        kw["sequence_packing_args"] = _pack(mode.split(":", 1)[1], max_tokens=max_tokens)
    return kw


def _worker_outputs(metas: list[KVBatchMeta]) -> BatchedDataDict:
    """Simulate per-rank worker outputs keyed by the rows' ids, concatenated in rank order."""
    outs = [BatchedDataDict({"row": torch.tensor([int(s[1:]) for s in m.sample_ids]),
                             "id": list(m.sample_ids)}) for m in metas]
    return BatchedDataDict.from_batches(outs)


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("dp", [1, 2, 4])
def test_reorder_restores_order_every_mode(mode: str, dp: int) -> None:
    bs = 4 if mode == "chunks" else None
    metas, order = shard_meta_for_dp(_meta(), **_mode_kwargs(mode, dp, bs, 4096))
    merged = _worker_outputs(metas)
    if order is not None:
        merged.reorder_data(order)
    assert merged["row"].tolist() == list(range(8))
    assert merged["id"] == _meta().sample_ids


def test_inverse_permutation_would_not_restore() -> None:
    """Guard against returning the inverse: for this 2-rank case it differs from `order`."""
    metas, order = shard_meta_for_dp(_meta(), dp_world=2, dynamic_batching_args=_dyn())
    inverse = [0] * len(order)
    for p, i in enumerate(order):
        inverse[i] = p
    assert inverse != order
    merged = _worker_outputs(metas)
    merged.reorder_data(inverse)
    assert merged["row"].tolist() != list(range(8))


@settings(max_examples=50, deadline=None)
@given(
    data=st.data(),
    dp=st.sampled_from([1, 2, 3, 4]),
    chunks=st.integers(1, 3),
    mode=st.sampled_from(["plain", "dynamic"] + [f"pack:{p}" for p in PACKER_NAMES]),
)
def test_property_every_id_once_equal_counts_and_restore(data, dp, chunks, mode) -> None:
    per_rank = data.draw(st.integers(1, 4))
    bs = dp * per_rank
    n = bs * chunks
    lengths = data.draw(st.lists(st.integers(1, 1500), min_size=n, max_size=n))
    meta = _meta(lengths)
    try:
        metas, order = shard_meta_for_dp(meta, **_mode_kwargs(mode, dp, bs, 2048))
    except ValueError as exc:
        assert mode.startswith("pack:") and "cannot make" in str(exc)
        return
    assert len(metas) == dp
    ids = [sid for m in metas for sid in m.sample_ids]
    assert sorted(ids) == sorted(meta.sample_ids) and len(set(ids)) == n
    if order is None:
        assert ids == meta.sample_ids
    else:
        assert [meta.sample_ids[i] for i in order] == ids
    if mode != "plain":
        counts = [[len(c) for c in m.extra_info["micro_batch_indices"]] for m in metas]
        assert all(c == counts[0] for c in counts), counts
        for m in metas:
            assert len(m.extra_info["micro_batch_indices"]) == chunks
            covered = sum(c[-1][1] for c in m.extra_info["micro_batch_indices"])
            assert covered == m.size
    merged = _worker_outputs(metas)
    if order is not None:
        merged.reorder_data(order)
    assert merged["id"] == meta.sample_ids


@pytest.mark.parametrize("which", ["dynamic_batching_args", "sequence_packing_args"])
def test_packing_args_are_forwarded_to_the_planner_unread(which: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner is replaced by a recorder (isolating shard_meta_for_dp from it): the args
    object reaches it unchanged, and the skeleton holds ``input_ids`` / ``input_lengths``
    whatever the args say, so args without ``input_key`` are not read for it."""
    seen: dict[str, Any] = {}

    def planner(self: BatchedDataDict, shards: int, batch_size: int | None = None, **kwargs: Any) -> Any:
        seen["keys"] = sorted(self.data)
        seen["kwargs"] = kwargs
        return [self.select_indices(list(range(r, self.size, shards))) for r in range(shards)]

    monkeypatch.setattr(BatchedDataDict, "shard_by_batch_size", planner)
    args = {"max_tokens_per_microbatch": 4096, "sequence_length_round": 64, "algorithm": "concatenative",
            "sequence_length_pad_multiple": 64}
    metas, _ = shard_meta_for_dp(_meta(), dp_world=2, **{which: args})
    assert seen["kwargs"][which] is args
    assert seen["keys"] == ["input_ids", "input_lengths", "meta_idx", "sample_mask"]
    assert sorted(s for m in metas for s in m.sample_ids) == sorted(_meta().sample_ids)
