"""KVBatchMeta: fields, invariants and transforms, plus property
tests that every transform projects rows consistently and shares no mutable container."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_dp.data_plane.interfaces import KVBatchMeta


def _meta(n: int = 4, **kw) -> KVBatchMeta:
    base = dict(
        partition_id="p",
        task_name="train",
        sample_ids=[f"s{i}" for i in range(n)],
        fields=["input_ids"],
        sequence_lengths=[10 + i for i in range(n)],
        extra_info={"k": [1, 2]},
        tags=[{"i": i, "nested": [i]} for i in range(n)],
    )
    base.update(kw)
    return KVBatchMeta(**base)


def _containers(m: KVBatchMeta) -> list[object]:
    out: list[object] = [m.sample_ids, m.extra_info]
    if m.fields is not None:
        out.append(m.fields)
    if m.sequence_lengths is not None:
        out.append(m.sequence_lengths)
    if m.tags is not None:
        out.append(m.tags)
        out.extend(m.tags)
    return out


def _shares_container(a: KVBatchMeta, b: KVBatchMeta) -> bool:
    ids_a = {id(c) for c in _containers(a)}
    return any(id(c) in ids_a for c in _containers(b))


def test_positional_construction_and_defaults() -> None:
    """Callers build metas positionally: seven fields in the contract's order, no eighth."""
    m = KVBatchMeta("p", "t", ["a", "b"], ["x"], [3, 4], {"k": 1}, [{"i": 0}, {"i": 1}])
    assert (m.partition_id, m.task_name, m.sample_ids, m.fields) == ("p", "t", ["a", "b"], ["x"])
    assert (m.sequence_lengths, m.extra_info, m.tags) == ([3, 4], {"k": 1}, [{"i": 0}, {"i": 1}])
    with pytest.raises(TypeError):
        KVBatchMeta("p", None, [], None, None, {}, None, "an eighth field")  # type: ignore[call-arg]
    m = KVBatchMeta("p", None, ["a", "b"])
    assert m.fields is None
    assert m.sequence_lengths is None
    assert m.extra_info == {}
    assert m.tags is None
    assert m.size == 2


def test_extra_info_not_shared_and_empty_meta_truthy() -> None:
    a = KVBatchMeta("p", None, [])
    b = KVBatchMeta("p", None, [])
    a.extra_info["x"] = 1
    assert b.extra_info == {}
    assert a.extra_info is not b.extra_info
    assert a.size == 0
    assert bool(a) is True
    assert not hasattr(KVBatchMeta, "__len__")


def test_missing_partition_id_is_type_error() -> None:
    with pytest.raises(TypeError):
        KVBatchMeta(task_name=None, sample_ids=["a"])  # type: ignore[call-arg]


def test_duplicates_allowed_empty_valid_and_pickle_round_trip() -> None:
    dup = KVBatchMeta("p", "t", ["a", "a"], sequence_lengths=[1, 1])
    assert dup.size == 2
    empty = KVBatchMeta("p", None, [])
    assert pickle.loads(pickle.dumps(empty)) == empty
    m = _meta()
    back = pickle.loads(pickle.dumps(m))
    assert back == m
    assert back is not m


def test_misaligned_tags_or_lengths() -> None:
    with pytest.raises(ValueError, match="must align 1:1"):
        KVBatchMeta("p", None, ["a", "b"], tags=[{}])
    with pytest.raises(ValueError, match="must align 1:1"):
        KVBatchMeta("p", None, ["a", "b"], sequence_lengths=[1, 2, 3])
    m = _meta(2)
    with pytest.raises(ValueError, match="must align 1:1"):
        dataclasses.replace(m, tags=[{}])


def test_stamp_tags_creates_fills_converts_in_place() -> None:
    m = KVBatchMeta("p", None, ["a", "b", "c"])
    ret = m.stamp_tags(
        {
            "std": [0.5, 1.0, 2.0],
            "baseline": torch.tensor([1.0, 2.0, 3.0]),
            "n": np.array([1, 2, 3]),
        }
    )
    assert ret is None
    assert m.tags == [
        {"std": 0.5, "baseline": 1.0, "n": 1},
        {"std": 1.0, "baseline": 2.0, "n": 2},
        {"std": 2.0, "baseline": 3.0, "n": 3},
    ]
    for tag in m.tags:
        assert type(tag["baseline"]) is float
        assert type(tag["n"]) is int


