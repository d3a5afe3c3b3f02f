"""Pad-target isolation of PPO's model dispatches (each dispatch gets its own pad target).

In a PPO step the policy and the critic dispatch the same rows - log-probs, reference
log-probs, values, then policy and critic training once per epoch on a fresh shuffle.  Each
dispatch must carry its *own* freshly minted ``global_forward_pad_seqlen`` computed with its
model's rounding; a target stamped once on the shared meta would leak from the policy into the
critic and across epochs.

What is isolated here (no Ray, no model run for the dispatch-recording part): ``TQPolicy`` and
``TQValue`` are the real classes, built without their worker groups (``object.__new__`` plus the
attributes their dispatch methods read); their ``_dispatch_sharded`` - the one call that would
reach the Ray actors - is replaced by a recorder.  Everything between the trainer's call and
that point (isolation, pad target, planner, sharding) is the production code.  The critic is
given a different dynamic-batching rounding (8) from the policy (4) so that a leak is
observable.  The second test shows what breaks if the critic reused the policy's target: a real
``TQValueWorker`` (tiny model, in-process, world size 1) fetching from a real Local store
fails, while the isolated dispatch computes the same values as the in-memory path.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from nemo_dp.algorithms.ppo_common import epoch_permutation
from nemo_dp.data_plane.adapters.local import LocalDataPlaneClient
from nemo_dp.data_plane.column_io import first_write, round_up
from nemo_dp.data_plane.driver_mixin import shard_meta_for_dp
from nemo_dp.data_plane.interfaces import KVBatchMeta, LocalDataPlaneConfig
from nemo_dp.data_plane.schema import (
    DP_TRAIN_FIELDS,
    DP_VALUE_TRAIN_FIELDS,
    GLOBAL_FORWARD_PAD_SEQLEN,
    VALUE_SEED_FIELDS,
)
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.models.policy.tq_policy import TQPolicy
from nemo_dp.models.value.tq_value import TASK_VALUE_TRAIN, TASK_VALUES, TQValue, TQValueWorker
from tests.unit.test_value_worker import tiny_worker_cfg

LENGTHS = [9, 5, 7, 3, 8, 6, 9, 4]
POLICY_ROUND, CRITIC_ROUND = 4, 8
POLICY_TARGET = round_up(max(LENGTHS), POLICY_ROUND)  # 12
CRITIC_TARGET = round_up(max(LENGTHS), CRITIC_ROUND)  # 16
VOCAB = 24


def _cfg(seq_round: int) -> Any:
    return OmegaConf.create(
        tiny_worker_cfg(
            dp_size=2, max_seq_len=16, lr=1e-3, logprob_batch_size=4,
            dynamic_batching={
                "enabled": True, "train_mb_tokens": 32, "logprob_mb_tokens": 32,
                "sequence_length_round": seq_round,
            },
            sequence_packing={
                "enabled": False, "train_mb_tokens": 32, "logprob_mb_tokens": 32,
                "algorithm": "modified_first_fit_decreasing", "sequence_length_pad_multiple": 1,
                "microbatch_order": "packer",
            },
        )
    )


def _recording(cls: type, seq_round: int, log: list[tuple[str, str, list[KVBatchMeta]]], who: str) -> Any:
    host = object.__new__(cls)
    host.cfg = _cfg(seq_round)
    host.dp_size = 2
    host.name_prefix = who
    host.dp_client = None  # never reached: dispatches are recorded, not sent

    def record(method: str, shards: list[KVBatchMeta], **kwargs: Any) -> list[Any]:
        log.append((who, method, list(shards)))
        return [{"per_step": [{"loss": 0.0, "grad_norm": 0.0, "lr": 0.0}]} for _ in shards]

    host._dispatch_sharded = record
    return host


def _step_meta() -> KVBatchMeta:
    return KVBatchMeta(
        partition_id="train",
        task_name="train",
        sample_ids=[f"s1_p{i}_g0" for i in range(len(LENGTHS))],
        fields=list(DP_TRAIN_FIELDS),
        sequence_lengths=list(LENGTHS),
        # A stale target, as a concat-ed dynamic-sampling meta or an earlier dispatch could
        # leave behind: no dispatch may inherit it.
        extra_info={GLOBAL_FORWARD_PAD_SEQLEN: 5},
    )


def test_every_dispatch_mints_its_own_target_across_ppo_epochs() -> None:
    log: list[tuple[str, str, list[KVBatchMeta]]] = []
    policy = _recording(TQPolicy, POLICY_ROUND, log, "policy")
    value = _recording(TQValue, CRITIC_ROUND, log, "value")
    meta = _step_meta()
    before = dataclasses.asdict(meta)

    # The dispatch sequence of one ppo_train_sync step with ppo_epochs=3.
    policy.get_logprobs_from_meta(meta)
    policy.get_reference_policy_logprobs_from_meta(meta)
    value.get_values_from_meta(meta)
    for epoch in range(3):
        epoch_meta = meta.subset(epoch_permutation(7, 1, epoch, meta.size))
        policy.train_from_meta(epoch_meta, loss_fn=None)
        value.train_from_meta(epoch_meta, loss_fn=None)

    assert dataclasses.asdict(meta) == before  # the caller's meta is never touched
    assert [(who, m) for who, m, _ in log] == [
        ("policy", "get_logprobs_presharded"),
        ("policy", "get_reference_policy_logprobs_presharded"),
        ("value", "get_values_presharded"),
    ] + [("policy", "train_presharded"), ("value", "train_presharded")] * 3
    seen_extra: list[int] = []
    for who, method, shards in log:
        targets = {s.extra_info[GLOBAL_FORWARD_PAD_SEQLEN] for s in shards}
        expected = CRITIC_TARGET if who == "value" else POLICY_TARGET
        assert targets == {expected}, f"{who}.{method} dispatched targets {targets}"
        for s in shards:
            assert id(s.extra_info) not in seen_extra  # no dict shared between dispatches
            seen_extra.append(id(s.extra_info))
            # Each shard's plan was made for that model's rounding (padded lengths fit the target).
            lengths = [x for mb in s.extra_info["micro_batch_lengths"] for x in mb]
            assert all(x % (CRITIC_ROUND if who == "value" else POLICY_ROUND) == 0 for x in lengths)
            assert max(lengths) <= expected
    value_dispatches = [shards for who, _, shards in log if who == "value"]
    assert [s.task_name for s in value_dispatches[0]] == [TASK_VALUES, TASK_VALUES]
    assert {s.task_name for d in value_dispatches[1:] for s in d} == {TASK_VALUE_TRAIN}
    assert {tuple(s.fields) for s in value_dispatches[0]} == {tuple(VALUE_SEED_FIELDS)}
    assert {tuple(s.fields) for d in value_dispatches[1:] for s in d} == {tuple(DP_VALUE_TRAIN_FIELDS)}
    # A fresh shuffle per epoch: the critic trains on a different row order each epoch.
    orders = [tuple(i for s in d for i in s.sample_ids) for d in value_dispatches[1:]]
    assert len(set(orders)) == 3


def _local_store_with_rows() -> tuple[LocalDataPlaneClient, KVBatchMeta, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    n, width = len(LENGTHS), max(LENGTHS)
    ids = torch.randint(3, VOCAB, (n, width), generator=gen)
    lengths = torch.tensor(LENGTHS, dtype=torch.int32)
    valid = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1).long()
    ids = torch.where(valid, ids, torch.zeros_like(ids))
    token_mask = (valid & (torch.arange(width).unsqueeze(0) >= 2)).to(torch.int32)
    client = LocalDataPlaneClient(LocalDataPlaneConfig())
    client.register_partition("train", fields=list(VALUE_SEED_FIELDS), num_samples=n, consumer_tasks=["train"])
    meta = first_write(
        {"input_ids": ids, "input_lengths": lengths, "token_mask": token_mask,
         "sample_mask": torch.ones(n, dtype=torch.float32)},
        sample_ids=[f"r{i}" for i in range(n)],
        dp_client=client,
        partition_id="train",
        task_name="train",
    )
    return client, meta, ids


@pytest.mark.timeout(60)
def test_critic_reusing_the_policy_target_breaks_its_forward() -> None:
    log: list[tuple[str, str, list[KVBatchMeta]]] = []
    policy = _recording(TQPolicy, POLICY_ROUND, log, "policy")
    value = _recording(TQValue, CRITIC_ROUND, log, "value")
    client, meta, ids = _local_store_with_rows()
    critic_cfg = OmegaConf.to_container(_cfg(CRITIC_ROUND), resolve=True)
    worker = TQValueWorker(
        rank=0, world_size=1, policy_cfg=critic_cfg, vocab_size=VOCAB, pad_id=0, eos_id=2, seed=5
    )
    worker.dp_client = client
    _, dba = value._packing_args("logprob_mb_tokens")

    # What an idempotent stamp on the shared meta would do: the policy dispatches first and
    # stamps its target; the critic's narrowed view (dataclasses.replace shares extra_info)
    # finds a target already present and keeps it.
    shared = dataclasses.replace(meta, extra_info=dict(meta.extra_info))
    policy._stamp_pad_seqlen(shared)
    leaked = dataclasses.replace(shared, fields=list(VALUE_SEED_FIELDS), task_name=TASK_VALUES)
    value._stamp_pad_seqlen(leaked)
    assert leaked.extra_info[GLOBAL_FORWARD_PAD_SEQLEN] == POLICY_TARGET != CRITIC_TARGET
    (bad_shard,), _ = shard_meta_for_dp(leaked, dp_world=1, dynamic_batching_args=dba)
    # The critic's planner padded microbatches to multiples of 8 (16 columns for the longest
    # rows) but the rows were materialised only 12 wide: the forward cannot line them up.
    assert max(x for mb in bad_shard.extra_info["micro_batch_lengths"] for x in mb) == CRITIC_TARGET
    fetched = worker._fetch_planned(bad_shard)
    assert fetched["input_ids"].shape[1] == POLICY_TARGET
    with pytest.raises(RuntimeError, match="size of tensor"):
        worker.get_values(fetched)

    # The isolated dispatch (what TQValue does) mints 16 and computes exactly the in-memory values.
    isolated = value._isolated_meta(shared, fields=VALUE_SEED_FIELDS, task_name=TASK_VALUES)
    assert isolated.extra_info[GLOBAL_FORWARD_PAD_SEQLEN] == CRITIC_TARGET
    assert shared.extra_info[GLOBAL_FORWARD_PAD_SEQLEN] == POLICY_TARGET  # source untouched
    (good_shard,), order = shard_meta_for_dp(isolated, dp_world=1, dynamic_batching_args=dba)
    got = worker.get_values(worker._fetch_planned(good_shard))["values"]
    assert got.shape == (len(LENGTHS), CRITIC_TARGET)
    row_of = {sid: i for i, sid in enumerate(meta.sample_ids)}
    plain = BatchedDataDict(
        {"input_ids": ids, "input_lengths": torch.tensor(LENGTHS, dtype=torch.int32)}
    )
    want = worker.get_values(plain, micro_batch_size=len(LENGTHS))["values"]
    for pos, sid in enumerate(good_shard.sample_ids):
        i = row_of[sid]
        n = LENGTHS[i]
        torch.testing.assert_close(got[pos, :n], want[i, :n], rtol=1e-5, atol=1e-6)
        assert bool((got[pos, n:] == 0).all())
    assert log == []  # nothing was dispatched to workers in this test
