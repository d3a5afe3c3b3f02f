"""TQDriverMixin and the placed-microbatch pad target.

The host class below is a minimal driver façade defined for these tests: it provides only the
two attributes the mixin reads (``cfg``, ``dp_client``), isolating the mixin from ``TQPolicy``
and its worker group.  Reads and writes go through the real Local adapter.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from nemo_dp.data_plane.adapters.local import LocalDataPlaneClient
from nemo_dp.data_plane.column_io import first_write
from nemo_dp.data_plane.driver_mixin import (
    TQDriverMixin,
    isolated_copy,
    placed_pad_target,
    stamp_placed_metas,
)
from nemo_dp.data_plane.interfaces import KVBatchMeta, LocalDataPlaneConfig
from nemo_dp.data_plane.schema import (
    GLOBAL_FORWARD_PAD_SEQLEN,
    LOCAL_PARTITION_GENERATION,
    MICRO_BATCH_INDICES,
    PAD_TO_MULTIPLE,
)
from nemo_dp.distributed.batched_data_dict import BatchedDataDict

KEY = GLOBAL_FORWARD_PAD_SEQLEN


def _cfg(
    *,
    db: bool = False,
    seq_round: int = 64,
    sp: bool = False,
    train_tokens: int = 4096,
    lp_tokens: int = 8192,
) -> dict[str, Any]:
    return {
        "dynamic_batching": {
            "enabled": db,
            "train_mb_tokens": train_tokens,
            "logprob_mb_tokens": lp_tokens,
            "sequence_length_round": seq_round,
        },
        "sequence_packing": {
            "enabled": sp,
            "train_mb_tokens": train_tokens + 1,
            "logprob_mb_tokens": lp_tokens + 1,
            "algorithm": "first_fit_decreasing",
            "sequence_length_pad_multiple": 16,
            "microbatch_order": "largest_first",
        },
    }


class _Driver(TQDriverMixin):
    """Minimal driver host: just ``cfg`` and ``dp_client`` (isolates the mixin from TQPolicy)."""

    def __init__(self, cfg: Any, dp_client: Any = None) -> None:
        self.cfg = cfg
        self.dp_client = dp_client


def _meta(lengths: list[int], **extra: Any) -> KVBatchMeta:
    n = len(lengths)
    return KVBatchMeta(
        "train",
        "train",
        [f"s{i}" for i in range(n)],
        fields=["input_ids", "token_mask"],
        sequence_lengths=list(lengths),
        extra_info=dict(extra),
        tags=[{"std": float(i), "nested": [i]} for i in range(n)],
    )


def _containers(m: KVBatchMeta) -> list[object]:
    out: list[object] = [m.sample_ids, m.extra_info]
    for c in (m.fields, m.sequence_lengths, m.tags):
        if c is not None:
            out.append(c)
    if m.tags is not None:
        out.extend(m.tags)
        out.extend(t["nested"] for t in m.tags if "nested" in t)
    return out


def _shares_container(a: KVBatchMeta, b: KVBatchMeta) -> bool:
    ids = {id(c) for c in _containers(a)}
    return any(id(c) in ids for c in _containers(b))


# --- _packing_args -----------------------------------------------------------------------------


def test_packing_args_rejects_unknown_budget_key() -> None:
    with pytest.raises(ValueError, match="mb_tokens_key"):
        _Driver(_cfg(db=True))._packing_args("generation_mb_tokens")


def test_packing_args_disabled_returns_none_pair() -> None:
    assert _Driver(_cfg())._packing_args("train_mb_tokens") == (None, None)


@pytest.mark.parametrize(("key", "tokens"), [("train_mb_tokens", 4096), ("logprob_mb_tokens", 8192)])
def test_packing_args_dynamic_batching(key: str, tokens: int) -> None:
    spa, dba = _Driver(_cfg(db=True, seq_round=64))._packing_args(key)
    assert spa is None
    assert dba == {
        "max_tokens_per_microbatch": tokens,
        "sequence_length_round": 64,
        "input_key": "input_ids",
        "input_lengths_key": "input_lengths",
    }


def test_packing_args_dynamic_batching_wins_over_packing() -> None:
    spa, dba = _Driver(_cfg(db=True, sp=True))._packing_args("train_mb_tokens")
    assert spa is None and dba is not None


@pytest.mark.parametrize(("key", "tokens"), [("train_mb_tokens", 4097), ("logprob_mb_tokens", 8193)])
def test_packing_args_sequence_packing(key: str, tokens: int) -> None:
    spa, dba = _Driver(_cfg(sp=True))._packing_args(key)
    assert dba is None
    assert spa == {
        "max_tokens_per_microbatch": tokens,
        "algorithm": "first_fit_decreasing",
        "sequence_length_pad_multiple": 16,
        "input_key": "input_ids",
        "input_lengths_key": "input_lengths",
        "microbatch_order": "largest_first",
    }


def test_packing_args_accepts_attribute_and_omegaconf_configs() -> None:
    raw = _cfg(db=True, seq_round=32)
    attr = SimpleNamespace(
        dynamic_batching=SimpleNamespace(**raw["dynamic_batching"]),
        sequence_packing=SimpleNamespace(**raw["sequence_packing"]),
    )
    expected = _Driver(raw)._packing_args("logprob_mb_tokens")
    assert _Driver(attr)._packing_args("logprob_mb_tokens") == expected
    assert _Driver(OmegaConf.create(raw))._packing_args("logprob_mb_tokens") == expected


def test_packing_args_returns_fresh_dicts() -> None:
    driver = _Driver(_cfg(db=True))
    _, first = driver._packing_args("train_mb_tokens")
    assert first is not None
    first["max_tokens_per_microbatch"] = 1
    _, second = driver._packing_args("train_mb_tokens")
    assert second is not None and second["max_tokens_per_microbatch"] == 4096


def test_packing_args_missing_key_names_its_path() -> None:
    cfg = _cfg(db=True)
    del cfg["dynamic_batching"]["sequence_length_round"]
    with pytest.raises(KeyError, match=r"cfg\.dynamic_batching\.sequence_length_round"):
        _Driver(cfg)._packing_args("train_mb_tokens")
    with pytest.raises(KeyError, match=r"cfg\.sequence_packing\.algorithm"):
        _Driver({"sequence_packing": {"enabled": True, "train_mb_tokens": 8}})._packing_args("train_mb_tokens")


# --- _stamp_pad_seqlen (I 65) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("db", "seq_round", "pad_to_multiple", "expected"),
    [
        (True, 64, None, 1216),  # round_up(1208, 64)
        (True, 64, 8, 1216),  # lcm(8, 64) = 64
        (True, 4, 3, 1212),  # lcm(3, 4) = 12: 1212 = 101 * 12 (max(3, 4) would give 1208)
        (False, 64, None, 1208),  # no dynamic batching: seq_round = 1
        (False, 64, 16, 1216),  # pad_to_multiple alone
    ],
)
def test_stamp_pad_seqlen_uses_lcm_of_multiple_and_round(
    db: bool, seq_round: int, pad_to_multiple: int | None, expected: int
) -> None:
    extra = {PAD_TO_MULTIPLE: pad_to_multiple} if pad_to_multiple is not None else {}
    meta = _meta([5, 1208, 30], **extra)
    _Driver(_cfg(db=db, seq_round=seq_round))._stamp_pad_seqlen(meta)
    assert meta.extra_info[KEY] == expected


def test_stamp_pad_seqlen_with_sequence_packing_uses_round_one() -> None:
    meta = _meta([5, 1208])
    _Driver(_cfg(sp=True, seq_round=64))._stamp_pad_seqlen(meta)
    assert meta.extra_info[KEY] == 1208


def test_stamp_pad_seqlen_is_idempotent() -> None:
    driver = _Driver(_cfg(db=True, seq_round=64))
    meta = _meta([100, 200])
    driver._stamp_pad_seqlen(meta)
    assert meta.extra_info[KEY] == 256
    meta.sequence_lengths = [100, 900]
    driver._stamp_pad_seqlen(meta)
    assert meta.extra_info[KEY] == 256
    preset = _meta([100, 200], **{KEY: 7})
    driver._stamp_pad_seqlen(preset)
    assert preset.extra_info[KEY] == 7


def test_stamp_pad_seqlen_without_lengths_is_a_noop() -> None:
    meta = KVBatchMeta("train", "train", ["a", "b"], extra_info={"k": 1})
    _Driver(_cfg(db=True))._stamp_pad_seqlen(meta)
    assert meta.extra_info == {"k": 1}
    empty = KVBatchMeta("train", "train", [], sequence_lengths=[])
    _Driver(_cfg(db=True))._stamp_pad_seqlen(empty)
    assert KEY not in empty.extra_info


# --- _isolated_meta (I 65) ----------------------------------------------------------------------


def test_isolated_meta_drops_inherited_target_and_stamps_fresh_one() -> None:
    caller = _meta([10, 1208, 40], **{KEY: 9999, PAD_TO_MULTIPLE: 8, "rollout_metrics": {"x": 1}})
    before = copy.deepcopy(caller)
    driver = _Driver(_cfg(db=True, seq_round=64))
    out = driver._isolated_meta(caller, fields=["input_ids"], task_name="prev_lp")
    assert out.extra_info[KEY] == 1216
    assert out.fields == ["input_ids"] and out.task_name == "prev_lp"
    assert out.sample_ids == caller.sample_ids
    assert out.sequence_lengths == caller.sequence_lengths
    assert out.tags == caller.tags
    assert out.extra_info[PAD_TO_MULTIPLE] == 8
    assert out.extra_info["rollout_metrics"] is caller.extra_info["rollout_metrics"]  # shallow
    assert caller == before  # the caller's meta is untouched
    assert not _shares_container(caller, out)
    out.stamp_tags({"std": [0.0, 0.0, 0.0]})
    out.extra_info["extra"] = 1
    assert caller == before


def test_isolated_meta_for_a_dispatch_can_leave_the_tags_out() -> None:
    caller = _meta([10, 20, 30])
    caller.stamp_tags({"std": [0.5, 0.0, 1.0]})
    before = copy.deepcopy(caller)
    driver = _Driver(_cfg(db=True, seq_round=64))
    out = driver._isolated_meta(caller, fields=["input_ids"], task_name="train", keep_tags=False)
    assert out.tags is None
    assert out.extra_info[KEY] == 64 and out.sample_ids == caller.sample_ids
    assert caller == before
    assert isolated_copy(caller, fields=None, task_name=None, keep_tags=False).tags is None


def test_isolated_meta_of_a_concat_mints_a_target_for_the_whole_batch() -> None:
    driver = _Driver(_cfg(db=True, seq_round=64))
    short = _meta([10, 20])
    driver._stamp_pad_seqlen(short)
    assert short.extra_info[KEY] == 64
    merged = short.concat(_meta([500, 30]))
    assert merged.extra_info[KEY] == 64  # concat inherits the first meta's extra_info
    assert driver._isolated_meta(merged, fields=None, task_name="train").extra_info[KEY] == 512


def test_two_dispatches_with_different_rounding_get_different_targets() -> None:
    caller = _meta([300, 1208, 17])
    before = copy.deepcopy(caller)
    policy = _Driver(_cfg(db=True, seq_round=64))
    critic = _Driver(_cfg(db=True, seq_round=128))
    for _epoch in range(2):  # ppo_epochs > 1: the caller's meta never carries a target
        p = policy._isolated_meta(caller, fields=["input_ids"], task_name="prev_lp")
        c = critic._isolated_meta(caller, fields=["input_ids"], task_name="values")
        assert p.extra_info[KEY] == 1216
        assert c.extra_info[KEY] == 1280
        assert caller == before
    # A target left on a re-used dispatch meta does not leak into the next dispatcher either.
    assert critic._isolated_meta(p, fields=None, task_name="values").extra_info[KEY] == 1280


# --- placed microbatches -----------------------------------------------------------------


def test_placed_pad_target_four_rank_example() -> None:
    maxima = [1208, 1320, 944, 1080]
    metas = [_meta([m - 100, m, 7]) for m in maxima]
    assert placed_pad_target(metas, seq_round=64) == 1344
    # Padding each rank to its own maximum would have given different widths:
    assert [placed_pad_target([m], seq_round=64) for m in metas] == [1216, 1344, 960, 1088]


def test_placed_pad_target_ignores_inherited_targets() -> None:
    metas = [_meta([1208], **{KEY: 4096}), _meta([1320], **{KEY: 2000})]
    assert placed_pad_target(metas, seq_round=64) == 1344


def test_placed_pad_target_uses_lcm_of_max_multiple_and_round() -> None:
    metas = [_meta([1321], **{PAD_TO_MULTIPLE: 2}), _meta([10], **{PAD_TO_MULTIPLE: 8})]
    assert placed_pad_target(metas) == 1328  # max multiple 8
    metas = [_meta([1208], **{PAD_TO_MULTIPLE: 3}), _meta([10])]
    assert placed_pad_target(metas, seq_round=4) == 1212  # lcm(3, 4) = 12


def test_placed_pad_target_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="no metas"):
        placed_pad_target([])
    with pytest.raises(ValueError, match="meta 1 .*no sequence_lengths"):
        placed_pad_target([_meta([3]), KVBatchMeta("train", "train", ["x"])])
    with pytest.raises(ValueError, match="no rows"):
        placed_pad_target([KVBatchMeta("p", "train", [], sequence_lengths=[])])
    with pytest.raises(ValueError, match="seq_round"):
        placed_pad_target([_meta([3])], seq_round=0)


def test_stamp_placed_metas_returns_new_stamped_metas() -> None:
    inputs = [
        _meta([1208, 5], **{KEY: 4096, LOCAL_PARTITION_GENERATION: 3, MICRO_BATCH_INDICES: [[[0, 2]]]}),
        _meta([1320]),
        _meta([944]),
        _meta([1080]),
    ]
    before = copy.deepcopy(inputs)
    out = stamp_placed_metas(inputs, seq_round=64)
    assert [m.extra_info[KEY] for m in out] == [1344] * 4
    assert inputs == before
    for src, dst in zip(inputs, out):
        assert not _shares_container(src, dst)
        assert dst.sample_ids == src.sample_ids and dst.fields == src.fields
        assert dst.task_name == src.task_name and dst.tags == src.tags
    assert out[0].extra_info[LOCAL_PARTITION_GENERATION] == 3
    assert out[0].extra_info[MICRO_BATCH_INDICES] == [[[0, 2]]]


def test_placed_metas_uses_the_hosts_rounding() -> None:
    metas = [_meta([1208]), _meta([1320])]
    assert [m.extra_info[KEY] for m in _Driver(_cfg(db=True, seq_round=64))._placed_metas(metas)] == [1344] * 2
    assert [m.extra_info[KEY] for m in _Driver(_cfg())._placed_metas(metas)] == [1320] * 2


def test_isolated_copy_does_not_stamp() -> None:
    out = isolated_copy(_meta([5], **{KEY: 64}), fields=["a"], task_name="t")
    assert KEY not in out.extra_info and out.fields == ["a"] and out.task_name == "t"


# --- read_from_dataplane / write_to_dataplane (real Local adapter) ------------------------------


def _local_batch(client: LocalDataPlaneClient, pid: str) -> KVBatchMeta:
    lengths = torch.tensor([3, 5], dtype=torch.int32)
    ids = torch.tensor([[1, 2, 3, 0, 0, 0], [4, 5, 6, 7, 8, 0]], dtype=torch.int64)
    client.register_partition(
        pid,
        fields=["input_ids", "input_lengths", "sample_mask", "content"],
        num_samples=2,
        consumer_tasks=["train"],
    )
    content = np.empty(2, dtype=object)
    content[0], content[1] = "a", {"b": 1}
    batch = {
        "input_ids": ids,
        "input_lengths": lengths,
        "sample_mask": torch.ones(2),
        "content": content,
    }
    return first_write(
        batch, sample_ids=[f"{pid}_r0", f"{pid}_r1"], dp_client=client, partition_id=pid, task_name="train"
    )


def test_read_from_dataplane_pads_to_a_fresh_target_and_leaves_meta_untouched() -> None:
    client = LocalDataPlaneClient(LocalDataPlaneConfig(max_partitions=2))
    try:
        meta = _local_batch(client, "rd")
        before = copy.deepcopy(meta)
        driver = _Driver(_cfg(db=True, seq_round=4), client)
        data = driver.read_from_dataplane(
            meta, select_fields=["input_ids", "content"], pad_value_dict={"input_ids": 99}
        )
        assert isinstance(data, BatchedDataDict)
        assert list(data.keys()) == ["input_ids", "content"]
        assert data["input_ids"].shape == (2, 8)  # round_up(5, 4) = 8
        assert data["input_ids"].tolist() == [[1, 2, 3, 99, 99, 99, 99, 99], [4, 5, 6, 7, 8, 99, 99, 99]]
        assert list(data["content"]) == ["a", {"b": 1}]
        assert meta == before and KEY not in meta.extra_info
    finally:
        client.close()


def test_read_from_dataplane_pads_to_the_target_stamped_on_the_meta() -> None:
    """Issue 10 item 5: as in the reference, a stamped target is the read width."""
    client = LocalDataPlaneClient(LocalDataPlaneConfig(max_partitions=2))
    try:
        meta = _local_batch(client, "rs")
        meta.extra_info[KEY] = 12  # the width the workers padded to
        before = copy.deepcopy(meta)
        driver = _Driver(_cfg(db=True, seq_round=4), client)
        data = driver.read_from_dataplane(meta, select_fields=["input_ids"], pad_value_dict={"input_ids": 99})
        assert data["input_ids"].shape == (2, 12)  # not a fresh round_up(5, 4) = 8
        assert data["input_ids"][1].tolist() == [4, 5, 6, 7, 8] + [99] * 7
        assert meta == before
        for bad in (-1, "12", 1.5, True):
            meta.extra_info[KEY] = bad
            with pytest.raises(ValueError, match=KEY):
                driver.read_from_dataplane(meta, select_fields=["input_ids"])
    finally:
        client.close()


class _FlagDriver(_Driver):
    """A host carrying the reference's ``use_dynamic_batches`` / ``use_sequence_packing``."""

    def __init__(self, cfg: Any, *, use_dynamic_batches: bool, use_sequence_packing: bool) -> None:
        super().__init__(cfg)
        self.use_dynamic_batches = use_dynamic_batches
        self.use_sequence_packing = use_sequence_packing


