"""Codec layout transforms plus round-trip properties:
pack then materialise equals the padded original for random lengths and dtypes, jagged stays
jagged, and ``pad_to_seqlen`` pads and never truncates."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import NonTensorData, NonTensorStack, TensorDict

from nemo_dp.data_plane import codec
from nemo_dp.data_plane.codec import (
    make_pad_value_dict,
    materialize,
    materialize_local,
    pack_jagged_fields,
    pad_value_for,
    stack_or_nest,
    to_nested_by_length,
)
from nemo_dp.data_plane.schema import TOKEN_ALIGNED_FIELDS
from nemo_dp.distributed.batched_data_dict import BatchedDataDict

DTYPES = [torch.int64, torch.int32, torch.float32, torch.bfloat16]


def _reference_padded(
    rect: torch.Tensor, lengths: list[int], pad: float | int, width: int
) -> torch.Tensor:
    """Per-row loop reference: row i = rect[i, :len_i] right-padded to ``width``."""
    out = torch.full((rect.shape[0], width, *rect.shape[2:]), pad, dtype=rect.dtype)
    for i, ln in enumerate(lengths):
        out[i, :ln] = rect[i, :ln]
    return out


def _random_rect(n: int, s: int, trailing: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn((n, s, *trailing), generator=g).to(dtype)
    return torch.randint(-1000, 1000, (n, s, *trailing), generator=g).to(dtype)


# --- pad values -----------------------------------------------------------------------------


def test_pad_value_helpers() -> None:
    pvd = make_pad_value_dict(151643)
    assert pvd == {"input_ids": 151643, "prompt_ids_for_adv": 151643}
    assert pad_value_for("input_ids", pvd) == 151643
    assert pad_value_for("prompt_ids_for_adv", pvd) == 151643
    assert pad_value_for("token_mask", pvd) == 0
    assert pad_value_for("input_ids", None) == 0


@pytest.mark.parametrize("dtype", DTYPES + [torch.bool])
def test_to_nested_by_length_strips_padding_keeps_dtype(dtype: torch.dtype) -> None:
    padded = (torch.arange(12).reshape(3, 4) % 2).to(dtype)
    nt = to_nested_by_length(padded, torch.tensor([2, 0, 4]))
    assert nt.is_nested and nt.layout == torch.jagged
    assert nt.dtype == dtype
    rows = nt.unbind()
    assert [r.shape[0] for r in rows] == [2, 0, 4]
    assert torch.equal(rows[0], padded[0, :2])
    assert torch.equal(rows[2], padded[2])


def test_to_nested_by_length_errors() -> None:
    with pytest.raises(ValueError, match=r"\(N, S"):
        to_nested_by_length(torch.arange(4), torch.tensor([1, 2, 3, 4]))
    with pytest.raises(ValueError, match="lengths shape"):
        to_nested_by_length(torch.zeros(2, 4), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="lengths shape"):
        to_nested_by_length(torch.zeros(2, 4), torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="outside"):
        to_nested_by_length(torch.zeros(2, 4), torch.tensor([1, 5]))
    with pytest.raises(ValueError, match="outside"):
        to_nested_by_length(torch.zeros(2, 4), torch.tensor([-1, 2]))


def test_to_nested_by_length_multidim_rows_and_max_seqlen() -> None:
    padded = torch.randn(3, 6, 2)
    nt = to_nested_by_length(padded, [1, 6, 3])
    # The padded width must be the longest row, not the total value count.
    assert nt.to_padded_tensor(0.0).shape == (3, 6, 2)
    assert torch.equal(nt.unbind()[2], padded[2, :3])


# --- stack_or_nest --------------------------------------------------------------------------


def test_stack_or_nest() -> None:
    assert stack_or_nest([]).shape == (0,)
    same = stack_or_nest([torch.ones(3), torch.zeros(3)])
    assert not same.is_nested and same.shape == (2, 3)
    ragged = stack_or_nest([torch.ones(3), torch.zeros(5)])
    assert ragged.is_nested and ragged.layout == torch.jagged
    assert [r.shape[0] for r in ragged.unbind()] == [3, 5]
    with pytest.raises(ValueError, match="differ only in their first dim"):
        stack_or_nest([torch.ones(3, 2), torch.ones(3, 4)])


def test_pack_token_aligned_advantages_and_rectangles() -> None:
    adv = torch.arange(16, dtype=torch.float32).reshape(2, 8) + 1
    other = torch.arange(16).reshape(2, 8)
    td = pack_jagged_fields(
        {"advantages": adv, "other": other},
        lengths=torch.tensor([3, 5]),
        token_aligned_fields=TOKEN_ALIGNED_FIELDS,
    )
    assert td.batch_size == torch.Size([2])
    assert td.get("advantages").is_nested
    assert not td.get("other").is_nested and td.get("other").shape == (2, 8)
    out = materialize(td)
    expected = torch.tensor(
        [[1.0, 2.0, 3.0, 0.0, 0.0], [9.0, 10.0, 11.0, 12.0, 13.0]], dtype=torch.float32
    )
    assert out["advantages"].shape == (2, 5)
    assert torch.equal(out["advantages"], expected)
    assert torch.equal(out["other"], other)


def test_pack_object_array_becomes_per_row_values() -> None:
    objs = np.empty(3, dtype=object)
    objs[0], objs[1], objs[2] = "a", {"k": [1]}, None
    td = pack_jagged_fields({"content": objs}, lengths=None)
    leaf = td.get("content")
    assert isinstance(leaf, NonTensorStack)
    assert leaf.tolist() == ["a", {"k": [1]}, None]
    sub = td[torch.tensor([2, 0])]
    assert sub.get("content").tolist() == [None, "a"]
    back = materialize(td)["content"]
    assert isinstance(back, np.ndarray) and back.dtype == object and back.shape == (3,)
    assert list(back) == ["a", {"k": [1]}, None]


def test_pack_list_valued_object_rows_stay_rows() -> None:
    objs = np.empty(2, dtype=object)
    objs[0], objs[1] = [1, 2], [3]
    back = materialize(pack_jagged_fields({"x": objs}, lengths=None))["x"]
    assert back.shape == (2,)
    assert back[0] == [1, 2] and back[1] == [3]


@pytest.mark.parametrize("bad", [[1, 2], (1, 2), "ab", np.array([1, 2]), np.empty((2, 2), dtype=object)])
def test_pack_unsupported_type(bad: object) -> None:
    with pytest.raises(TypeError, match="pack_jagged_fields: unsupported value type for 'x'"):
        pack_jagged_fields({"x": bad}, lengths=None)


def test_pack_batch_size_checks() -> None:
    with pytest.raises(ValueError, match="batch size"):
        pack_jagged_fields({"a": torch.zeros(2), "b": torch.zeros(3)}, lengths=None)
    with pytest.raises(ValueError, match="batch size"):
        pack_jagged_fields({"a": torch.zeros(3)}, lengths=torch.tensor([1, 2]))


def test_pack_keeps_rectangular_when_not_packable() -> None:
    lengths = torch.tensor([3, 5])
    # narrower than max(lengths)
    narrow = pack_jagged_fields({"advantages": torch.zeros(2, 4)}, lengths=lengths,
                                token_aligned_fields=TOKEN_ALIGNED_FIELDS)
    assert not narrow.get("advantages").is_nested
    # 1-D
    flat = pack_jagged_fields({"advantages": torch.zeros(2)}, lengths=lengths,
                              token_aligned_fields=TOKEN_ALIGNED_FIELDS)
    assert not flat.get("advantages").is_nested
    # no lengths
    nolen = pack_jagged_fields({"advantages": torch.zeros(2, 8)}, lengths=None,
                               token_aligned_fields=TOKEN_ALIGNED_FIELDS)
    assert not nolen.get("advantages").is_nested
    # N == 0
    empty = pack_jagged_fields({"advantages": torch.zeros(0, 8)}, lengths=torch.zeros(0, dtype=torch.int64),
                               token_aligned_fields=TOKEN_ALIGNED_FIELDS)
    assert empty.batch_size == torch.Size([0])
    assert not empty.get("advantages").is_nested


def test_pack_detaches_and_makes_contiguous() -> None:
    base = torch.randn(4, 3, requires_grad=True)
    view = base.t()  # non-contiguous, requires grad
    td = pack_jagged_fields({"x": view}, lengths=None)
    leaf = td.get("x")
    assert leaf.is_contiguous()
    assert not leaf.requires_grad
    assert torch.equal(leaf, view.detach())


def _nested(rows: list[list[int]], dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.nested.as_nested_tensor([torch.tensor(r, dtype=dtype) for r in rows], layout=torch.jagged)


def test_materialize_pads_nested_with_per_field_values() -> None:
    td = TensorDict(
        {
            "input_ids": _nested([[1, 2], [3, 4, 5, 6, 7]]),
            "token_mask": _nested([[1, 1], [1, 1, 1, 1, 1]], torch.int32),
            "rect": torch.ones(2, 3),
        },
        batch_size=[2],
    )
    out = materialize(td, pad_value_dict={"input_ids": 999})
    assert isinstance(out, BatchedDataDict)
    assert list(out.keys()) == ["input_ids", "token_mask", "rect"]
    assert torch.equal(out["input_ids"], torch.tensor([[1, 2, 999, 999, 999], [3, 4, 5, 6, 7]]))
    assert out["token_mask"].dtype == torch.int32
    assert torch.equal(out["token_mask"], torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.int32))
    assert out["rect"] is td.get("rect")
    jag = materialize(td, layout="jagged")
    assert jag["input_ids"].is_nested


def test_materialize_pad_to_seqlen() -> None:
    td = TensorDict(
        {
            "input_ids": _nested([[1, 2], [3, 4, 5, 6, 7]]),
            "wide": torch.ones(2, 10, dtype=torch.bfloat16),
            "rect": torch.ones(2, 5, dtype=torch.int32),
            "flat": torch.arange(2),
        },
        batch_size=[2],
    )
    out = materialize(td, pad_value_dict={"input_ids": 999, "rect": 7}, pad_to_seqlen=8)
    assert out["input_ids"].shape == (2, 8)
    assert torch.equal(out["input_ids"][0], torch.tensor([1, 2, 999, 999, 999, 999, 999, 999]))
    assert out["wide"].shape == (2, 10) and out["wide"].dtype == torch.bfloat16
    assert out["rect"].shape == (2, 8) and out["rect"].dtype == torch.int32
    assert torch.equal(out["rect"][:, 5:], torch.full((2, 3), 7, dtype=torch.int32))
    assert torch.equal(out["flat"], torch.arange(2))
    # jagged layout: nested stays nested, rectangles still honour the target
    jag = materialize(td, layout="jagged", pad_to_seqlen=8)
    assert jag["input_ids"].is_nested
    assert jag["rect"].shape == (2, 8)


def test_materialize_nontensor_rules() -> None:
    td = TensorDict({"a": torch.zeros(3)}, batch_size=[3])
    td.set("s", NonTensorStack(*[NonTensorData(v) for v in ["x", "y", "z"]]))
    out = materialize(td)
    assert out["s"].dtype == object and list(out["s"]) == ["x", "y", "z"]
    whole = TensorDict({}, batch_size=[3])
    whole.set("w", NonTensorData(["x", "y", "z"], batch_size=[3]))
    with pytest.raises(TypeError, match="materialize_local") as info:
        materialize(whole)
    assert "non-tensor" in str(info.value)
    one = TensorDict({}, batch_size=[1])
    one.set("w", NonTensorData({"k": 1}, batch_size=[1]))
    single = materialize(one)["w"]
    assert single.shape == (1,) and single[0] == {"k": 1}
    nested_td = TensorDict({"n": TensorDict({"q": torch.zeros(2)}, batch_size=[2])}, batch_size=[2])
    with pytest.raises(TypeError, match="unsupported leaf type"):
        materialize(nested_td)


def test_materialize_local_unwraps_whole_columns() -> None:
    td = TensorDict({"ids": _nested([[1], [2, 3]])}, batch_size=[2])
    td.set("w", NonTensorData(["first", {"k": 2}], batch_size=[2]))
    td.set("s", NonTensorStack(NonTensorData("a"), NonTensorData("b")))
    out = materialize_local(td, pad_value_dict={"ids": -1})
    assert out["w"] == ["first", {"k": 2}]
    assert list(out["s"]) == ["a", "b"]
    assert torch.equal(out["ids"], torch.tensor([[1, -1], [2, 3]]))
    bad = TensorDict({}, batch_size=[2])
    bad.set("w", NonTensorData(["only-one"], batch_size=[2]))
    with pytest.raises(ValueError, match="has 1 values, expected 2"):
        materialize_local(bad)


def test_materialize_rejects_non_tensordict_and_bad_layout() -> None:
    with pytest.raises(TypeError):
        materialize({"a": torch.zeros(2)})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layout"):
        materialize(TensorDict({}, batch_size=[0]), layout="dense")  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_preserved_through_pack_and_materialize(dtype: torch.dtype) -> None:
    rect = _random_rect(3, 6, (), dtype, seed=1)
    td = pack_jagged_fields({"input_ids": rect}, lengths=torch.tensor([6, 2, 4]),
                            token_aligned_fields=TOKEN_ALIGNED_FIELDS)
    out = materialize(td)["input_ids"]
    assert out.dtype == dtype
    assert torch.equal(out, _reference_padded(rect, [6, 2, 4], 0, 6))


def test_materialize_handles_selected_rows_of_a_jagged_column() -> None:
    rect = torch.arange(40).reshape(4, 10)
    td = pack_jagged_fields({"input_ids": rect}, lengths=torch.tensor([3, 10, 1, 7]),
                            token_aligned_fields=TOKEN_ALIGNED_FIELDS)
    sub = td[torch.tensor([3, 0])]
    out = materialize(sub, pad_value_dict={"input_ids": -5})["input_ids"]
    assert torch.equal(out, _reference_padded(rect[[3, 0]], [7, 3], -5, 7))
    sl = materialize(td[1:3], pad_value_dict={"input_ids": -5})["input_ids"]
    assert torch.equal(sl, _reference_padded(rect[1:3], [10, 1], -5, 10))


@pytest.mark.parametrize("threshold", [1, 10**9])
def test_both_vectorised_paths_agree(monkeypatch: pytest.MonkeyPatch, threshold: int) -> None:
    """Force the slice path (threshold 1) and the mask path (huge threshold)."""
    monkeypatch.setattr(codec, "_SLICE_PATH_MIN_ROW_ELEMS", threshold)
    rect = _random_rect(5, 9, (2,), torch.bfloat16, seed=3)
    lengths = [0, 9, 4, 1, 7]
    td = pack_jagged_fields({"values": rect}, lengths=torch.tensor(lengths),
                            token_aligned_fields=TOKEN_ALIGNED_FIELDS)
    out = materialize(td, pad_value_dict={"values": 2.5}, pad_to_seqlen=12)["values"]
    assert torch.equal(out, _reference_padded(rect, lengths, 2.5, 12))
    sub = materialize(td[torch.tensor([4, 1, 0])], pad_value_dict={"values": 2.5})["values"]
    assert torch.equal(sub, _reference_padded(rect[[4, 1, 0]], [7, 9, 0], 2.5, 9))


# --- properties ----------------------------------------------------------------------------


@st.composite
def packed_cases(draw: st.DrawFn) -> tuple[torch.Tensor, list[int], int]:
    n = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
    extra = draw(st.integers(0, 3))
    width = max(lengths) + extra
    dtype = draw(st.sampled_from(DTYPES + [torch.bool]))
    trailing = draw(st.sampled_from([(), (2,), (1, 3)]))
    seed = draw(st.integers(0, 10_000))
    if width == 0:
        width = 1
    return _random_rect(n, width, trailing, dtype, seed), lengths, seed


@settings(max_examples=80, deadline=None)
@given(case=packed_cases(), pad=st.sampled_from([0, 1, -7, 999]),
       threshold=st.sampled_from([1, 10**9]))
def test_property_pack_materialize_round_trip(case, pad, threshold) -> None:
    rect, lengths, _ = case
    old = codec._SLICE_PATH_MIN_ROW_ELEMS
    codec._SLICE_PATH_MIN_ROW_ELEMS = threshold
    try:
        td = pack_jagged_fields({"input_ids": rect, "sample_mask": torch.ones(len(lengths))},
                                lengths=torch.tensor(lengths), token_aligned_fields=TOKEN_ALIGNED_FIELDS)
        leaf = td.get("input_ids")
        assert leaf.is_nested and leaf.dtype == rect.dtype
        assert [r.shape[0] for r in leaf.unbind()] == lengths
        longest = max(lengths)
        out = materialize(td, pad_value_dict={"input_ids": pad})
        assert torch.equal(out["input_ids"], _reference_padded(rect, lengths, pad, longest))
        assert torch.equal(out["sample_mask"], torch.ones(len(lengths)))
        jag = materialize(td, layout="jagged")["input_ids"]
        assert jag.is_nested
        for row, ln, orig in zip(jag.unbind(), lengths, rect):
            assert torch.equal(row, orig[:ln])
    finally:
        codec._SLICE_PATH_MIN_ROW_ELEMS = old


@settings(max_examples=60, deadline=None)
@given(case=packed_cases(), target=st.integers(0, 20))
def test_property_pad_to_seqlen_pads_never_truncates(case, target) -> None:
    rect, lengths, _ = case
    td = pack_jagged_fields({"input_ids": rect, "rect": rect}, lengths=torch.tensor(lengths),
                            token_aligned_fields=TOKEN_ALIGNED_FIELDS)
    out = materialize(td, pad_value_dict={"input_ids": 3, "rect": 4}, pad_to_seqlen=target)
    longest = max(lengths)
    assert out["input_ids"].shape[1] == max(longest, target)
    assert torch.equal(out["input_ids"], _reference_padded(rect, lengths, 3, max(longest, target)))
    width = rect.shape[1]
    assert out["rect"].shape[1] == max(width, target)
    assert torch.equal(out["rect"][:, :width], rect)
    if target > width:
        tail = out["rect"][:, width:]
        assert torch.equal(tail, torch.full(tail.shape, 4, dtype=rect.dtype))


@pytest.mark.parametrize("threshold", [1, 10**9])
def test_materialize_non_contiguous_jagged(monkeypatch: pytest.MonkeyPatch, threshold: int) -> None:
    monkeypatch.setattr(codec, "_SLICE_PATH_MIN_ROW_ELEMS", threshold)
    padded = torch.arange(24, dtype=torch.int32).reshape(4, 6)
    lengths = [2, 6, 0, 3]
    holes = torch.nested.narrow(padded, 1, torch.zeros(4, dtype=torch.int64), torch.tensor(lengths),
                                layout=torch.jagged)
    assert holes.lengths() is not None
    td = TensorDict({"input_ids": holes}, batch_size=[4])
    out = materialize(td, pad_value_dict={"input_ids": -9}, pad_to_seqlen=7)["input_ids"]
    assert out.dtype == torch.int32
    assert torch.equal(out, _reference_padded(padded, lengths, -9, 7))


def test_lengths_as_python_lists() -> None:
    nt = to_nested_by_length(torch.zeros(0, 3), [])
    assert nt.is_nested and nt.size(0) == 0
    td = pack_jagged_fields({"advantages": torch.ones(2, 4)}, lengths=[1, np.int64(3)],  # type: ignore[arg-type]
                            token_aligned_fields=TOKEN_ALIGNED_FIELDS)
    assert [r.numel() for r in td.get("advantages").unbind()] == [1, 3]
    with pytest.raises(ValueError, match="integers"):
        to_nested_by_length(torch.zeros(2, 4), [1.5, 2])
    with pytest.raises(ValueError, match="integers"):
        to_nested_by_length(torch.zeros(2, 4), torch.tensor([1.0, 2.0]))


def test_materialize_turns_wire_stripped_non_tensor_rows_into_none() -> None:
    """Issue 10 item 6: a row whose NonTensorData payload the wire dropped (an empty
    ``TensorDict`` with no batch dims) comes back as ``None``; real values pass unchanged."""

    def stripped() -> TensorDict:
        return TensorDict({}, batch_size=[])

    keyed = TensorDict({"q": torch.ones(1)}, batch_size=[])
    batched = TensorDict({}, batch_size=[2])
    td = TensorDict({"a": torch.zeros(4)}, batch_size=[4])
    td.set("s", NonTensorStack(*[NonTensorData(v) for v in [stripped(), "x", keyed, batched]]))
    td.set("all", NonTensorStack(*[NonTensorData(stripped()) for _ in range(4)]))
    for reader in (materialize, materialize_local):
        out = reader(td)
        rows = list(out["s"])
        assert rows[0] is None and rows[1] == "x"
        assert rows[2] is keyed or (isinstance(rows[2], TensorDict) and list(rows[2].keys()) == ["q"])
        assert isinstance(rows[3], TensorDict) and rows[3].batch_size == torch.Size([2])
        assert out["all"].dtype == object and list(out["all"]) == [None] * 4
    one = TensorDict({}, batch_size=[1])
    one.set("w", NonTensorData(stripped(), batch_size=[1]))
    assert list(materialize(one)["w"]) == [None]
    assert codec.unwrap_wire_stripped_payload(NonTensorData("p")) == "p"
