"""``PackedTensor``: construction, packing, per-sample selection and concatenation, bad input."""

from __future__ import annotations

import pytest
import torch

from nemo_dp.data.multimodal_utils import PackedTensor
from nemo_dp.distributed.batched_data_dict import BatchedDataDict


def _entries() -> list[torch.Tensor | None]:
    return [torch.arange(6.0).reshape(2, 3), None, torch.arange(3.0).reshape(1, 3) + 10]


def test_constructor_forms_and_len() -> None:
    single = torch.ones(4, 3)
    p = PackedTensor(single, dim_to_pack=0)
    assert len(p) == 1 and p.tensors[0] is single and p.dim_to_pack == 0
    entries = _entries()
    q = PackedTensor(entries, dim_to_pack=0)
    assert len(q) == 3
    entries.append(torch.zeros(1, 3))  # the entry list is copied
    assert len(q) == 3
    assert len(PackedTensor([None, None], 1)) == 2


@pytest.mark.parametrize(
    ("tensors", "dim", "exc", "fragment"),
    [
        ([], 0, ValueError, "non-empty"),
        (None, 0, TypeError, "None"),
        ("abc", 0, TypeError, "str"),
        ([torch.ones(1), 3], 0, TypeError, "entry 1"),
        ([torch.ones(1)], 0.0, TypeError, "dim_to_pack"),
        ([torch.ones(1)], True, TypeError, "dim_to_pack"),
    ],
)
def test_bad_arguments_name_what_is_wrong(tensors, dim, exc, fragment) -> None:
    with pytest.raises(exc, match=fragment):
        PackedTensor(tensors, dim)


def test_as_tensor_concatenates_present_entries() -> None:
    p = PackedTensor(_entries(), dim_to_pack=0)
    out = p.as_tensor()
    assert torch.equal(out, torch.cat([torch.arange(6.0).reshape(2, 3), torch.arange(3.0).reshape(1, 3) + 10]))
    q = PackedTensor([torch.ones(2, 1), torch.zeros(2, 2)], dim_to_pack=1)
    assert q.as_tensor().shape == (2, 3)
    assert PackedTensor([None, None], 0).as_tensor() is None
    assert p.as_tensor(device="cpu").device.type == "cpu"


def test_to_moves_in_place_and_returns_self() -> None:
    p = PackedTensor(_entries(), 0)
    assert p.to("cpu") is p
    assert p.tensors[1] is None and p.tensors[0].device.type == "cpu"


def test_slice_by_list_and_tensor() -> None:
    entries = _entries()
    p = PackedTensor(entries, 0)
    s = p.slice([2, 0, 2])
    assert len(s) == 3 and s.tensors[0] is entries[2] and s.tensors[1] is entries[0]
    t = p.slice(torch.tensor([1]))
    assert t.tensors == [None] and t.dim_to_pack == 0
    assert p.slice([-1]).tensors[0] is entries[2]
    with pytest.raises(IndexError, match="index 3"):
        p.slice([3])
    with pytest.raises(TypeError, match="not an int"):
        p.slice([0.5])
    with pytest.raises(TypeError, match="dtype"):
        p.slice(torch.tensor([0.0]))
    with pytest.raises(ValueError, match="non-empty"):
        p.slice([])


def test_empty_like_concat_and_flattened_concat() -> None:
    a = PackedTensor(_entries(), 0)
    b = PackedTensor([torch.full((1, 3), 7.0)], 0)
    e = PackedTensor.empty_like(a)
    assert e.tensors == [None, None, None] and e.dim_to_pack == 0
    c = PackedTensor.concat([a, b])
    assert len(c) == 4 and c.tensors[3] is b.tensors[0]
    f = PackedTensor.flattened_concat([a, b, e])
    assert len(f) == 3
    assert torch.equal(f.tensors[0], a.as_tensor()) and torch.equal(f.tensors[1], b.as_tensor())
    assert f.tensors[2] is None
    with pytest.raises(ValueError, match="different dims"):
        PackedTensor.concat([a, PackedTensor([torch.ones(1, 1)], 1)])
    with pytest.raises(ValueError, match="at least one"):
        PackedTensor.flattened_concat([])
    with pytest.raises(TypeError, match="item 1"):
        PackedTensor.concat([a, torch.ones(1)])
    with pytest.raises(TypeError, match="PackedTensor"):
        PackedTensor.empty_like(torch.ones(1))


def test_batched_data_dict_selects_shards_and_concatenates_per_sample() -> None:
    pix = PackedTensor([torch.full((k + 1, 2), float(k)) for k in range(4)], 0)
    batch = BatchedDataDict({"pixel_values": pix, "x": torch.arange(4)})
    assert batch.size == 4
    picked = batch.select_indices([3, 1])
    assert isinstance(picked["pixel_values"], PackedTensor)
    assert [t[0, 0].item() for t in picked["pixel_values"].tensors] == [3.0, 1.0]
    assert picked["x"].tolist() == [3, 1]
    part = batch.slice(1, 3)
    assert [t.shape[0] for t in part["pixel_values"].tensors] == [2, 3]
    shards = batch.shard_by_batch_size(2)
    assert [len(s["pixel_values"]) for s in shards] == [2, 2]
    assert torch.equal(shards[1]["pixel_values"].tensors[0], pix.tensors[2])
    back = BatchedDataDict.from_batches(shards)
    assert [torch.equal(a, b) for a, b in zip(back["pixel_values"].tensors, pix.tensors)] == [True] * 4
    assert batch.to("cpu")["pixel_values"] is pix
