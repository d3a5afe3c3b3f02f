"""TQWorkerMixin against the real Local adapter.

``_Host`` below is a minimal worker host defined for these tests: it isolates the mixin from
the real ``PolicyWorker`` (no model, no Ray).  Its in-memory methods are deterministic functions
of the batch they receive and record what they received, so the tests can check what the mixin
fetched, which plan it attached and what it wrote back.

Write-back and the Local adapter: a Local partition accepts exactly one put, so a worker cannot
add ``prev_logprobs`` next to the seed columns it read (TransferQueue upserts; Local raises
"duplicate writes").  Write-back tests therefore use a partition registered fresh for the written
field, and the entrypoint tests use ``_SplitStore``, a test double that reads from one real Local
store (the seed columns) and puts into a second real Local store where the same partition id is
registered for the result field.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from os import PathLike
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, TensorDict

from nemo_dp.data_plane.adapters.local import LocalDataPlaneClient
from nemo_dp.data_plane.batch_columns import materialize_for_meta
from nemo_dp.data_plane.codec import materialize
from nemo_dp.data_plane.column_io import first_write
from nemo_dp.data_plane.driver_mixin import isolated_copy, shard_meta_for_dp
from nemo_dp.data_plane.interfaces import DataPlaneClient, KVBatchMeta, LocalDataPlaneConfig
from nemo_dp.data_plane.observability import MetricsDataPlaneClient
from nemo_dp.data_plane.schema import (
    ELEM_COUNTS_PER_GB,
    GLOBAL_FORWARD_PAD_SEQLEN,
    LOCAL_PARTITION_GENERATION,
    LP_SEED_FIELDS,
    MICRO_BATCH_INDICES,
    MICRO_BATCH_LENGTHS,
    PREV_LOGPROBS,
    REFERENCE_POLICY_LOGPROBS,
    VALUES,
)
from nemo_dp.data_plane.worker_mixin import ROW_VALUES_KEY, TQWorkerMixin, apply_row_values
from nemo_dp.distributed.batched_data_dict import BatchedDataDict

LOCAL_CFG = {"enabled": True, "impl": "local"}
SEED_IDS = torch.tensor(
    [[11, 12, 13, 0, 0, 0], [21, 22, 23, 24, 25, 0], [31, 32, 0, 0, 0, 0]], dtype=torch.int64
)
SEED_LENGTHS = [3, 5, 2]
TARGET = 8  # the driver's global pad target for the seed batch (round_up(5, 4))
PAD_ID = 99


def _policy_cfg(*, db: bool = False, sp: bool = False) -> dict[str, Any]:
    return {
        "dynamic_batching": {
            "enabled": db,
            "train_mb_tokens": 64,
            "logprob_mb_tokens": 64,
            "sequence_length_round": 4,
        },
        "sequence_packing": {
            "enabled": sp,
            "train_mb_tokens": 64,
            "logprob_mb_tokens": 64,
            "algorithm": "first_fit_decreasing",
            "sequence_length_pad_multiple": 1,
            "microbatch_order": "packer",
        },
    }


class _Host(TQWorkerMixin):
    """Minimal worker host (see the module docstring for what it isolates)."""

    def __init__(
        self,
        coords: Mapping[str, int] | None = None,
        *,
        cfg: Any = None,
        pad_id: int | None = PAD_ID,
    ) -> None:
        self.coords = {} if coords is None else dict(coords)
        self.cfg = _policy_cfg() if cfg is None else cfg
        self.pad_id = pad_id
        self.received: list[tuple[str, BatchedDataDict]] = []
        self.split_calls: list[tuple[Any, ...]] = []

    def _local_coords(self) -> dict[str, int]:
        return dict(self.coords)

    # in-memory compute ---------------------------------------------------------------------
    def train(
        self, data: BatchedDataDict, loss_fn: Any, eval_mode: bool = False, gbs: int | None = None,
        mbs: int | None = None,
    ) -> dict:
        self.received.append(("train", data))
        return {"loss": float(loss_fn(data)), "eval_mode": eval_mode, "gbs": gbs, "mbs": mbs}

    def get_logprobs(self, data: BatchedDataDict, micro_batch_size: int | None = None) -> BatchedDataDict:
        self.received.append(("get_logprobs", data))
        return BatchedDataDict({"logprobs": data["input_ids"].float() / 10})

    def get_reference_policy_logprobs(
        self, data: BatchedDataDict, micro_batch_size: int | None = None
    ) -> BatchedDataDict:
        self.received.append(("get_reference_policy_logprobs", data))
        return BatchedDataDict({"reference_logprobs": -data["input_ids"].float()})

    def get_values(self, data: BatchedDataDict, micro_batch_size: int | None = None) -> dict:
        self.received.append(("get_values", data))
        return {"values": data["input_ids"].float() + 0.5}

    # split training API --------------------------------------------------------------------
    def begin_train_step(self, loss_fn: Any, mbs: int | None = None) -> None:
        self.split_calls.append(("begin", loss_fn, mbs))

    def train_microbatch(self, data: BatchedDataDict) -> None:
        self.split_calls.append(("microbatch", data))

    def finish_train_step(self) -> dict:
        self.split_calls.append(("finish",))
        return {"loss": 1.5, "is_replica_leader": True}

    def abort_train_step(self) -> None:
        self.split_calls.append(("abort",))


class _SplitStore(DataPlaneClient):
    """Test double: reads from ``seed`` (real Local), puts into ``results`` (real Local).

    It isolates the one TransferQueue behaviour the Local adapter lacks - a second put of new
    columns under ids that already hold columns.  Methods the worker mixin never calls raise.
    """

    def __init__(self, seed: LocalDataPlaneClient, results: LocalDataPlaneClient) -> None:
        self.seed = seed
        self.results = results

    def get_data(self, meta: KVBatchMeta, select_fields: Sequence[str] | None = None) -> TensorDict:
        return self.seed.get_data(meta, select_fields)

    def get_samples(self, sample_ids: Sequence[str], partition_id: str, select_fields: Sequence[str]) -> TensorDict:
        return self.seed.get_samples(sample_ids, partition_id, select_fields)

    def put_samples(
        self, sample_ids: Sequence[str], partition_id: str, fields: TensorDict | None = None,
        tags: Sequence[dict] | None = None,
    ) -> KVBatchMeta:
        return self.results.put_samples(sample_ids, partition_id, fields, tags)

    def close(self) -> None:
        self.seed.close()
        self.results.close()

    def _unused(self, name: str) -> Any:
        raise AssertionError(f"_SplitStore.{name} is not used by the worker mixin")

    def register_partition(self, *args: Any, **kwargs: Any) -> None:
        self._unused("register_partition")

    def claim_meta(self, *args: Any, **kwargs: Any) -> KVBatchMeta:
        return self._unused("claim_meta")

    def check_consumption_status(self, partition_id: str, task_names: Sequence[str]) -> bool:
        return self._unused("check_consumption_status")

    def list_sample_ids(self, partition_id: str) -> list[str]:
        return self._unused("list_sample_ids")

    def clear_samples(self, sample_ids: Sequence[str] | None, partition_id: str) -> None:
        self._unused("clear_samples")

    def save_checkpoint(self, checkpoint_dir: str | PathLike, *, metadata: Mapping | None = None) -> None:
        self._unused("save_checkpoint")

    def load_checkpoint(self, checkpoint_dir: str | PathLike) -> dict:
        return self._unused("load_checkpoint")


def _local(max_partitions: int = 4) -> LocalDataPlaneClient:
    return LocalDataPlaneClient(LocalDataPlaneConfig(max_partitions=max_partitions))


def _seed(client: LocalDataPlaneClient, pid: str = "step") -> KVBatchMeta:
    """First-write the seed batch and return the dispatch meta a driver would send."""
    client.register_partition(
        pid,
        fields=["input_ids", "input_lengths", "token_mask", "sample_mask", "content"],
        num_samples=3,
        consumer_tasks=["prev_lp"],
    )
    lengths = torch.tensor(SEED_LENGTHS, dtype=torch.int32)
    token_mask = (torch.arange(6).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int32)
    content = np.empty(3, dtype=object)
    for i, v in enumerate(["x", None, {"k": [1]}]):
        content[i] = v
    receipt = first_write(
        {
            "input_ids": SEED_IDS,
            "input_lengths": lengths,
            "token_mask": token_mask,
            "sample_mask": torch.ones(3, dtype=torch.float32),
            "content": content,
        },
        sample_ids=[f"{pid}_r{i}" for i in range(3)],
        dp_client=client,
        partition_id=pid,
        task_name="train",
    )
    meta = isolated_copy(receipt, fields=list(LP_SEED_FIELDS), task_name="prev_lp")
    meta.extra_info[GLOBAL_FORWARD_PAD_SEQLEN] = TARGET
    return meta


def _expected_ids(width: int = TARGET) -> torch.Tensor:
    out = torch.full((3, width), PAD_ID, dtype=torch.int64)
    for i, n in enumerate(SEED_LENGTHS):
        out[i, :n] = SEED_IDS[i, :n]
    return out


def _read_back(client: LocalDataPlaneClient, meta: KVBatchMeta, field: str) -> torch.Tensor:
    td = client.get_samples(meta.sample_ids, meta.partition_id, [field])
    return materialize(td)[field]


def _trimmed(t: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """Rows cut to their lengths and zero-padded to the longest (what write-back stores)."""
    out = torch.zeros(t.shape[0], max(lengths), dtype=t.dtype)
    for i, n in enumerate(lengths):
        out[i, :n] = t[i, :n]
    return out


@pytest.fixture
def split_store() -> Any:
    store = _SplitStore(_local(), _local())
    try:
        yield store
    finally:
        store.close()


# --- I 66: coordinates, leadership, leader-only write-back -----------------------------------


class _Bare(TQWorkerMixin):
    """A host that forgot ``_local_coords``."""


class _BaseWithCoords:
    def _local_coords(self) -> dict[str, int]:
        return {"tensor_parallel": 1}


class _MixinFirst(TQWorkerMixin, _BaseWithCoords):
    """The mixin listed before the host base: its defaults must defer to the base."""


def test_local_coords_without_override_raises() -> None:
    with pytest.raises(NotImplementedError, match="_local_coords"):
        _Bare()._local_coords()
    with pytest.raises(NotImplementedError):
        _Bare()._is_replica_leader()


def test_mixin_defaults_defer_to_a_host_base_class() -> None:
    host = _MixinFirst()
    assert host._local_coords() == {"tensor_parallel": 1}
    assert host._is_replica_leader() is False


@pytest.mark.parametrize(
    ("coords", "leader"),
    [
        ({}, True),
        ({"tensor_parallel": 0, "context_parallel": 0, "pipeline_parallel": 0}, True),
        ({"data_parallel": 3}, True),
        ({"tensor_parallel": 1}, False),
        ({"context_parallel": 1}, False),
        ({"pipeline_parallel": 2}, False),
    ],
)
def test_is_replica_leader(coords: dict[str, int], leader: bool) -> None:
    assert _Host(coords)._is_replica_leader() is leader


def test_only_the_leaders_write_back_lands() -> None:
    client = _local()
    try:
        client.register_partition("wb", fields=[PREV_LOGPROBS], num_samples=2, consumer_tasks=[])
        meta = KVBatchMeta("wb", "prev_lp", ["a", "b"], sequence_lengths=[2, 3])
        leader, sibling = _Host({}), _Host({"tensor_parallel": 1})
        leader.dp_client = sibling.dp_client = client
        sibling_value = torch.full((2, 4), 7.0)
        leader_value = torch.arange(8, dtype=torch.float32).reshape(2, 4)
        sibling._write_back_result_field(meta, {"logprobs": sibling_value}, result_key="logprobs", field=PREV_LOGPROBS)
        sibling._write_back(meta, {PREV_LOGPROBS: sibling_value})
        assert client.list_sample_ids("wb") == []
        leader._write_back_result_field(meta, {"logprobs": leader_value}, result_key="logprobs", field=PREV_LOGPROBS)
        assert torch.equal(_read_back(client, meta, PREV_LOGPROBS), _trimmed(leader_value, [2, 3]))
    finally:
        client.close()


def test_leader_only_write_back_through_the_entrypoint(split_store: _SplitStore) -> None:
    meta = _seed(split_store.seed)
    split_store.results.register_partition(
        "step", fields=[PREV_LOGPROBS], num_samples=3, consumer_tasks=[]
    )
    leader, sibling = _Host({}), _Host({"tensor_parallel": 1})
    leader.dp_client = sibling.dp_client = split_store
    assert sibling.get_logprobs_presharded(meta) is None
    assert len(sibling.received) == 1  # the sibling computed ...
    assert split_store.results.list_sample_ids("step") == []  # ... but wrote nothing
    leader.get_logprobs_presharded(meta)
    assert split_store.results.list_sample_ids("step") == sorted(meta.sample_ids)


def test_write_back_of_no_fields_is_a_noop() -> None:
    client = _local()
    try:
        client.register_partition("wb", fields=[PREV_LOGPROBS], num_samples=1, consumer_tasks=[])
        host = _Host({})
        host.dp_client = client
        host._write_back(KVBatchMeta("wb", None, ["a"]), {})
        assert client.list_sample_ids("wb") == []
    finally:
        client.close()


# --- I 67: entrypoints --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entrypoint", "field", "expected"),
    [
        ("get_logprobs_presharded", PREV_LOGPROBS, lambda ids: ids.float() / 10),
        ("get_reference_policy_logprobs_presharded", REFERENCE_POLICY_LOGPROBS, lambda ids: -ids.float()),
        ("get_values_presharded", VALUES, lambda ids: ids.float() + 0.5),
    ],
)
def test_result_entrypoints_write_their_field_and_return_none(
    split_store: _SplitStore, entrypoint: str, field: str, expected: Any
) -> None:
    meta = _seed(split_store.seed)
    split_store.results.register_partition("step", fields=[field], num_samples=3, consumer_tasks=[])
    host = _Host({})
    host.dp_client = split_store
    assert getattr(host, entrypoint)(meta, micro_batch_size=2) is None
    (name, data), = host.received
    assert name == entrypoint.removesuffix("_presharded")
    assert list(data.keys()) == list(LP_SEED_FIELDS)
    assert torch.equal(data["input_ids"], _expected_ids())  # global target, pad id, meta order
    assert data["token_mask"].shape == (3, TARGET)
    stored = _read_back(split_store.results, meta, field)
    assert torch.equal(stored, _trimmed(expected(_expected_ids()), SEED_LENGTHS))


def test_fused_logprob_entrypoint_reads_once_and_writes_both_columns_in_one_put(
    split_store: _SplitStore,
) -> None:
    meta = _seed(split_store.seed)
    split_store.results.register_partition(
        "step", fields=[PREV_LOGPROBS, REFERENCE_POLICY_LOGPROBS], num_samples=3, consumer_tasks=[]
    )
    counted = MetricsDataPlaneClient(split_store)
    counted.get_step_metrics(1.0)  # drop the seeding traffic from the window
    host = _Host({})
    host.dp_client = counted
    assert host.get_logprobs_and_reference_presharded(meta, micro_batch_size=2) is None
    # Both hooks ran on the one fetched batch.
    assert [name for name, _ in host.received] == ["get_logprobs", "get_reference_policy_logprobs"]
    assert host.received[0][1] is host.received[1][1]
    window = counted.get_step_metrics(1.0)
    assert window["step/get_data/calls"] == 1.0 and window["step/put/calls"] == 1.0
    assert window["step/put/rows"] == 3.0
    assert {k.split("/")[1] for k in window if k.count("/") == 2} == {"get_data", "put"}
    # The columns are exactly what the two separate entrypoints write.
    ids = _expected_ids()
    assert torch.equal(
        _read_back(split_store.results, meta, PREV_LOGPROBS), _trimmed(ids.float() / 10, SEED_LENGTHS)
    )
    assert torch.equal(
        _read_back(split_store.results, meta, REFERENCE_POLICY_LOGPROBS), _trimmed(-ids.float(), SEED_LENGTHS)
    )


def test_fused_logprob_entrypoint_writes_nothing_on_a_sibling(split_store: _SplitStore) -> None:
    meta = _seed(split_store.seed)
    split_store.results.register_partition(
        "step", fields=[PREV_LOGPROBS, REFERENCE_POLICY_LOGPROBS], num_samples=3, consumer_tasks=[]
    )
    sibling = _Host({"tensor_parallel": 1})
    sibling.dp_client = split_store
    sibling.get_logprobs_and_reference_presharded(meta)
    assert len(sibling.received) == 2
    assert split_store.results.list_sample_ids("step") == []


def test_fused_logprob_entrypoint_names_a_bad_result(split_store: _SplitStore) -> None:
    meta = _seed(split_store.seed)
    split_store.results.register_partition(
        "step", fields=[PREV_LOGPROBS, REFERENCE_POLICY_LOGPROBS], num_samples=3, consumer_tasks=[]
    )
    host = _Host({})
    host.dp_client = split_store
    host.get_reference_policy_logprobs = lambda data, micro_batch_size=None: {"oops": data["input_ids"]}
    with pytest.raises(RuntimeError, match="reference_policy_logprobs.*'reference_logprobs'"):
        host.get_logprobs_and_reference_presharded(meta)
    assert split_store.results.list_sample_ids("step") == []  # nothing written before the error


def test_worker_step_metrics_need_a_metrics_client(split_store: _SplitStore) -> None:
    host = _Host({})
    host.dp_client = split_store
    assert host.data_plane_step_metrics(1.0) == {}
    host.dp_client = MetricsDataPlaneClient(split_store)
    assert host.data_plane_step_metrics(1.0)["step/wall_ms"] == 0.0


def test_train_presharded_returns_metrics_and_writes_nothing(split_store: _SplitStore) -> None:
    meta = _seed(split_store.seed)
    split_store.results.register_partition(
        "step",
        fields=[PREV_LOGPROBS, REFERENCE_POLICY_LOGPROBS, VALUES, "advantages"],
        num_samples=3,
        consumer_tasks=[],
    )
    host = _Host({})
    host.dp_client = split_store
    metrics = host.train_presharded(
        meta, lambda d: d["input_ids"].sum(), eval_mode=True, gbs=3, mbs=1
    )
    assert metrics == {
        "loss": float(_expected_ids().sum()),
        "eval_mode": True,
        "gbs": 3,
        "mbs": 1,
    }
    assert split_store.results.list_sample_ids("step") == []


def test_train_presharded_sets_the_row_values_the_dispatch_carried(split_store: _SplitStore) -> None:
    meta = _seed(split_store.seed)
    meta.fields = ["input_ids", "input_lengths", "token_mask"]  # no advantages / sample_mask read
    adv = torch.tensor([0.5, -1.25, 2.0])
    mask = torch.tensor([1.0, 0.0, 1.0])
    meta.extra_info[ROW_VALUES_KEY] = {"advantages": adv, "sample_mask": mask}
    host = _Host({})
    host.dp_client = split_store
    host.train_presharded(meta, lambda d: 0.0, gbs=3, mbs=1)
    (_, data), = host.received
    token_mask = data["token_mask"]
    assert token_mask.shape == (3, TARGET)
    # exactly the legacy trainer's expression, on every token (padding included)
    assert torch.equal(data["advantages"], adv.unsqueeze(1) * token_mask.float())
    assert data["advantages"].dtype == torch.float32
    assert torch.equal(data["sample_mask"], mask)


def test_apply_row_values_rejects_bad_input() -> None:
    data = BatchedDataDict({"token_mask": torch.ones(2, 3, dtype=torch.int32)})
    with pytest.raises(ValueError, match="not one of"):
        apply_row_values(data, {"returns": torch.ones(2)})
    with pytest.raises(ValueError, match="1-D tensor of 2 rows"):
        apply_row_values(data, {"advantages": torch.ones(3)})
    with pytest.raises(ValueError, match="token_mask"):
        apply_row_values(BatchedDataDict({"input_ids": torch.ones(2, 3)}), {"advantages": torch.ones(2)})
    assert "advantages" not in data  # nothing set by a rejected call


# --- I 68: write-back checks --------------------------------------------------------------------


@pytest.fixture
def wb_host() -> Any:
    client = _local()
    client.register_partition("wb", fields=[PREV_LOGPROBS], num_samples=2, consumer_tasks=[])
    host = _Host({})
    host.dp_client = client
    try:
        yield host, client, KVBatchMeta("wb", "prev_lp", ["a", "b"], sequence_lengths=[1, 2])
    finally:
        client.close()


def test_write_back_accepts_a_batched_data_dict(wb_host: Any) -> None:
    host, client, meta = wb_host
    value = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    host._write_back_result_field(meta, BatchedDataDict({"logprobs": value}), result_key="logprobs", field=PREV_LOGPROBS)
    assert torch.equal(_read_back(client, meta, PREV_LOGPROBS), torch.tensor([[1.0, 0.0], [3.0, 4.0]]))


@pytest.mark.parametrize(
    ("result", "error", "match"),
    [
        ({"other": torch.zeros(2, 2)}, RuntimeError, "'logprobs'"),
        (torch.zeros(2, 2), RuntimeError, "Mapping"),
        ({"logprobs": [[0.0, 0.0], [0.0, 0.0]]}, TypeError, "torch.Tensor"),
        ({"logprobs": np.zeros((2, 2))}, TypeError, "torch.Tensor"),
        ({"logprobs": torch.zeros(3, 2)}, ValueError, "batch dim 3"),
        ({"logprobs": torch.tensor(1.0)}, ValueError, "batch dim None"),
    ],
)
def test_write_back_rejects_bad_results_before_writing(
    wb_host: Any, result: Any, error: type[Exception], match: str
) -> None:
    host, client, meta = wb_host
    with pytest.raises(error, match=match):
        host._write_back_result_field(meta, result, result_key="logprobs", field=PREV_LOGPROBS)
    assert client.list_sample_ids("wb") == []


# --- I 69: setup, fetch policies, guards ---------------------------------------------------------


@pytest.mark.parametrize(
    ("entrypoint", "args"),
    [
        ("train_presharded", ("META", lambda d: 0.0)),
        ("get_logprobs_presharded", ("META",)),
        ("get_reference_policy_logprobs_presharded", ("META",)),
        ("get_values_presharded", ("META",)),
        ("begin_train_step_presharded", (lambda d: 0.0,)),
    ],
)
def test_entrypoint_before_setup_raises(entrypoint: str, args: tuple[Any, ...]) -> None:
    meta = KVBatchMeta("p", "train", ["a"], fields=["input_ids"])
    call_args = tuple(meta if a == "META" else a for a in args)
    host = _Host({})
    with pytest.raises(RuntimeError, match=r"setup_data_plane\(cfg\) before invoking"):
        getattr(host, entrypoint)(*call_args)
    assert host.received == [] and host.split_calls == []


def test_setup_data_plane_builds_a_private_client_once() -> None:
    host = _Host({})
    host.setup_data_plane(LOCAL_CFG)
    try:
        client = host.dp_client
        assert isinstance(client, LocalDataPlaneClient)
        assert host.dp_cfg is LOCAL_CFG
        host.setup_data_plane(LOCAL_CFG)
        assert host.dp_client is client
        assert host._require_dp_client() is client
    finally:
        client.close()


def test_setup_data_plane_rejects_a_disabled_config() -> None:
    with pytest.raises(ValueError, match="disabled"):
        _Host({}).setup_data_plane({"enabled": False})


def test_fetch_reads_the_shard_from_the_ranks_own_client(split_store: _SplitStore) -> None:
    meta = _seed(split_store.seed)
    host = _Host({})
    host.dp_client = split_store
    assert torch.equal(host._fetch(meta)["input_ids"], _expected_ids())


def test_fetch_without_dp_alignment_pads_to_the_slice_maximum(split_store: _SplitStore) -> None:
    meta = _seed(split_store.seed)
    host = _Host({}, pad_id=None)
    host.dp_client = split_store
    data = host._fetch(meta, dp_aligned_seq_len=False)
    assert data["input_ids"].shape == (3, 5)
    assert int(data["input_ids"][2, 4]) == 0  # no pad_id on the host: pads with 0
    jagged = host._fetch(meta, layout="jagged")
    assert jagged["input_ids"].is_nested


def test_fetch_rejects_a_stale_local_meta(split_store: _SplitStore) -> None:
    meta = _seed(split_store.seed)
    host = _Host({})
    host.dp_client = split_store
    stale = copy.deepcopy(meta)
    stale.extra_info[LOCAL_PARTITION_GENERATION] += 1
    with pytest.raises(ValueError, match="Stale local metadata"):
        host._fetch(stale)


def test_materialize_for_meta_guards_whole_column_non_tensor_leaves() -> None:
    td = TensorDict(
        {"input_ids": torch.zeros(2, 3, dtype=torch.int64), "content": NonTensorData(["a", "b"], batch_size=(2,))},
        batch_size=(2,),
    )
    wire = KVBatchMeta("p", "train", ["a", "b"])
    local = KVBatchMeta("p", "train", ["a", "b"], extra_info={LOCAL_PARTITION_GENERATION: 1})
    with pytest.raises(TypeError, match="materialize_local"):
        materialize_for_meta(wire, td)
    data = materialize_for_meta(local, td, pad_to_seqlen=5)
    assert data["content"] == ["a", "b"] and data["input_ids"].shape == (2, 5)


def test_get_data_plane_snapshot() -> None:
    host = _Host({})
    assert host.get_data_plane_snapshot() is None
    host.setup_data_plane({"enabled": True, "impl": "local", "observability": {"enabled": True}})
    try:
        assert isinstance(host.dp_client, MetricsDataPlaneClient)
        host.dp_client.register_partition("p", fields=["x"], num_samples=1, consumer_tasks=[])
        snap = host.get_data_plane_snapshot()
        assert snap is not None and snap["total_ops"] == 1
        plain = _Host({})
        plain.dp_client = _local()
        assert plain.get_data_plane_snapshot() is None
        plain.dp_client.close()
    finally:
        host.dp_client.close()


# --- I 70: plans and the split training API ------------------------------------------------------


def _planned_shards(lengths: list[int]) -> list[KVBatchMeta]:
    meta = KVBatchMeta("p", "train", [f"s{i}" for i in range(len(lengths))], sequence_lengths=lengths)
    shards, _order = shard_meta_for_dp(
        meta,
        dp_world=2,
        dynamic_batching_args={
            "max_tokens_per_microbatch": 4096,
            "sequence_length_round": 64,
            "input_key": "input_ids",
            "input_lengths_key": "input_lengths",
        },
    )
    return shards


def test_attach_pack_metadata_attaches_the_plan_unchanged() -> None:
    shards = _planned_shards([1204, 499, 1445, 876, 361, 487, 927, 678])
    for shard in shards:
        before = copy.deepcopy(shard.extra_info)
        data = _Host({}, cfg=_policy_cfg(db=True))._attach_pack_metadata(BatchedDataDict(), shard)
        assert data.micro_batch_indices == [[[0, 3], [3, 4]]]
        assert data.micro_batch_lengths == [[960, 1472]]
        assert data.micro_batch_indices == shard.extra_info[MICRO_BATCH_INDICES]
        assert data.elem_counts_per_gb is None
        assert shard.extra_info == before
    packed = KVBatchMeta(
        "p",
        "train",
        ["a", "b"],
        extra_info={MICRO_BATCH_INDICES: [[[0, 1], [1, 2]]], MICRO_BATCH_LENGTHS: [[64, 32]], ELEM_COUNTS_PER_GB: [2]},
    )
    data = _Host({}, cfg=_policy_cfg(sp=True))._attach_pack_metadata(BatchedDataDict(), packed)
    assert (data.micro_batch_indices, data.micro_batch_lengths, data.elem_counts_per_gb) == (
        [[[0, 1], [1, 2]]],
        [[64, 32]],
        [2],
    )


@pytest.mark.parametrize("cfg", [_policy_cfg(db=True), _policy_cfg(sp=True)])
def test_packing_enabled_without_a_plan_raises(cfg: dict[str, Any]) -> None:
    meta = KVBatchMeta("p", "train", ["a"])
    with pytest.raises(ValueError, match="no microbatch plan"):
        _Host({}, cfg=cfg)._attach_pack_metadata(BatchedDataDict(), meta)
    data = _Host({})._attach_pack_metadata(BatchedDataDict(), meta)  # packing off: no plan needed
    assert data.micro_batch_indices is None


def test_incomplete_plan_raises() -> None:
    meta = KVBatchMeta("p", "train", ["a"], extra_info={MICRO_BATCH_INDICES: [[[0, 1]]]})
    with pytest.raises(ValueError, match="micro_batch_lengths"):
        _Host({})._attach_pack_metadata(BatchedDataDict(), meta)


def test_packing_enabled_requires_config_sections() -> None:
    with pytest.raises(KeyError, match=r"cfg\.sequence_packing"):
        _Host({}, cfg={"dynamic_batching": {"enabled": False}})._packing_enabled()


def test_entrypoint_attaches_the_plan_and_refuses_a_missing_one(split_store: _SplitStore) -> None:
    meta = _seed(split_store.seed)
    host = _Host({}, cfg=_policy_cfg(db=True))
    host.dp_client = split_store
    with pytest.raises(ValueError, match="no microbatch plan"):
        host.train_presharded(meta, lambda d: 0.0)
    assert host.received == []
    planned = copy.deepcopy(meta)
    planned.extra_info[MICRO_BATCH_INDICES] = [[[0, 2], [2, 3]]]
    planned.extra_info[MICRO_BATCH_LENGTHS] = [[8, 4]]
    host.train_presharded(planned, lambda d: 0.0)
    (_, data), = host.received
    assert data.micro_batch_indices == [[[0, 2], [2, 3]]] and data.micro_batch_lengths == [[8, 4]]


def test_split_training_api(split_store: _SplitStore) -> None:
    meta = _seed(split_store.seed)
    host = _Host({"tensor_parallel": 1})
    host.dp_client = split_store
    loss_fn = object()
    with pytest.raises(RuntimeError, match="without an active step"):
        host.train_microbatch_presharded(meta)
    with pytest.raises(RuntimeError, match="without an active step"):
        host.finish_train_step_presharded()
    host.abort_train_step_presharded()  # no step: nothing to abort
    assert host.split_calls == []

    host.begin_train_step_presharded(loss_fn, gbs=3, mbs=2)
    with pytest.raises(RuntimeError, match="already active"):
        host.begin_train_step_presharded(loss_fn)
    host.train_microbatch_presharded(meta)
    result = host.finish_train_step_presharded()
    assert result == {"loss": 1.5, "is_replica_leader": False}  # from the coords, not the host
    assert [c[0] for c in host.split_calls] == ["begin", "microbatch", "finish"]
    assert host.split_calls[0] == ("begin", loss_fn, 2)
    assert torch.equal(host.split_calls[1][1]["input_ids"], _expected_ids())

    host.begin_train_step_presharded(loss_fn)  # finish ended the step
    host.abort_train_step_presharded()
    host.abort_train_step_presharded()  # idempotent
    assert [c[0] for c in host.split_calls[3:]] == ["begin", "abort"]
    host.begin_train_step_presharded(loss_fn)  # abort ended the step
    assert host.split_calls[-1][0] == "begin"


def test_failed_finish_keeps_the_step_for_abort(split_store: _SplitStore) -> None:
    class _FailingFinish(_Host):
        def finish_train_step(self) -> dict:
            raise RuntimeError("optimizer exploded")

    host = _FailingFinish({})
    host.dp_client = split_store
    host.begin_train_step_presharded(object())
    with pytest.raises(RuntimeError, match="optimizer exploded"):
        host.finish_train_step_presharded()
    host.abort_train_step_presharded()
    assert host.split_calls[-1] == ("abort",)


# --- the reference's keyword and attribute names ----------------------------------------------


def test_write_back_accepts_tq_field_and_the_client_under_dp_client_underscore(wb_host: Any) -> None:
    host, client, meta = wb_host
    other = _Host({})
    other._dp_client = client  # the same attribute as dp_client, under its other name
    assert other.dp_client is client and other._require_dp_client() is client
    value = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    other._write_back_result_field(meta, {"logprobs": value}, result_key="logprobs", tq_field=PREV_LOGPROBS)
    assert torch.equal(_read_back(client, meta, PREV_LOGPROBS), torch.tensor([[1.0, 0.0], [3.0, 4.0]]))
    with pytest.raises(TypeError, match="two different fields"):
        host._write_back_result_field(meta, {"logprobs": value}, result_key="logprobs", tq_field="a", field="b")
    with pytest.raises(TypeError, match="tq_field="):
        host._write_back_result_field(meta, {"logprobs": value}, result_key="logprobs")


def test_entrypoints_write_back_through_a_host_override_taking_tq_field(split_store: _SplitStore) -> None:
    class _Recording(_Host):
        def _write_back_result_field(self, meta: KVBatchMeta, result: Any, *, result_key: str, tq_field: str) -> None:
            self.written = (result_key, tq_field, meta.size)

    host = _Recording({})
    host._dp_client = split_store
    meta = _seed(split_store.seed)
    host.get_logprobs_presharded(meta)
    assert host.written == ("logprobs", PREV_LOGPROBS, 3)
