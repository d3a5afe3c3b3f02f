"""Bin packers (contract §12.3): algorithms, bin-count adjustment and error cases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_dp.distributed.packers import PACKER_NAMES, get_packer

LENGTHS_64 = [1216, 512, 1472, 896, 384, 512, 960, 704]  # §12.4 lengths padded to 64


def test_concatenative_in_order() -> None:
    packer = get_packer("concatenative", 8)
    assert packer.pack([4, 1, 3, 2, 1, 3, 4, 5]) == [[0, 1, 2], [3, 4, 5], [6], [7]]
    assert get_packer("concatenative", 5).pack([4, 1, 3, 2, 1, 3, 4, 5]) == [
        [0, 1], [2, 3], [4, 5], [6], [7]
    ]


def test_first_fit_decreasing_worked_example() -> None:
    bins = get_packer("first_fit_decreasing", 2048).pack(LENGTHS_64)
    assert bins == [[2, 5], [0, 7], [6, 3], [1, 4]]
    assert [sum(LENGTHS_64[i] for i in b) for b in bins] == [1984, 1920, 1856, 896]


def test_first_fit_decreasing_ties_by_index_descending() -> None:
    assert get_packer("first_fit_decreasing", 10).pack([5, 5, 5]) == [[2, 1], [0]]


def test_bin_count_adjustment_matches_documented_loads() -> None:
    # §12.4: FFD, 4096 tokens, dp 4 -> rank loads 4032/1600/512/512
    bins = get_packer("first_fit_decreasing", 4096, min_bin_count=4, bin_count_multiple=4).pack(LENGTHS_64)
    assert len(bins) == 4
    assert [sum(LENGTHS_64[i] for i in b) for b in bins] == [4032, 1600, 512, 512]
    assert bins == [[2, 0, 6, 4], [3, 7], [1], [5]]


def test_bin_count_multiple_rounds_up() -> None:
    bins = get_packer("concatenative", 100, min_bin_count=1, bin_count_multiple=3).pack([10] * 5)
    assert len(bins) == 3
    assert sorted(i for b in bins for i in b) == list(range(5))
    assert all(b for b in bins)


def test_modified_first_fit_decreasing_classes() -> None:
    # C = 60: large > 30, medium (20, 30], small (10, 20], tiny <= 10
    lengths = [35, 31, 25, 22, 15, 12, 11, 5, 3]
    bins = get_packer("modified_first_fit_decreasing", 60).pack(lengths)
    # one bin per large item, largest first; forward pass: largest medium that fits
    assert bins[0][:2] == [0, 2]  # 35 + 25
    assert bins[1][:2] == [1, 3]  # 31 + 22
    assert bins == [[0, 2], [1, 3, 7], [4, 5, 6, 8]]
    loads = [sum(lengths[i] for i in b) for b in bins]
    assert all(load <= 60 for load in loads)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))


def test_modified_first_fit_decreasing_backward_small_pass() -> None:
    # C = 60; one large bin (32) without a medium item; smalls 18, 12, 11.
    # Backward pass: the two smallest (11 + 12) fit -> add 11, then the largest small item
    # that still fits (18 would make 61, 12 makes 55); 18 then needs a new bin.
    lengths = [32, 18, 12, 11]
    bins = get_packer("modified_first_fit_decreasing", 60).pack(lengths)
    assert bins == [[0, 3, 2], [1]]


def test_modified_first_fit_decreasing_skips_backward_pass_when_smalls_do_not_fit() -> None:
    # 40 + 11 + 12 > 60: no backward placement; the greedy fill then takes 18 (58).
    lengths = [40, 18, 12, 11]
    bins = get_packer("modified_first_fit_decreasing", 60).pack(lengths)
    assert bins == [[0, 1], [2, 3]]


def test_modified_ffd_only_small_items_go_to_new_bins() -> None:
    bins = get_packer("modified_first_fit_decreasing", 100).pack([20, 20, 20, 20, 20, 20])
    assert [len(b) for b in bins] == [5, 1]


@pytest.mark.parametrize("name", PACKER_NAMES)
def test_errors(name: str) -> None:
    with pytest.raises(ValueError, match="above the bin capacity"):
        get_packer(name, 10).pack([3, 11])
    with pytest.raises(ValueError, match="negative"):
        get_packer(name, 10).pack([-1])
    with pytest.raises(ValueError, match="cannot make 4 bins"):
        get_packer(name, 10, min_bin_count=4).pack([1, 1, 1])
    assert get_packer(name, 10).pack([]) == []


def test_unknown_packer_and_bad_params() -> None:
    with pytest.raises(ValueError, match="unknown packing algorithm"):
        get_packer("best_fit", 10)
    with pytest.raises(ValueError, match="bin_capacity"):
        get_packer("concatenative", 0)
    with pytest.raises(ValueError, match="bin_count_multiple"):
        get_packer("concatenative", 10, bin_count_multiple=0)


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(PACKER_NAMES),
    capacity=st.integers(1, 200),
    data=st.data(),
    shards=st.integers(1, 4),
)
def test_property_valid_packing(name: str, capacity: int, data: st.DataObject, shards: int) -> None:
    lengths = data.draw(st.lists(st.integers(0, capacity), min_size=shards, max_size=30))
    raw = get_packer(name, capacity).pack(lengths)
    target = max(len(raw), shards)
    target += (-target) % shards
    packer = get_packer(name, capacity, min_bin_count=shards, bin_count_multiple=shards)
    if target > len(lengths):
        with pytest.raises(ValueError, match="cannot make"):
            packer.pack(lengths)
        return
    bins = packer.pack(lengths)
    assert len(bins) == target
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(b for b in bins)
    assert all(sum(lengths[i] for i in b) <= capacity for b in bins)
    assert len(bins) >= shards and len(bins) % shards == 0
