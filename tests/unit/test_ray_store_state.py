"""Unit tests of the Ray object-store backend's pieces that need no Ray.

What they isolate: ``StoreState`` (the metadata the actor holds) is driven directly, with plain
Python objects standing in for object refs (the state only stores and returns them), to check
chunk reference counting - the property that lets Ray free a column once no live row uses it -
and the write-back bookkeeping.  ``columns`` is checked on real tensors: every dtype and layout
comes back bit for bit through the numpy payloads, on the contiguous fast path and the gather
path, across chunks.  The full contract against a live Ray runs in
``tests/integration/test_contract_ray_store.py``.
"""

from __future__ import annotations

import pytest
import torch

from nemo_dp.data_plane.adapters.ray_store.columns import (
    DENSE,
    JAGGED,
    Segment,
    dtype_from_name,
    encode_column,
    gather_field,
)
from nemo_dp.data_plane.adapters.ray_store.state import StoreState, TensorColumnSpec


def _spec(tag: str, dtype: str = "torch.float32", layout: str = DENSE) -> TensorColumnSpec:
    return TensorColumnSpec(dtype, layout, f"ref-{tag}", "x")


def _store(n: int = 4) -> tuple[StoreState, list[str]]:
    s = StoreState()
    s.register("p", ["x", "lp", "o"], n, ["t"])
    ids = [f"s{i}" for i in range(n)]
    s.put("p", ids, {"x": _spec("x0"), "o": list(range(n))}, None)
    return s, ids


def test_chunks_are_dropped_when_their_last_row_goes() -> None:
    s, ids = _store()
    assert [c.ref for c in s.chunks.values()] == ["ref-x0"]
    s.clear("p", ids[:3])
    assert [c.ref for c in s.chunks.values()] == ["ref-x0"]  # one row still uses it
    s.clear("p", ids[3:])
    assert s.chunks == {}
    assert s.list_ids("p") == [] and s.exists("p")  # an emptied partition stays registered


def test_overwriting_every_row_of_a_chunk_drops_it() -> None:
    s, ids = _store()
    s.put("p", ids[:2], {"x": _spec("x1")}, None)
    assert sorted(c.ref for c in s.chunks.values()) == ["ref-x0", "ref-x1"]
    s.put("p", ids[2:], {"x": _spec("x2")}, None)
    assert sorted(c.ref for c in s.chunks.values()) == ["ref-x1", "ref-x2"]
    plan, chunks = s.locate("p", [ids[3], ids[0], ids[1], ids[2]], ["x", "o"])
    _, dtype, segments = plan["x"]
    assert dtype == "torch.float32"
    assert [(chunks[c][0], pos) for c, pos in segments] == [
        ("ref-x2", [1]),
        ("ref-x1", [0, 1]),
        ("ref-x2", [0]),
    ]
    assert plan["o"] == ("object", [3, 0, 1, 2])


def test_partition_clear_drops_every_chunk_and_write_back_adds_fields() -> None:
    s, ids = _store()
    s.put("p", ids, {"lp": _spec("lp")}, None)
    ids_ready, _ = s.claim("p", "t", ["x", "lp"], 4)
    assert ids_ready == ids
    assert s.consumed("p", ["t"])
    s.clear("p", None)
    assert s.chunks == {} and not s.exists("p")


def test_rejected_put_changes_nothing() -> None:
    s, ids = _store()
    before = (dict(s.chunks), {k: dict(v) for k, v in s.partitions["p"].rows.items()})
    with pytest.raises(TypeError, match="float32"):
        s.put("p", ids, {"lp": _spec("ok"), "x": _spec("bad", "torch.int64")}, None)
    with pytest.raises(ValueError, match="zz"):
        s.put("p", ["new"], {"zz": _spec("z")}, None)
    assert (dict(s.chunks), {k: dict(v) for k, v in s.partitions["p"].rows.items()}) == before
    assert s.partitions["p"].field_kinds == {"x": "torch.float32", "o": "object"}


def test_restore_is_all_or_nothing() -> None:
    s, _ = _store()
    snap = s.snapshot()
    rec = snap["partitions"][0]
    good = {
        **{k: rec[k] for k in ("partition_id", "fields", "num_samples", "consumer_tasks")},
        "grpo_group_size": None,
        "enums": {},
        "field_kinds": rec["field_kinds"],
        "sample_ids": rec["sample_ids"],
        "row_fields": rec["row_fields"],
        "columns": {"x": (_spec("restored"), rec["sample_ids"])},
        "tags": {},
        "claimed": {"t": []},
    }
    bad = dict(good, partition_id="q", num_samples=0)
    target = StoreState()
    with pytest.raises(ValueError):
        target.restore([good, bad])
    assert target.is_empty() and target.chunks == {}
    target.restore([good])
    assert [c.live for c in target.chunks.values()] == [4]
    with pytest.raises(RuntimeError, match="clean data-plane client"):
        target.restore([good])


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float16, torch.uint8]
)
def test_dense_columns_round_trip_bit_exactly(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(5, 3, generator=g) * 100).to(dtype)
    b = (torch.randn(4, 3, generator=g) * 100).to(dtype)
    ea, eb = encode_column("x", a), encode_column("x", b)
    assert ea.layout == DENSE and dtype_from_name(ea.dtype) == dtype
    # contiguous run, gather, and rows from two chunks in one read
    segs = [Segment(DENSE, ea.payload, [1, 2, 3]), Segment(DENSE, eb.payload, [3, 0])]
    got = gather_field("x", dtype, segs)
    want = torch.cat([a[1:4], b[[3, 0]]])
    assert got.dtype == dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    got.zero_()  # a fresh copy: the payload is untouched
    assert torch.equal(gather_field("x", dtype, [Segment(DENSE, ea.payload, [0, 1, 2, 3, 4])]), a)


def test_jagged_columns_round_trip_and_mix_with_dense() -> None:
    rows = [torch.arange(k, dtype=torch.int64) + 10 * k for k in (3, 1, 4, 2)]
    nt = torch.nested.nested_tensor(rows, layout=torch.jagged)
    enc = encode_column("r", nt)
    assert enc.layout == JAGGED
    dense = torch.full((2, 5), 7, dtype=torch.int64)
    got = gather_field(
        "r",
        torch.int64,
        [Segment(JAGGED, enc.payload, [2, 0]), Segment(DENSE, encode_column("r", dense).payload, [1])],
    )
    assert got.is_nested
    assert [t.tolist() for t in got.unbind()] == [rows[2].tolist(), rows[0].tolist(), [7] * 5]
    run = gather_field("r", torch.int64, [Segment(JAGGED, enc.payload, [1, 2, 3])])
    assert [t.tolist() for t in run.unbind()] == [r.tolist() for r in rows[1:]]
    # a view into a larger jagged buffer is compacted (offsets start at 0)
    view = torch.nested.nested_tensor_from_jagged(
        torch.arange(10, dtype=torch.int64), torch.tensor([2, 5, 9])
    )
    values, offsets = encode_column("v", view).payload
    assert values.tolist() == list(range(2, 9)) and offsets.tolist() == [0, 3, 7]