def test_packing_args_follow_the_hosts_use_flags() -> None:
    """Issue 10 item 5: the host's flags decide; packing off needs no sequence_packing block."""
    # the flags override the config's enabled switches, both ways
    on = _FlagDriver(_cfg(db=False, sp=False), use_dynamic_batches=True, use_sequence_packing=False)
    spa, dba = on._packing_args("logprob_mb_tokens")
    assert spa is None and dba is not None and dba["max_tokens_per_microbatch"] == 8192
    off = _FlagDriver(_cfg(db=True, sp=True), use_dynamic_batches=False, use_sequence_packing=False)
    assert off._packing_args("train_mb_tokens") == (None, None)
    assert off._seq_round() == 1
    packing = _FlagDriver(_cfg(db=True, sp=False), use_dynamic_batches=False, use_sequence_packing=True)
    spa, dba = packing._packing_args("train_mb_tokens")
    assert dba is None and spa is not None and spa["max_tokens_per_microbatch"] == 4097
    # a config without a sequence_packing block is fine while packing is off
    db_only = {"dynamic_batching": _cfg()["dynamic_batching"]}
    assert _FlagDriver(db_only, use_dynamic_batches=False, use_sequence_packing=False)._packing_args("train_mb_tokens") == (None, None)
    assert _Driver(db_only)._packing_args("train_mb_tokens") == (None, None)
    assert _Driver({})._packing_args("logprob_mb_tokens") == (None, None)


