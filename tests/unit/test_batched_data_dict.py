"""BatchedDataDict row operations, the DP planner and the microbatch iterator (§12.2, §12.3)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_dp.distributed.batched_data_dict import BatchedDataDict, MicrobatchSpec
from nemo_dp.distributed.packers import PACKER_NAMES

LENGTHS = [1204, 499, 1445, 876, 361, 487, 927, 678]


def _objs(values: list) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def _batch(n: int = 4) -> BatchedDataDict:
    return BatchedDataDict(
        {
            "ids": torch.arange(n * 3).reshape(n, 3),
            "len": torch.arange(n),
            "names": [f"r{i}" for i in range(n)],
            "objs": _objs([{"i": i} for i in range(n)]),
            "jag": torch.nested.as_nested_tensor(
                [torch.arange(i + 1, dtype=torch.float32) for i in range(n)], layout=torch.jagged
            ),
        }
    )


def _dyn(max_tokens: int = 4096, round_to: int = 64) -> dict:
    return {
        "max_tokens_per_microbatch": max_tokens,
        "sequence_length_round": round_to,
        "input_key": "input_ids",
        "input_lengths_key": "input_lengths",
    }


def _pack(algorithm: str = "first_fit_decreasing", max_tokens: int = 2048, **extra) -> dict:
    return {
        "max_tokens_per_microbatch": max_tokens,
        "algorithm": algorithm,
        "sequence_length_pad_multiple": 64,
        "input_key": "input_ids",
        "input_lengths_key": "input_lengths",
        **extra,
    }


def _planner_batch(lengths: list[int], width: int | None = None) -> BatchedDataDict:
    n = len(lengths)
    w = width if width is not None else 2048
    return BatchedDataDict(
        {
            "input_ids": torch.zeros(n, w, dtype=torch.int64),
            "input_lengths": torch.tensor(lengths),
            "idx": torch.arange(n),
        }
    )


def test_is_mapping_not_dict_and_defaults() -> None:
    b = _batch()
    assert isinstance(b, Mapping)
    assert not isinstance(b, dict)
    assert b.micro_batch_indices is None
    assert b.micro_batch_lengths is None
    assert b.elem_counts_per_gb is None
    assert b.size == 4
    assert BatchedDataDict().size == 0


def test_size_disagreement_raises() -> None:
    with pytest.raises(ValueError, match="disagree"):
        _ = BatchedDataDict({"a": torch.zeros(2), "b": [1, 2, 3]}).size


def test_select_indices_every_kind() -> None:
    b = _batch()
    s = b.select_indices([3, 1, 3])
    assert torch.equal(s["ids"], b["ids"][[3, 1, 3]])
    assert s["names"] == ["r3", "r1", "r3"]
    assert [o["i"] for o in s["objs"]] == [3, 1, 3]
    assert s["jag"].is_nested
    assert [r.tolist() for r in s["jag"].unbind()] == [[0, 1, 2, 3], [0, 1], [0, 1, 2, 3]]
    assert s.size == 3
    with pytest.raises(IndexError):
        b.select_indices([4])


def test_slice_and_repeat_interleave() -> None:
    b = _batch()
    s = b.slice(1, 3)
    assert s["names"] == ["r1", "r2"]
    assert [r.numel() for r in s["jag"].unbind()] == [2, 3]
    with pytest.raises(IndexError):
        b.slice(2, 5)
    r = b.repeat_interleave(2)
    assert r["names"] == ["r0", "r0", "r1", "r1", "r2", "r2", "r3", "r3"]
    assert torch.equal(r["len"], torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
    assert [o["i"] for o in r["objs"]] == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError):
        b.repeat_interleave(0)


def test_from_batches_pads_widths() -> None:
    a = BatchedDataDict({"input_ids": torch.ones(2, 3, dtype=torch.int64), "m": torch.ones(2, 3),
                         "names": ["a", "b"], "o": _objs([1, 2])})
    b = BatchedDataDict({"input_ids": torch.full((1, 5), 2), "m": torch.ones(1, 5),
                         "names": ["c"], "o": _objs([[3]])})
    out = BatchedDataDict.from_batches([a, b], pad_value_dict={"input_ids": 9})
    assert out["input_ids"].shape == (3, 5)
    assert out["input_ids"].dtype == torch.int64
    assert out["input_ids"][0].tolist() == [1, 1, 1, 9, 9]
    assert out["m"][1].tolist() == [1, 1, 1, 0, 0]
    assert out["names"] == ["a", "b", "c"]
    assert list(out["o"]) == [1, 2, [3]]
    with pytest.raises(ValueError, match="different keys"):
        BatchedDataDict.from_batches([a, BatchedDataDict({"x": [1]})])


def test_reorder_data_semantics_and_to() -> None:
    b = BatchedDataDict({"x": torch.tensor([10, 20, 30]), "n": ["a", "b", "c"]})
    out = b.reorder_data([2, 0, 1])
    assert out is b
    # row j is the row whose order value is the j-th smallest: values 0,1,2 at rows 1,2,0
    assert b["x"].tolist() == [20, 30, 10]
    assert b["n"] == ["b", "c", "a"]
    with pytest.raises(ValueError):
        b.reorder_data([0, 1])
    assert b.to("cpu") is b


def test_broadcast_placeholder_stays_a_view() -> None:
    ph = torch.zeros((), dtype=torch.int64).expand(6, 1000)
    b = BatchedDataDict({"input_ids": ph, "i": torch.arange(6)})
    s = b.select_indices([5, 0])
    assert s["input_ids"].shape == (2, 1000)
    assert all(st_ == 0 for st_ in s["input_ids"].stride())


# --- planner ---------------------------------------------------------------------------------


def _idx(shards: list[BatchedDataDict]) -> list[list[int]]:
    return [s["idx"].tolist() for s in shards]


def test_planner_no_packing() -> None:
    b = _planner_batch(LENGTHS)
    shards = b.shard_by_batch_size(2)
    assert isinstance(shards, list)
    assert _idx(shards) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert _idx(b.shard_by_batch_size(2, batch_size=4)) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert all(s.micro_batch_indices is None for s in shards)


def test_planner_dynamic_batching_worked_example() -> None:
    shards, order = _planner_batch(LENGTHS).shard_by_batch_size(2, dynamic_batching_args=_dyn())
    assert _idx(shards) == [[4, 1, 3, 0], [5, 7, 6, 2]]
    assert order == [4, 1, 3, 0, 5, 7, 6, 2]
    for s in shards:
        assert s.micro_batch_indices == [[[0, 3], [3, 4]]]
        assert s.micro_batch_lengths == [[960, 1472]]
        assert s.elem_counts_per_gb is None


def test_planner_dynamic_batching_width_one_placeholder_bug() -> None:
    shards, _ = _planner_batch(LENGTHS, width=1).shard_by_batch_size(2, dynamic_batching_args=_dyn())
    for s in shards:
        assert s.micro_batch_indices == [[[0, 4]]]
        assert s.micro_batch_lengths == [[1]]


def test_planner_dynamic_two_chunks() -> None:
    shards, order = _planner_batch(LENGTHS).shard_by_batch_size(
        2, batch_size=4, dynamic_batching_args=_dyn(max_tokens=2048)
    )
    # chunk 0 = rows 0..3 sorted (1:499, 3:876, 0:1204, 2:1445); chunk 1 = rows 4..7
    assert _idx(shards) == [[1, 0, 4, 7], [3, 2, 5, 6]]
    assert order == [1, 0, 4, 7, 3, 2, 5, 6]
    # chunk 0: L = [896, 1472] -> 2*1472 > 2048 -> two microbatches
    assert shards[0].micro_batch_indices == [[[0, 1], [1, 2]], [[0, 2]]]
    assert shards[0].micro_batch_lengths == [[896, 1472], [960]]


def test_planner_dynamic_rejects_sequence_longer_than_budget() -> None:
    with pytest.raises(ValueError, match="max_tokens_per_microbatch"):
        _planner_batch(LENGTHS).shard_by_batch_size(2, dynamic_batching_args=_dyn(max_tokens=1024))


def test_planner_sequence_packing_worked_examples() -> None:
    shards, order = _planner_batch(LENGTHS).shard_by_batch_size(4, sequence_packing_args=_pack())
    assert _idx(shards) == [[2, 5], [0, 7], [6, 3], [1, 4]]
    assert order == [2, 5, 0, 7, 6, 3, 1, 4]
    assert [s.micro_batch_lengths for s in shards] == [[[1984]], [[1920]], [[1856]], [[896]]]
    for s in shards:
        assert s.micro_batch_indices == [[[0, 2]]]
        assert s.elem_counts_per_gb == [2]
    shards2, order2 = _planner_batch(LENGTHS).shard_by_batch_size(2, sequence_packing_args=_pack())
    assert _idx(shards2) == [[2, 5, 6, 3], [0, 7, 1, 4]]
    assert order2 == [2, 5, 6, 3, 0, 7, 1, 4]
    assert shards2[0].micro_batch_lengths == [[1984, 1856]]
    assert shards2[1].micro_batch_lengths == [[1920, 896]]
    assert all(s.micro_batch_indices == [[[0, 2], [2, 4]]] for s in shards2)


def test_planner_largest_first_and_bad_order() -> None:
    shards, _ = _planner_batch(LENGTHS).shard_by_batch_size(
        2, sequence_packing_args=_pack(microbatch_order="largest_first")
    )
    assert _idx(shards) == [[2, 5, 6, 3], [0, 7, 1, 4]]  # already descending
    shards_p, _ = _planner_batch(LENGTHS).shard_by_batch_size(
        2, sequence_packing_args=_pack(max_tokens=4096, microbatch_order="largest_first")
    )
    for s in shards_p:
        lens = s.micro_batch_lengths[0]
        assert lens == sorted(lens, reverse=True)
    with pytest.raises(ValueError, match="microbatch_order"):
        _planner_batch(LENGTHS).shard_by_batch_size(2, sequence_packing_args=_pack(microbatch_order="random"))


def test_planner_validation() -> None:
    b = _planner_batch(LENGTHS)
    with pytest.raises(ValueError, match="at most one"):
        b.shard_by_batch_size(2, dynamic_batching_args=_dyn(), sequence_packing_args=_pack())
    with pytest.raises(ValueError, match="not a multiple"):
        b.shard_by_batch_size(2, batch_size=3)
    with pytest.raises(ValueError, match="not divisible"):
        b.shard_by_batch_size(3)
    with pytest.raises(ValueError, match="empty"):
        BatchedDataDict({"x": torch.zeros(0)}).shard_by_batch_size(1)
    with pytest.raises(KeyError):
        BatchedDataDict({"input_ids": torch.zeros(2, 2)}).shard_by_batch_size(1, dynamic_batching_args=_dyn())


# --- microbatch plan ----------------------------------------------------------------------------


def _plan_rows(b: BatchedDataDict, micro_batch_size: int | None = None) -> list[list[int]]:
    return [b.slice(sp.start, sp.end)["idx"].tolist() for sp in b.microbatch_plan(micro_batch_size)]


def test_microbatches_fixed() -> None:
    b = _planner_batch([3, 1, 4, 1, 5])
    assert _plan_rows(b, 2) == [[0, 1], [2, 3], [4]]
    assert b.microbatch_plan(2) == [MicrobatchSpec(0, 0, 2, None), MicrobatchSpec(0, 2, 4, None),
                                    MicrobatchSpec(0, 4, 5, None)]
    with pytest.raises(ValueError, match="micro_batch_size"):
        b.microbatch_plan()


def test_microbatches_dynamic_planned_length() -> None:
    b = _planner_batch(LENGTHS, width=1500)
    shards, _ = b.shard_by_batch_size(2, dynamic_batching_args=_dyn())
    assert _plan_rows(shards[0]) == [[4, 1, 3], [0]]
    assert [s.padded_length for s in shards[0].microbatch_plan()] == [960, 1472]
    assert all(shards[0].slice(s.start, s.end).micro_batch_indices is None for s in shards[0].microbatch_plan())


def test_microbatches_packing_per_bin() -> None:
    shards, _ = _planner_batch(LENGTHS).shard_by_batch_size(2, sequence_packing_args=_pack())
    assert _plan_rows(shards[1]) == [[0, 7], [1, 4]]
    assert [s.padded_length for s in shards[1].microbatch_plan()] == [1920, 896]


def test_microbatch_plan_multi_chunk_offsets_and_validation() -> None:
    shards, _ = _planner_batch(LENGTHS).shard_by_batch_size(
        2, batch_size=4, sequence_packing_args=_pack(max_tokens=4096)
    )
    s = shards[0]
    specs = s.microbatch_plan()
    assert specs[0].start == 0
    assert specs[-1].end == s.size
    assert {sp.chunk for sp in specs} == {0, 1}
    bad = s.select_indices(range(s.size))
    bad.micro_batch_indices = [[[0, 1]]]
    bad.micro_batch_lengths = [[5]]
    with pytest.raises(ValueError, match="covers"):
        bad.microbatch_plan()


@settings(max_examples=50, deadline=None)
@given(
    data=st.data(),
    shards=st.sampled_from([1, 2, 4]),
    chunks=st.integers(1, 3),
    mode=st.sampled_from(["none", "dynamic"] + list(PACKER_NAMES)),
)
def test_property_planner(data: st.DataObject, shards: int, chunks: int, mode: str) -> None:
    per_rank = data.draw(st.integers(1, 4))
    bs = shards * per_rank
    lengths = data.draw(st.lists(st.integers(1, 1000), min_size=bs * chunks, max_size=bs * chunks))
    b = _planner_batch(lengths, width=1024)
    if mode == "none":
        result = b.shard_by_batch_size(shards, batch_size=bs)
        out, order = result, [i for s in result for i in s["idx"].tolist()]
    elif mode == "dynamic":
        out, order = b.shard_by_batch_size(shards, batch_size=bs, dynamic_batching_args=_dyn(2048))
    else:
        try:
            out, order = b.shard_by_batch_size(shards, batch_size=bs,
                                               sequence_packing_args=_pack(mode, max_tokens=1024))
        except ValueError as exc:  # fewer rows than the required bins in a chunk
            assert "cannot make" in str(exc)
            return
    # every id exactly once, order consistent with shards
    assert sorted(order) == list(range(len(lengths)))
    assert order == [i for s in out for i in s["idx"].tolist()]
    # equal microbatch counts per chunk across ranks
    if mode != "none":
        counts = [[len(c) for c in s.micro_batch_indices] for s in out]
        assert all(c == counts[0] for c in counts)
        for s in out:
            specs = s.microbatch_plan()
            assert specs[-1].end == s.size
    # reorder restores the input order
    merged = BatchedDataDict.from_batches(out)
    merged.reorder_data(order)
    assert merged["idx"].tolist() == list(range(len(lengths)))
    assert merged["input_lengths"].tolist() == lengths


def test_non_contiguous_and_concatenated_jagged_columns() -> None:
    padded = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    lengths = torch.tensor([2, 6, 0, 3])
    holes = torch.nested.narrow(padded, 1, torch.zeros(4, dtype=torch.int64), lengths,
                                layout=torch.jagged)
    assert holes.lengths() is not None  # a jagged view with gaps between rows
    b = BatchedDataDict({"x": holes, "i": torch.arange(4)})
    s = b.select_indices([3, 1])
    assert [r.tolist() for r in s["x"].unbind()] == [padded[3, :3].tolist(), padded[1].tolist()]
    merged = BatchedDataDict.from_batches([s, b.slice(0, 1)])
    assert merged["x"].is_nested
    assert [r.tolist() for r in merged["x"].unbind()] == [
        padded[3, :3].tolist(), padded[1].tolist(), padded[0, :2].tolist()
    ]
    assert merged["i"].tolist() == [3, 1, 0]