def test_stamp_tags_keeps_existing_and_rejects_wrong_length() -> None:
    m = _meta(2)
    tags_before = m.tags
    m.stamp_tags({"x": [7, 8]})
    assert m.tags is tags_before
    assert m.tags[0] == {"i": 0, "nested": [0], "x": 7}
    with pytest.raises(ValueError, match="stamp_tags: bad has 3 values, expected 2"):
        m.stamp_tags({"bad": [1, 2, 3]})
    assert "bad" not in m.tags[0]


def test_subset_and_slice_project_rows() -> None:
    m = _meta(4)
    s = m.subset([0, 2])
    assert s.sample_ids == ["s0", "s2"]
    assert s.sequence_lengths == [10, 12]
    assert s.tags == [{"i": 0, "nested": [0]}, {"i": 2, "nested": [2]}]
    assert (s.partition_id, s.task_name, s.fields) == ("p", "train", ["input_ids"])
    r = m.subset([3, 1, 3])
    assert r.sample_ids == ["s3", "s1", "s3"]
    assert r.sequence_lengths == [13, 11, 13]
    assert [t["i"] for t in r.tags] == [3, 1, 3]
    assert r.tags[0] is not r.tags[2]
    sl = m.slice(1, 3)
    assert sl == m.subset([1, 2])
    assert m.slice(2, 2).size == 0


@pytest.mark.parametrize("bad", [[4], [-1], [0, 9]])
def test_subset_out_of_range(bad: list[int]) -> None:
    with pytest.raises(IndexError):
        _meta(4).subset(bad)


@pytest.mark.parametrize("bounds", [(-1, 2), (3, 2), (0, 5)])
def test_slice_out_of_range(bounds: tuple[int, int]) -> None:
    with pytest.raises(IndexError):
        _meta(4).slice(*bounds)


def test_subset_shares_no_mutable_container() -> None:
    m = _meta(3)
    s = m.subset([0, 1, 2])
    assert s == m
    assert not _shares_container(m, s)
    s.tags[0]["i"] = 99
    s.extra_info["new"] = 1
    s.sample_ids.append("zz")
    assert m.tags[0]["i"] == 0
    assert "new" not in m.extra_info
    assert m.sample_ids == ["s0", "s1", "s2"]
    # extra_info is a shallow copy: its values are shared on purpose.
    assert s.extra_info["k"] is m.extra_info["k"]


def test_concat_rules() -> None:
    a = _meta(2, extra_info={"from": "a"})
    b = KVBatchMeta("p", "other", ["t0"], fields=["advantages", "input_ids"],
                    sequence_lengths=[5], extra_info={"from": "b"}, tags=[{"j": 0}])
    c = a.concat(b)
    assert c.sample_ids == ["s0", "s1", "t0"]
    assert c.sequence_lengths == [10, 11, 5]
    assert c.tags == [{"i": 0, "nested": [0]}, {"i": 1, "nested": [1]}, {"j": 0}]
    assert c.fields == ["input_ids", "advantages"]
    assert c.task_name == "train"
    assert c.extra_info == {"from": "a"}
    assert c.extra_info is not a.extra_info
    no_lengths = KVBatchMeta("p", None, ["u"], tags=[{}])
    d = a.concat(no_lengths)
    assert d.sequence_lengths is None
    assert d.tags is not None and len(d.tags) == 3
    no_tags = KVBatchMeta("p", None, ["u"], sequence_lengths=[1])
    e = a.concat(no_tags)
    assert e.tags is None
    assert e.sequence_lengths == [10, 11, 1]
    assert KVBatchMeta("p", None, ["x"]).concat(KVBatchMeta("p", None, ["y"])).fields is None
    with pytest.raises(ValueError, match="partition_ids must match"):
        a.concat(KVBatchMeta("q", None, ["z"]))


def test_drop_rules() -> None:
    m = _meta(4)
    d = m.drop([1, 3])
    assert d is not None
    assert d.sample_ids == ["s0", "s2"]
    assert d.sequence_lengths == [10, 12]
    assert [t["i"] for t in d.tags] == [0, 2]
    same = m.drop([])
    assert same == m
    assert same is not m
    assert not _shares_container(m, same)
    assert m.drop([0, 1, 2, 3]) is None
    abc = KVBatchMeta("p", None, ["a", "b", "c"])
    kept = abc.drop([2, 0, 0])
    assert kept is not None and kept.sample_ids == ["b"]
    with pytest.raises(IndexError):
        m.drop([4])


