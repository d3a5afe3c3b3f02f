"""Multimodal columns on the Local adapter, and their typed checkpoint encoding.

A loader batch may hold a ``PackedTensor`` column, a dict column (nested dicts of batch-major
values) and per-sample tensors of different shapes; the adapter stores them without flattening,
reads them back per sample as the same types, and checkpoints them exactly or refuses before
writing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import NonTensorData

from nemo_dp.data.multimodal_utils import PackedTensor
from nemo_dp.data_plane.adapters.local import LocalDataPlaneClient, local_batch_to_tensordict
from nemo_dp.data_plane.codec import materialize_local
from nemo_dp.data_plane.interfaces import LocalDataPlaneConfig
from nemo_dp.data_plane.value_codec import CorruptValueError, UnencodableValueError, ValueEncoder, decode_value

N = 4
FIELDS = ["ids", "pix", "grid", "mm", "images"]


def _batch() -> dict:
    g = torch.Generator().manual_seed(0)
    pix = [torch.randn(2 + i, 6, generator=g).to(torch.bfloat16) for i in range(N)]
    pix[2] = None  # a sample without an image
    grid = [torch.tensor([[1, 2, 1 + i]]) for i in range(N)]
    images = [torch.randint(0, 256, (3, 4 + i, 5 + 2 * i), generator=g, dtype=torch.uint8) for i in range(N)]
    return {
        "ids": torch.arange(N * 3).reshape(N, 3),
        "pix": PackedTensor(pix, dim_to_pack=0),
        "grid": PackedTensor(grid, dim_to_pack=0),
        "mm": {
            "pixel_values": PackedTensor([t if t is not None else None for t in pix], 0),
            "meta": {"scale": torch.linspace(0, 1, N, dtype=torch.float64), "tag": [f"t{i}" for i in range(N)]},
        },
        "images": images,
    }


def _client() -> LocalDataPlaneClient:
    return LocalDataPlaneClient(LocalDataPlaneConfig(max_partitions=2))


def _put(c: LocalDataPlaneClient, batch: dict, pid: str = "p") -> list[str]:
    ids = [f"r{i}" for i in range(N)]
    c.register_partition(pid, FIELDS, N, ["train"])
    c.put_samples(ids, pid, local_batch_to_tensordict(batch, batch_size=N))
    return ids


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _check_rows(table, batch: dict, rows: list[int]) -> None:
    assert torch.equal(table["ids"], batch["ids"][rows])
    for name in ("pix", "grid"):
        got = table[name]
        assert type(got) is PackedTensor and got.dim_to_pack == 0 and len(got) == len(rows)
        assert all(_same(g, batch[name].tensors[r]) for g, r in zip(got.tensors, rows))
    mm = table["mm"]
    assert type(mm) is dict and list(mm) == ["pixel_values", "meta"]
    assert all(_same(g, batch["mm"]["pixel_values"].tensors[r]) for g, r in zip(mm["pixel_values"].tensors, rows))
    assert torch.equal(mm["meta"]["scale"], batch["mm"]["meta"]["scale"][rows])
    assert mm["meta"]["tag"] == [batch["mm"]["meta"]["tag"][r] for r in rows]
    assert len(table["images"]) == len(rows)
    assert all(_same(g, batch["images"][r]) for g, r in zip(table["images"], rows))


def test_local_batch_to_tensordict_wraps_multimodal_columns_whole() -> None:
    batch = _batch()
    td = local_batch_to_tensordict(batch, batch_size=N)
    assert isinstance(td.get("ids"), torch.Tensor)
    for name in ("pix", "grid", "mm", "images"):
        leaf = td.get(name)
        assert isinstance(leaf, NonTensorData) and leaf.data is batch[name]
    with pytest.raises(ValueError, match=r"Local field 'mm'.*disagree"):
        local_batch_to_tensordict({"mm": {"a": torch.zeros(N), "b": torch.zeros(N + 1)}}, batch_size=N)
    with pytest.raises(ValueError, match="empty dict column"):
        local_batch_to_tensordict({"mm": {}}, batch_size=N)
    with pytest.raises(ValueError, match="Local field 'pix' has batch size 1, expected 4"):
        local_batch_to_tensordict({"pix": PackedTensor(torch.zeros(2, 2), 0)}, batch_size=N)


def test_rows_are_selected_per_sample_and_restored_exactly() -> None:
    batch = _batch()
    c = _client()
    ids = _put(c, batch)
    _check_rows(materialize_local(c.get_samples(ids, "p", FIELDS)), batch, [0, 1, 2, 3])
    _check_rows(materialize_local(c.get_samples(["r3", "r0", "r2"], "p", FIELDS)), batch, [3, 0, 2])
    # claims shard the batch per sample; get_data restores each shard's rows
    seen = []
    for _ in range(2):
        meta = c.claim_meta("p", "train", FIELDS, 2, blocking=False)
        rows = [ids.index(s) for s in meta.sample_ids]
        _check_rows(materialize_local(c.get_data(meta)), batch, rows)
        seen += rows
    assert sorted(seen) == [0, 1, 2, 3]
    c.close()


def test_reads_are_copies_and_the_put_copied_its_input() -> None:
    batch = _batch()
    want = _batch()
    c = _client()
    ids = _put(c, batch)
    batch["pix"].tensors[0].add_(1)  # the caller's tensor after the put
    batch["images"][1].zero_()
    first = materialize_local(c.get_samples(ids, "p", FIELDS))
    first["pix"].tensors[1].zero_()
    first["mm"]["meta"]["scale"].zero_()
    first["images"][0].zero_()
    _check_rows(materialize_local(c.get_samples(ids, "p", FIELDS)), want, [0, 1, 2, 3])
    c.close()


def test_bad_multimodal_puts_write_nothing() -> None:
    c = _client()
    c.register_partition("p", ["pix", "mm"], 2, ["t"])
    bad = [
        ({"pix": NonTensorData(PackedTensor([torch.zeros(1)] * 3, 0), batch_size=(2,))}, ValueError, "3 entries"),
        ({"mm": NonTensorData({"a": torch.zeros(3)}, batch_size=(2,))}, ValueError, r"\['a'\].*batch size 3"),
        ({"mm": NonTensorData({1: torch.zeros(2)}, batch_size=(2,))}, TypeError, "keys must be non-empty str"),
        ({"mm": NonTensorData({"a": object()}, batch_size=(2,))}, TypeError, "dict column value"),
    ]
    from tensordict import TensorDict

    for fields, exc, fragment in bad:
        with pytest.raises(exc, match=fragment):
            c.put_samples(["a", "b"], "p", TensorDict(fields, batch_size=(2,)))
        assert c.list_sample_ids("p") == []
    c.close()


def test_checkpoint_round_trip_is_exact(tmp_path: Path) -> None:
    batch = _batch()
    a = _client()
    ids = _put(a, batch)
    claimed = a.claim_meta("p", "train", FIELDS, 1, blocking=False)
    a.clear_samples(["r1"], "p")
    a.save_checkpoint(tmp_path / "ck", metadata={"step": 3})
    a.close()
    b = _client()
    assert b.load_checkpoint(tmp_path / "ck") == {"step": 3}
    live = [i for i in ids if i != "r1"]
    assert b.list_sample_ids("p") == live
    _check_rows(materialize_local(b.get_samples(live, "p", FIELDS)), batch, [0, 2, 3])
    rest = b.claim_meta("p", "train", FIELDS, 2, blocking=False)
    assert sorted(rest.sample_ids + claimed.sample_ids) == live
    b.close()


def test_unencodable_value_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    c = _client()
    c.register_partition("p", ["obj"], 2, ["t"])
    rows = [PackedTensor([torch.nn.Parameter(torch.ones(2))], 0), torch.zeros(3)]
    c.put_samples(["a", "b"], "p", local_batch_to_tensordict({"obj": rows}, batch_size=2))
    with pytest.raises(TypeError, match=r"'p' field 'obj' of sample id 'a'.*tensors\[0\].*Parameter"):
        c.save_checkpoint(tmp_path / "ck")
    assert list(tmp_path.iterdir()) == []
    c.close()


def test_value_codec_packed_tensor_nodes() -> None:
    table: dict[str, torch.Tensor] = {}
    value = {"p": PackedTensor([torch.ones(2, 3, dtype=torch.bfloat16), None], dim_to_pack=1), "t": torch.arange(3, dtype=torch.uint8)}
    node = ValueEncoder(table, "k").encode(value)
    back = decode_value(node, table, "here")
    assert type(back["p"]) is PackedTensor and back["p"].dim_to_pack == 1
    assert _same(back["p"].tensors[0], value["p"].tensors[0]) and back["p"].tensors[1] is None
    assert _same(back["t"], value["t"])
    packed = node["v"][0]
    for bad, fragment in [
        ({**packed, "v": []}, "at least one entry"),
        ({**packed, "v": [1]}, "tensor nodes or null"),
        ({**packed, "dim": "0"}, "'dim'"),
        ({**packed, "dim": True}, "'dim'"),
    ]:
        with pytest.raises(CorruptValueError, match=fragment):
            decode_value(bad, table, "here")
    with pytest.raises(UnencodableValueError, match=r"value.tensors\[0\]"):
        ValueEncoder({}, "k").encode(PackedTensor([torch.ones(1).to_sparse()], 0))
