"""The TransferQueue adapter's row-bytes wire layout, without Ray or the library.

What this isolates: the put-side encoding (``row_wire.encode_put``), the storage-side split the
library runs as the put's ``data_parser`` (``row_split.split_rows``, sent through cloudpickle as
the library does) and the get-side decoding (``row_wire.decode_column``), with the library's
transport replaced by handing the split rows straight to the decoder in a ``NonTensorStack``,
which is what the library's read returns for a column of ``bytes`` rows.  The same layouts
through a real TransferQueue are covered by tests/integration/test_tq_adapter.py.
"""

from __future__ import annotations

import pickle
import sys
import types

import cloudpickle
import pytest
import torch
from tensordict import NonTensorStack

from nemo_dp.data_plane.adapters.transfer_queue import row_split
from nemo_dp.data_plane.adapters.transfer_queue.row_wire import (
    DTYPE_CODES,
    LARGE_ROW_BYTES,
    decode_column,
    encode_put,
    plan_column,
)

pytestmark = pytest.mark.unit


def _jagged(lengths: list[int], dtype: torch.dtype = torch.int64, inner: tuple[int, ...] = ()) -> torch.Tensor:
    total = sum(lengths)
    if dtype == torch.bool:
        values = torch.arange(total * max(1, int(torch.tensor(inner).prod()) if inner else 1)) % 3 == 0
    elif dtype.is_complex:
        values = torch.randn(total, *inner, dtype=dtype)
    elif dtype.is_floating_point:
        values = torch.randn(total, *inner).to(dtype)
    else:
        values = torch.arange(total * (int(torch.tensor(inner).prod()) if inner else 1)).to(dtype)
    values = values.reshape(total, *inner)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def _round_trip(columns: dict[str, torch.Tensor], n: int) -> tuple[dict, dict]:
    encoded = encode_put(columns, n)
    data = dict(encoded.wire)
    if encoded.parser is not None:
        # The library cloudpickles the parser to the storage unit; do the same.
        data = pickle.loads(cloudpickle.dumps(encoded.parser))(data)
    out = {}
    for name, value in data.items():
        column = NonTensorStack(*value) if isinstance(value, list) else value
        out[name] = decode_column(column, name)
    return encoded.wire, out


def _assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype
    assert got.is_nested == want.is_nested
    if want.is_nested:
        assert torch.equal(got.offsets(), want.offsets())
        assert torch.equal(got.values().view(torch.uint8), want.values().contiguous().view(torch.uint8))
    else:
        assert got.shape == want.shape
        assert torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8))


@pytest.mark.parametrize("dtype", sorted(DTYPE_CODES, key=str))
def test_padded_rows_round_trip_bit_exact_for_every_dtype(dtype: torch.dtype) -> None:
    col = _jagged([3, 0, 5, 1], dtype)
    wire, out = _round_trip({"x": col}, 4)
    assert wire["x"].dtype == dtype and not wire["x"].is_nested and wire["x"].dim() == 2
    _assert_same(out["x"], col)


def test_padded_rows_with_trailing_dims_and_empty_rows() -> None:
    col = _jagged([0, 4, 0, 2, 7], torch.float32, inner=(3,))
    _, out = _round_trip({"x": col}, 5)
    _assert_same(out["x"], col)


def test_all_rows_empty_and_one_row() -> None:
    empty = _jagged([0, 0, 0])
    _, out = _round_trip({"x": empty}, 3)
    assert out["x"].shape == (3, 0) and out["x"].dtype == torch.int64
    one = _jagged([6], torch.bfloat16)
    _, out = _round_trip({"x": one}, 1)
    # One row shares one shape with itself: it comes back dense, as every equal-row column does.
    _assert_same(out["x"], one.values().reshape(1, 6))


def test_exact_rows_dense_scalar_and_equal_jagged_columns() -> None:
    dense = torch.randn(4, 5, 2)
    scalar = torch.tensor([7, -1, 3, 0], dtype=torch.int32)
    flags = torch.tensor([True, False, True, True])
    equal = _jagged([2, 2, 2, 2], torch.float16)
    wire, out = _round_trip({"d": dense, "s": scalar, "b": flags, "e": equal}, 4)
    assert wire["d"].data_ptr() == dense.data_ptr(), "dense rows are sent without a copy"
    _assert_same(out["d"], dense)
    _assert_same(out["s"], scalar)
    _assert_same(out["b"], flags)
    _assert_same(out["e"], equal.values().reshape(4, 2))