def test_write_to_dataplane_lands_columns() -> None:
    # The Local adapter accepts one put per partition, so the written column goes to a fresh
    # partition registered for it (TransferQueue would upsert it next to the seed columns).
    client = LocalDataPlaneClient(LocalDataPlaneConfig(max_partitions=2))
    try:
        client.register_partition("wr", fields=["advantages"], num_samples=2, consumer_tasks=[])
        meta = KVBatchMeta("wr", "train", ["a", "b"], sequence_lengths=[2, 4])
        driver = _Driver(_cfg(), client)
        adv = torch.arange(12, dtype=torch.float32).reshape(2, 6)
        driver.write_to_dataplane(meta, BatchedDataDict({"advantages": adv}))
        got = client.get_samples(["a", "b"], "wr", ["advantages"])["advantages"]
        rows = got.unbind()
        assert rows[0].tolist() == [0.0, 1.0] and rows[1].tolist() == [6.0, 7.0, 8.0, 9.0]
        with pytest.raises(ValueError, match="batch size"):
            driver.write_to_dataplane(meta, {"advantages": torch.zeros(3, 6)})
    finally:
        client.close()


# --- worker store metrics ---------------------------------------------------------------------


class _RankDriver(_Driver):
    """A driver whose ``_dispatch_all`` answers with canned per-rank windows.

    It isolates the aggregation of the workers' store windows from a Ray worker group; the
    windows have the shape ``MetricsDataPlaneClient.get_step_metrics`` returns.
    """

    def __init__(self, windows: list[dict[str, float]]) -> None:
        super().__init__(_cfg())
        self.windows = windows
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def _dispatch_all(self, method: str, *args: Any) -> list[dict[str, float]]:
        self.calls.append((method, args))
        return [dict(w) for w in self.windows]