def test_with_fields() -> None:
    m = _meta(2)
    w = m.with_fields(["advantages", "logprobs"])
    assert w.fields == ["input_ids", "advantages", "logprobs"]
    assert m.fields == ["input_ids"]
    assert not _shares_container(m, w)
    none = KVBatchMeta("p", None, ["a"])
    assert none.with_fields(["x", "y", "x"]).fields == ["x", "y"]


# --- properties ----------------------------------------------------------------------------

_tag = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(-5, 5), max_size=3)


@st.composite
def metas(draw: st.DrawFn, partition: str = "p") -> KVBatchMeta:
    n = draw(st.integers(0, 8))
    ids = draw(st.lists(st.text("xyz", min_size=1, max_size=3), min_size=n, max_size=n))
    lengths = draw(st.none() | st.lists(st.integers(0, 100), min_size=n, max_size=n))
    tags = draw(st.none() | st.lists(_tag, min_size=n, max_size=n))
    fields = draw(st.none() | st.lists(st.sampled_from(["f1", "f2", "f3"]), max_size=3))
    return KVBatchMeta(
        partition, draw(st.none() | st.just("t")), ids, fields=fields, sequence_lengths=lengths,
        extra_info={"e": draw(st.integers())}, tags=tags,
    )


def _row(m: KVBatchMeta, i: int) -> tuple:
    return (
        m.sample_ids[i],
        None if m.sequence_lengths is None else m.sequence_lengths[i],
        None if m.tags is None else m.tags[i],
    )


def _draw_meta_and_indices(data: st.DataObject) -> tuple[KVBatchMeta, list[int]]:
    """A meta and up to 10 in-range indices, repeats allowed (none for an empty meta)."""
    m = data.draw(metas())
    return m, data.draw(st.lists(st.integers(0, max(m.size - 1, 0)), max_size=10)) if m.size else []


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_property_subset(data: st.DataObject) -> None:
    m, idx = _draw_meta_and_indices(data)
    s = m.subset(idx)
    assert s.size == len(idx)
    assert [_row(s, j) for j in range(s.size)] == [_row(m, i) for i in idx]
    assert (s.partition_id, s.task_name, s.fields, s.extra_info) == (
        m.partition_id, m.task_name, m.fields, m.extra_info)
    assert not _shares_container(m, s)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_property_slice_equals_subset_range(data: st.DataObject) -> None:
    m = data.draw(metas())
    start = data.draw(st.integers(0, m.size))
    stop = data.draw(st.integers(start, m.size))
    s = m.slice(start, stop)
    assert s == m.subset(range(start, stop))
    assert not _shares_container(m, s)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_property_drop_is_complement(data: st.DataObject) -> None:
    m, idx = _draw_meta_and_indices(data)
    d = m.drop(idx)
    keep = [i for i in range(m.size) if i not in set(idx)]
    if not keep and m.size > 0:
        assert d is None
        return
    assert d is not None
    assert d == m.subset(keep)
    assert not _shares_container(m, d)


@settings(max_examples=60, deadline=None)
@given(a=metas(), b=metas())
def test_property_concat(a: KVBatchMeta, b: KVBatchMeta) -> None:
    c = a.concat(b)
    assert c.sample_ids == a.sample_ids + b.sample_ids
    if a.sequence_lengths is not None and b.sequence_lengths is not None:
        assert c.sequence_lengths == a.sequence_lengths + b.sequence_lengths
    else:
        assert c.sequence_lengths is None
    if a.tags is not None and b.tags is not None:
        assert c.tags == a.tags + b.tags
    else:
        assert c.tags is None
    union = list(dict.fromkeys((a.fields or []) + (b.fields or [])))
    assert c.fields == (union or None)
    assert c.extra_info == a.extra_info
    assert not _shares_container(a, c)
    assert not _shares_container(b, c)


@settings(max_examples=60, deadline=None)
@given(m=metas(), names=st.lists(st.sampled_from(["f1", "f4", "f5"]), max_size=4))
def test_property_with_fields(m: KVBatchMeta, names: list[str]) -> None:
    w = m.with_fields(names)
    assert w.fields == list(dict.fromkeys((m.fields or []) + names))
    assert [_row(w, i) for i in range(w.size)] == [_row(m, i) for i in range(m.size)]
    assert not _shares_container(m, w)