def test_mixed_dtypes_and_object_columns_in_one_put() -> None:
    cols = {
        "tokens": _jagged([5, 1, 3], torch.int64),
        "logprobs": _jagged([5, 1, 3], torch.float32),
        "reward": torch.tensor([0.5, 1.0, -2.0]),
        "prompt": NonTensorStack("a", "bb", "ccc"),
    }
    wire, out = _round_trip(cols, 3)
    assert wire["prompt"] is cols["prompt"]
    for name in ("tokens", "logprobs", "reward"):
        _assert_same(out[name], cols[name])
    assert out["prompt"].tolist() == ["a", "bb", "ccc"]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_large_equal_rows_and_undescribable_columns_keep_the_library_layout() -> None:
    wide = torch.zeros(2, LARGE_ROW_BYTES // 4)
    assert plan_column(wide).descriptor is None
    assert plan_column(torch.zeros(2, LARGE_ROW_BYTES // 4 - 1)).descriptor is not None
    strided = torch.nested.nested_tensor([torch.zeros(2, 3), torch.zeros(4, 5)])
    assert plan_column(strided).descriptor is None
    assert plan_column(torch.zeros(3, 2, 0)).descriptor is None
    assert plan_column(torch.zeros(3, 2, dtype=torch.uint16)).descriptor is None
    encoded = encode_put({"w": wide}, 2)
    assert encoded.parser is None and encoded.wire["w"] is wide


def test_rows_from_different_puts_with_different_shapes_decode_like_the_library() -> None:
    _, a = _round_trip({"x": torch.arange(6).reshape(2, 3)}, 2)
    encoded_a = encode_put({"x": torch.arange(6).reshape(2, 3)}, 2)
    rows_a = pickle.loads(cloudpickle.dumps(encoded_a.parser))(dict(encoded_a.wire))["x"]
    encoded_b = encode_put({"x": torch.arange(8).reshape(2, 4)}, 2)
    rows_b = pickle.loads(cloudpickle.dumps(encoded_b.parser))(dict(encoded_b.wire))["x"]
    mixed = decode_column(NonTensorStack(*(rows_a + rows_b)), "x")
    assert mixed.is_nested
    assert [r.tolist() for r in mixed.unbind()] == [[0, 1, 2], [3, 4, 5], [0, 1, 2, 3], [4, 5, 6, 7]]
    # Different row ranks cannot form one jagged tensor: rows of one shape stack, as the library does.
    encoded_c = encode_put({"x": torch.tensor([1, 2])}, 2)
    rows_c = pickle.loads(cloudpickle.dumps(encoded_c.parser))(dict(encoded_c.wire))["x"]
    assert decode_column(NonTensorStack(*rows_c), "x").tolist() == [1, 2]


def test_malformed_rows_are_refused_with_the_field_named() -> None:
    with pytest.raises(RuntimeError, match="'x'.*descriptor"):
        decode_column(NonTensorStack(b"garbage!", b"garbage!"), "x")
    encoded = encode_put({"x": torch.arange(4, dtype=torch.int32).reshape(2, 2)}, 2)
    rows = pickle.loads(cloudpickle.dumps(encoded.parser))(dict(encoded.wire))["x"]
    with pytest.raises(RuntimeError, match="'x'.*whole number"):
        decode_column(NonTensorStack(rows[0][:-1], rows[1][:-1]), "x")


def test_storage_split_refuses_a_length_beyond_its_row() -> None:
    matrix = torch.zeros(1, 4, dtype=torch.int64)
    matrix[0, 0] = 10_000
    with pytest.raises(ValueError, match="claims 10000 bytes"):
        row_split.split_rows({"x": matrix}, columns={"x": (b"", 8)})


def test_splitter_travels_by_value_and_needs_no_nemo_dp_on_the_unit() -> None:
    encoded = encode_put({"x": _jagged([2, 1])}, 2)
    blob = cloudpickle.dumps(encoded.parser)
    hidden = {k: v for k, v in sys.modules.items() if k == "nemo_dp" or k.startswith("nemo_dp.")}
    blocker = types.ModuleType("nemo_dp")  # an import of nemo_dp during unpickling would fail
    try:
        for k in hidden:
            del sys.modules[k]
        sys.modules["nemo_dp"] = blocker
        parser = pickle.loads(blob)
        rows = parser(dict(encoded.wire))["x"]
    finally:
        del sys.modules["nemo_dp"]
        sys.modules.update(hidden)
    assert len(rows) == 2 and all(isinstance(r, bytes) for r in rows)


# --- multimodal object rows ----------------------------------------------------------------


def _images(dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = []
    for h, w in [(4, 5), (2, 7), (6, 1)]:
        if dtype == torch.bool:
            out.append(torch.rand(3, h, w, generator=g) > 0.5)
        elif dtype.is_complex:
            out.append(torch.randn(3, h, w, dtype=dtype, generator=g))
        elif dtype.is_floating_point:
            out.append(torch.randn(3, h, w, generator=g).to(dtype))
        else:
            out.append(torch.randint(0, 100, (3, h, w), generator=g).to(dtype))
    return out


@pytest.mark.parametrize("dtype", sorted(DTYPE_CODES, key=str))
def test_variable_shape_tensor_rows_round_trip_bit_exact_as_object_rows(dtype: torch.dtype) -> None:
    images = _images(dtype)
    wire, out = _round_trip({"img": NonTensorStack.from_list(images)}, 3)
    assert wire["img"].dtype == torch.uint8 and wire["img"].dim() == 2, "sent as one row matrix"
    assert isinstance(out["img"], NonTensorStack)
    got = out["img"].tolist()
    assert len(got) == 3
    for g, want in zip(got, images):
        _assert_same(g, want)


def test_packed_entries_none_rows_and_empty_tensors_round_trip() -> None:
    from nemo_dp.data.multimodal_utils import PackedTensor

    rows = [
        PackedTensor(torch.randn(5, 6).to(torch.bfloat16), 0),
        PackedTensor([None], 0),
        None,
        PackedTensor(torch.zeros(0, 6), 1),
        torch.arange(3, dtype=torch.uint8),
        torch.tensor(2.5),
    ]
    wire, out = _round_trip({"pix": NonTensorStack.from_list(rows)}, 6)
    assert wire["pix"].dtype == torch.uint8
    got = out["pix"].tolist()
    assert type(got[0]) is PackedTensor and got[0].dim_to_pack == 0
    _assert_same(got[0].tensors[0], rows[0].tensors[0])
    assert type(got[1]) is PackedTensor and got[1].tensors == [None]
    assert got[2] is None
    assert got[3].dim_to_pack == 1 and got[3].tensors[0].shape == (0, 6)
    _assert_same(got[4], rows[4])
    assert got[5].shape == () and got[5].dtype == torch.float32 and got[5].item() == 2.5


def test_object_columns_the_rows_cannot_carry_keep_the_library_layout() -> None:
    from nemo_dp.data.multimodal_utils import PackedTensor

    for rows in (
        [torch.ones(2), "text"],
        [torch.ones(2, requires_grad=True), torch.ones(1)],
        [PackedTensor([torch.ones(1), torch.ones(1)], 0), torch.ones(1)],
        [torch.ones(2, dtype=torch.uint16), torch.ones(1)],
        [None, None],
    ):
        stack = NonTensorStack.from_list(rows)
        encoded = encode_put({"o": stack}, 2)
        assert encoded.parser is None and encoded.wire["o"] is stack


def test_object_rows_mixed_with_library_rows_and_malformed_rows() -> None:
    encoded = encode_put({"img": NonTensorStack.from_list([torch.ones(2, 2), torch.zeros(1, 3)])}, 2)
    rows = pickle.loads(cloudpickle.dumps(encoded.parser))(dict(encoded.wire))["img"]
    assert all(r.startswith(b"ndo1") for r in rows)
    # a later put of the same field in the library's layout (e.g. text rows)
    mixed = decode_column(NonTensorStack(rows[0], "text"), "img").tolist()
    assert torch.equal(mixed[0], torch.ones(2, 2)) and mixed[1] == "text"
    with pytest.raises(RuntimeError, match="'img'.*malformed"):
        decode_column(NonTensorStack(rows[0][:-1], rows[1]), "img")
    with pytest.raises(RuntimeError, match="'img'.*unknown kind"):
        decode_column(NonTensorStack(b"ndo1\x09", rows[1]), "img")
