"""column_io against the real Local adapter."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from nemo_dp.data_plane.adapters.local import LocalDataPlaneClient
from nemo_dp.data_plane.column_io import first_write, read_columns, round_up, write_columns
from nemo_dp.data_plane.interfaces import KVBatchMeta, LocalDataPlaneConfig
from nemo_dp.distributed.batched_data_dict import BatchedDataDict

FIELDS = ["input_ids", "input_lengths", "sample_mask", "token_mask", "advantages", "content", "extra", "values"]


def _objs(values: list) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


@pytest.fixture
def client() -> Iterator[LocalDataPlaneClient]:
    c = LocalDataPlaneClient(LocalDataPlaneConfig(max_partitions=4))
    try:
        yield c
    finally:
        c.close()


def _batch(lengths: Sequence[int] = (2, 6, 4), width: int = 6) -> dict:
    n = len(lengths)
    return {
        "input_ids": torch.arange(n * width, dtype=torch.int64).reshape(n, width) + 1,
        "input_lengths": torch.tensor(list(lengths), dtype=torch.int64),
        "sample_mask": torch.ones(n, dtype=torch.float32),
        "token_mask": (torch.arange(width).unsqueeze(0) < torch.tensor(list(lengths)).unsqueeze(1)).to(torch.int32),
        "content": _objs([f"text{i}" for i in range(n)]),
    }


def _register(c: LocalDataPlaneClient, pid: str, n: int = 3) -> None:
    c.register_partition(pid, FIELDS, n, ["train"])


def test_round_up() -> None:
    assert round_up(5, 1) == 5
    assert round_up(5, 0) == 5
    assert round_up(5, -3) == 5
    assert round_up(5, 4) == 8
    assert round_up(8, 4) == 8
    assert round_up(0, 64) == 0
    assert round_up(1445, 64) == 1472


def test_first_write_id_count_mismatch(client: LocalDataPlaneClient) -> None:
    _register(client, "p", 5)
    batch = _batch((1, 2, 3, 4, 5))
    with pytest.raises(ValueError, match="must match batch size"):
        first_write(batch, sample_ids=["a", "b"], dp_client=client, partition_id="p", task_name="train")
    assert client.list_sample_ids("p") == []


def test_first_write_validation(client: LocalDataPlaneClient) -> None:
    _register(client, "p")
    ids = ["a", "b", "c"]
    kw = dict(dp_client=client, partition_id="p", task_name="train")
    no_mask = {k: v for k, v in _batch().items() if k != "sample_mask"}
    with pytest.raises(KeyError, match="sample_mask"):
        first_write(no_mask, sample_ids=ids, **kw)
    no_len = {k: v for k, v in _batch().items() if k != "input_lengths"}
    with pytest.raises(KeyError, match="input_lengths"):
        first_write(no_len, sample_ids=ids, **kw)
    with pytest.raises(ValueError, match="must match batch size"):
        first_write({k: v[:0] for k, v in _batch().items()}, sample_ids=[], **kw)
    with pytest.raises(ValueError, match="duplicate"):
        first_write(_batch(), sample_ids=["a", "a", "c"], **kw)
    with pytest.raises(ValueError, match="tags"):
        first_write(_batch(), sample_ids=ids, tags=[{}], **kw)
    bad = dict(_batch(), extra=["x", "y", "z"])
    with pytest.raises(TypeError, match="'extra'"):
        first_write(bad, sample_ids=ids, **kw)
    bad_np = dict(_batch(), extra=np.array([1, 2, 3]))
    with pytest.raises(TypeError, match="'extra'"):
        first_write(bad_np, sample_ids=ids, **kw)
    # nothing was written by any rejected call
    assert client.list_sample_ids("p") == []


def test_first_write_meta_and_round_trip(client: LocalDataPlaneClient) -> None:
    _register(client, "p")
    batch = _batch()
    tags = [{"std": 0.5}, {"std": 1.0}, {"std": 0.0}]
    meta = first_write(batch, sample_ids=["a", "b", "c"], dp_client=client, partition_id="p",
                       task_name="train", extra_info={"rollout_metrics": {"x": 1}},
                       pad_to_multiple=8, tags=tags)
    assert meta.partition_id == "p" and meta.task_name == "train"
    assert meta.sample_ids == ["a", "b", "c"]
    assert meta.fields == list(batch.keys())
    assert meta.sequence_lengths == [2, 6, 4]
    assert meta.extra_info["pad_to_multiple"] == 8
    assert meta.extra_info["rollout_metrics"] == {"x": 1}
    assert "local_partition_generation" in meta.extra_info
    assert meta.tags == tags and meta.tags is not tags and meta.tags[0] is not tags[0]
    # per-token columns are stored jagged with the row lengths
    raw = client.get_data(meta, select_fields=["input_ids"])
    assert [r.shape[0] for r in raw.get("input_ids").unbind()] == [2, 6, 4]
    out = read_columns(client, meta, ["input_ids", "token_mask", "sample_mask", "content"],
                       pad_value_dict={"input_ids": -1})
    expected_ids = batch["input_ids"].clone()
    expected_ids[batch["token_mask"] == 0] = -1
    assert torch.equal(out["input_ids"], expected_ids)
    assert torch.equal(out["token_mask"], batch["token_mask"])
    assert out["token_mask"].dtype == torch.int32
    assert torch.equal(out["sample_mask"], batch["sample_mask"])
    assert list(out["content"]) == ["text0", "text1", "text2"]


def test_first_write_pad_to_multiple_only_when_above_one(client: LocalDataPlaneClient) -> None:
    _register(client, "p")
    meta = first_write(_batch(), sample_ids=["a", "b", "c"], dp_client=client, partition_id="p",
                       task_name=None)
    assert "pad_to_multiple" not in meta.extra_info
    assert client.get_data(meta).batch_size == torch.Size([3])


def test_read_columns_exact_fields_at_pad_target(client: LocalDataPlaneClient) -> None:
    _register(client, "p")
    meta = first_write(_batch(), sample_ids=["a", "b", "c"], dp_client=client, partition_id="p",
                       task_name="train")
    meta.extra_info["global_forward_pad_seqlen"] = 16
    out = read_columns(client, meta, ["token_mask", "input_ids"])
    assert isinstance(out, BatchedDataDict)
    assert list(out.keys()) == ["token_mask", "input_ids"]
    assert out["input_ids"].shape == (3, 16)
    assert out["token_mask"].shape == (3, 16)
    assert int(out["token_mask"][:, 6:].abs().sum()) == 0
    jag = read_columns(client, meta, ["input_ids"], layout="jagged")
    assert jag["input_ids"].is_nested
    with pytest.raises(ValueError, match="select_fields"):
        read_columns(client, meta, [])
    with pytest.raises(KeyError):
        read_columns(client, meta, ["advantages"])  # never produced


def test_read_columns_rows_follow_meta_order(client: LocalDataPlaneClient) -> None:
    _register(client, "p")
    meta = first_write(_batch(), sample_ids=["a", "b", "c"], dp_client=client, partition_id="p",
                       task_name="train")
    sub = meta.subset([2, 0])
    out = read_columns(client, sub, ["input_lengths", "content"])
    assert out["input_lengths"].tolist() == [4, 2]
    assert list(out["content"]) == ["text2", "text0"]


def test_write_columns_lands_named_fields_with_first_write_lengths(client: LocalDataPlaneClient) -> None:
    # The Local adapter accepts one put per partition, so write_columns is that put here; the
    # row lengths come from the meta, as they would after a first_write.
    _register(client, "w")
    meta = KVBatchMeta("w", "train", ["a", "b", "c"], sequence_lengths=[2, 6, 4],
                       extra_info={"local_partition_generation": -1})
    wide = torch.arange(24, dtype=torch.bfloat16).reshape(3, 8)  # padded to a global target
    cols = BatchedDataDict({"advantages": wide, "extra": _objs([1, None, "z"])})
    write_columns(client, meta, cols)
    got = client.get_samples(["a", "b", "c"], "w", ["advantages", "extra"])
    adv = got.get("advantages")
    assert adv.is_nested and adv.dtype == torch.bfloat16
    assert [r.shape[0] for r in adv.unbind()] == [2, 6, 4]
    assert torch.equal(adv.unbind()[1], wide[1, :6])
    with pytest.raises(KeyError):
        client.get_samples(["a"], "w", ["input_ids"])  # only the named fields landed


def test_write_columns_rejections_and_empty_noop(client: LocalDataPlaneClient) -> None:
    _register(client, "w")
    meta = KVBatchMeta("w", "train", ["a", "b", "c"], sequence_lengths=[1, 2, 3])
    with pytest.raises(ValueError, match="batch size 2, expected meta.size 3"):
        write_columns(client, meta, {"advantages": torch.zeros(2, 3)})
    with pytest.raises(TypeError, match="'advantages'"):
        write_columns(client, meta, {"advantages": [1.0, 2.0, 3.0]})
    write_columns(client, meta, {})
    write_columns(client, meta, BatchedDataDict())
    assert client.list_sample_ids("w") == []
    # The partition still accepts its single put: none of the calls above wrote anything.
    write_columns(client, meta, {"advantages": torch.ones(3, 3)})
    assert client.list_sample_ids("w") == ["a", "b", "c"]


def test_write_columns_moves_to_cpu_and_detaches(client: LocalDataPlaneClient) -> None:
    _register(client, "w", 2)
    meta = KVBatchMeta("w", "train", ["a", "b"], sequence_lengths=[1, 2])
    grad = torch.ones(2, 2, requires_grad=True) * 2
    write_columns(client, meta, {"values": grad, "sample_mask": torch.ones(2)})
    got = client.get_samples(["a", "b"], "w", ["values"]).get("values")
    assert not got.requires_grad
    assert [r.tolist() for r in got.unbind()] == [[2.0], [2.0, 2.0]]


class _WireLayoutLocalClient(LocalDataPlaneClient):
    """Isolates read_columns' reader choice for non-Local metas.

    A real Local client whose ``get_data`` skips the generation check and returns the wire
    layout of the TransferQueue adapter (per-row ``NonTensorStack`` object columns), so that
    a meta without a generation key goes through ``materialize``.
    """

    def get_data(self, meta: KVBatchMeta, select_fields: Sequence[str] | None = None) -> TensorDict:
        fields = list(select_fields or meta.fields or [])
        td = self.get_samples(meta.sample_ids, meta.partition_id, fields)
        out = TensorDict({}, batch_size=td.batch_size)
        for key in td.keys():
            leaf = td.get(key)
            if isinstance(leaf, NonTensorData):
                leaf = NonTensorStack(*[NonTensorData(v) for v in leaf.data])
            out.set(key, leaf)
        return out


def test_read_columns_uses_materialize_for_wire_metas() -> None:
    c = _WireLayoutLocalClient(LocalDataPlaneConfig(max_partitions=1))
    try:
        _register(c, "p")
        meta = first_write(_batch(), sample_ids=["a", "b", "c"], dp_client=c, partition_id="p",
                           task_name="train")
        wire_meta = KVBatchMeta("p", "train", list(meta.sample_ids),
                                extra_info={"global_forward_pad_seqlen": 8})
        out = read_columns(c, wire_meta, ["content", "input_ids"])
        assert isinstance(out["content"], np.ndarray) and out["content"].dtype == object
        assert list(out["content"]) == ["text0", "text1", "text2"]
        assert out["input_ids"].shape == (3, 8)
        # a Local meta read through the wire layout would still work; the reverse is guarded:
        with pytest.raises(TypeError, match="materialize_local"):
            from nemo_dp.data_plane.codec import materialize

            materialize(LocalDataPlaneClient.get_data(c, meta, ["content"]))
    finally:
        c.close()


def test_packed_tensor_columns_round_trip_through_first_write_and_read_columns(client: LocalDataPlaneClient) -> None:
    from nemo_dp.data.multimodal_utils import PackedTensor

    _register(client, "p")
    batch = _batch()
    pix = [torch.randn(2, 5).to(torch.bfloat16), None, torch.randn(4, 5).to(torch.bfloat16)]
    batch["extra"] = PackedTensor([None if t is None else t.clone() for t in pix], dim_to_pack=0)
    meta = first_write(batch, sample_ids=["a", "b", "c"], dp_client=client, partition_id="p", task_name="train")
    out = read_columns(client, meta.subset([2, 0]), ["extra"])
    got = out["extra"]
    assert isinstance(got, PackedTensor) and got.dim_to_pack == 0 and len(got) == 2
    assert torch.equal(got.tensors[0], pix[2]) and got.tensors[0].dtype == torch.bfloat16
    assert torch.equal(got.tensors[1], pix[0])
    with pytest.raises(TypeError, match="PackedTensor"):
        first_write({**_batch(), "extra": [1, 2, 3]}, sample_ids=["x", "y", "z"], dp_client=client,
                    partition_id="p", task_name="train")