def _window(wall_ms: float, get_calls: float, put_rows: float) -> dict[str, float]:
    return {
        "step/wall_ms": wall_ms,
        "step/bytes_written_mb": 1.0,
        "step/bytes_read_mb": 2.0,
        "step/frac_of_step": 0.1,
        "now/bytes_outstanding_mb": 0.0,
        "step/get_data/calls": get_calls,
        "step/get_data/rows": 8.0,
        "step/get_data/mb": 2.0,
        "step/get_data/wall_ms": wall_ms - 1.0,
        "step/get_data/mean_ms": 1.0,
        "step/put/calls": 1.0,
        "step/put/rows": put_rows,
        "step/put/mb": 1.0,
        "step/put/wall_ms": 1.0,
    }


def test_worker_store_metrics_sum_ranks_and_break_down_the_slowest() -> None:
    driver = _RankDriver([_window(10.0, 2.0, 4.0), _window(30.0, 3.0, 6.0)])
    out = driver._worker_store_metrics(0.5, "data_plane/workers")
    assert driver.calls == [("data_plane_step_metrics", (0.5,))]
    assert out["data_plane/workers/step/wall_ms"] == 40.0
    assert out["data_plane/workers/step/bytes_read_mb"] == 4.0
    assert out["data_plane/workers/step/max_rank_wall_ms"] == 30.0
    assert out["data_plane/workers/max_rank/rank"] == 1.0
    breakdown = {k: v for k, v in out.items() if "/max_rank/" in k and not k.endswith("/rank")}
    assert breakdown == {
        "data_plane/workers/max_rank/get_data/calls": 3.0,
        "data_plane/workers/max_rank/get_data/rows": 8.0,
        "data_plane/workers/max_rank/get_data/mb": 2.0,
        "data_plane/workers/max_rank/get_data/wall_ms": 29.0,
        "data_plane/workers/max_rank/put/calls": 1.0,
        "data_plane/workers/max_rank/put/rows": 6.0,
        "data_plane/workers/max_rank/put/mb": 1.0,
        "data_plane/workers/max_rank/put/wall_ms": 1.0,
    }


def test_worker_store_metrics_are_empty_without_worker_counters() -> None:
    assert _RankDriver([{}, {}])._worker_store_metrics(1.0, "data_plane/workers") == {}
