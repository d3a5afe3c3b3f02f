"""The SFT data-plane step with in-process workers and Local stores.

What is real: ``sft_sync_step`` (the trainer's step), ``ColocatedLoaderGroup`` and
``ColocatedLoaderMixin`` (loading into real ``LocalDataPlaneClient`` stores), ``TQWorkerMixin``'s
split training entrypoints and fetch (generation-checked ``get_data`` + ``materialize_local``),
and ``TQPolicy``'s split API (placed-meta checks, one fresh global pad target, dispatch).

What is fake (and why): the worker *group* is an in-process list instead of Ray actors (no Ray
in unit tests), the ``TQPolicy`` object is created without its constructor (which would start
Ray workers) and gets only the attributes its split API reads, and the workers' compute host
(``_FakeTrainHost``) records what it was given and returns simple additive metrics instead of
running a model - this file isolates the driver/loader/store choreography, not the math (the
math is covered by tests/e2e/test_sft_parity.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from nemo_dp.algorithms.sft_sync import sft_sync_step
from nemo_dp.data.datasets import EpochLoader, SFTDataset
from nemo_dp.models.tiny.tokenizer import CharTokenizer
from nemo_dp.data_plane.adapters.local import LocalDataPlaneClient
from nemo_dp.data_plane.interfaces import LocalDataPlaneConfig
from nemo_dp.data_plane.schema import GLOBAL_FORWARD_PAD_SEQLEN
from nemo_dp.data_plane.worker_mixin import TQWorkerMixin
from nemo_dp.algorithms.sft_loader import ColocatedLoaderGroup
from nemo_dp.models.policy.sft_loader_worker import ColocatedLoaderMixin, sft_partition_id
from nemo_dp.models.policy.tq_policy import TQPolicy

pytestmark = pytest.mark.timeout(60)

GBS = 8
DP = 2
MBS = 2


class _FakeTrainHost:
    """Stand-in for ``PolicyWorker``'s split training API: records calls, returns sums."""

    def __init__(self, rank: int, world_size: int, events: list[tuple[str, int]]) -> None:
        self.rank = rank
        self.world_size = world_size
        self.pad_id = 0
        self.cfg = {"dynamic_batching": {"enabled": False}, "sequence_packing": {"enabled": False}}
        self.events = events
        self.seen: list[dict[str, torch.Tensor]] = []
        self.fail_on_train = False
        self.fail_with: type[Exception] = RuntimeError
        self.step_rows: list[dict[str, torch.Tensor]] | None = None

    def _local_coords(self) -> dict[str, int]:
        return {}

    def begin_train_step(self, loss_fn: Any, mbs: int | None = None) -> None:
        self.events.append(("begin", self.rank))
        self.step_rows = []

    def train_microbatch(self, data: Any) -> None:
        self.events.append(("train", self.rank))
        if self.fail_on_train:
            raise self.fail_with(f"injected training failure on rank {self.rank}")
        assert self.step_rows is not None
        self.step_rows.append({k: v.clone() for k, v in data.items() if isinstance(v, torch.Tensor)})

    def finish_train_step(self) -> dict[str, Any]:
        self.events.append(("finish", self.rank))
        rows = self.step_rows or []
        self.seen.extend(rows)
        self.step_rows = None
        tokens = float(sum(float(r["token_mask"].sum()) for r in rows))
        return {"loss": tokens, "num_valid_tokens": tokens, "grad_norm": 1.0, "lr": 0.1}

    def abort_train_step(self) -> None:
        self.events.append(("abort", self.rank))
        self.step_rows = None


class _Worker(ColocatedLoaderMixin, TQWorkerMixin, _FakeTrainHost):
    def __init__(self, rank: int, world_size: int, events: list[tuple[str, int]], max_partitions: int) -> None:
        _FakeTrainHost.__init__(self, rank, world_size, events)
        self.dp_client = LocalDataPlaneClient(LocalDataPlaneConfig(max_partitions=max_partitions))
        self.dp_cfg = None
        self._dp_train_step_active = False

    def commit_sft_batch(self, batch_index: int) -> int:
        self.events.append(("commit", self.rank))
        return super().commit_sft_batch(batch_index)


class _InProcessGroup:
    """``RayWorkerGroup`` stand-in: calls the workers in rank order in this process."""

    def __init__(self, workers: list[_Worker]) -> None:
        self.workers = workers
        self.world_size = len(workers)
        self.calls: list[str] = []  # one entry per driver -> worker round trip

    def run_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        self.calls.append(method)
        return [getattr(w, method)(*args, **kwargs) for w in self.workers]

    def run_sharded(self, method: str, shards: list[Any], *args: Any, **kwargs: Any) -> list[Any]:
        self.calls.append(method)
        assert len(shards) == len(self.workers)
        return [getattr(w, method)(s, *args, **kwargs) for w, s in zip(self.workers, shards)]


def _policy(group: _InProcessGroup, *, dynamic: bool = False) -> TQPolicy:
    policy = object.__new__(TQPolicy)
    policy.cfg = OmegaConf.create(
        {
            "dynamic_batching": {
                "enabled": dynamic,
                "train_mb_tokens": 64,
                "logprob_mb_tokens": 64,
                "sequence_length_round": 4,
            },
            "sequence_packing": {"enabled": False},
            "train_global_batch_size": GBS,
        }
    )
    policy.dp_size = group.world_size
    policy.name_prefix = "policy"
    policy.worker_group = group
    policy._train_step_active = False
    return policy


def _dataset() -> SFTDataset:
    # Responses of different lengths so ranks have different slice maxima.
    return SFTDataset([(f"{i}+{i}=", str(2 * i) + "0" * (i % 5)) for i in range(40)])


_Setup = tuple[TQPolicy, ColocatedLoaderGroup, list[_Worker], list[tuple[str, int]]]


def _setup(max_partitions: int = 2, dynamic: bool = False, seed: int = 3) -> _Setup:
    events: list[tuple[str, int]] = []
    workers = [_Worker(r, DP, events, max_partitions) for r in range(DP)]
    group = _InProcessGroup(workers)
    policy = _policy(group, dynamic=dynamic)
    loaders = ColocatedLoaderGroup(policy, LocalDataPlaneConfig(max_partitions=max_partitions))
    assert loaders.max_live_batches() == max_partitions
    loaders.setup(
        EpochLoader(_dataset(), batch_size=GBS, seed=seed),
        tokenizer=CharTokenizer(),
        max_seq_len=32,
        micro_batch_size=MBS,
        max_live_batches=max_partitions,
    )
    return policy, loaders, workers, events


def _expected_blocks(k: int, seed: int = 3) -> list[list[int]]:
    ref = EpochLoader(_dataset(), batch_size=GBS, seed=seed)
    for _ in range(k + 1):
        ref.next_batch()
    idx = ref.last_batch_indices
    per = GBS // DP
    return [idx[r * per : (r + 1) * per] for r in range(DP)]


def test_step_order_placement_commit_and_counters() -> None:
    policy, loaders, workers, events = _setup()
    group = policy.worker_group
    group.calls.clear()
    result = sft_sync_step(policy, loaders, 0, loss_fn=object())
    # First step: one load, then ONE fused call per rank: begin -> placed train -> finish ->
    # commit on each rank, in that order (the in-process group runs the ranks one after another).
    assert group.calls == ["load_sft_batch", "run_sft_step"]
    assert result.worker_calls == 2
    assert events == [(kind, r) for r in range(DP) for kind in ("begin", "train", "finish", "commit")]
    assert result.consumed == GBS
    # Rank r got exactly the legacy planner's block r of global batch 0.
    assert [e.source_ids for e in result.envelopes] == _expected_blocks(0)
    assert [e.meta.partition_id for e in result.envelopes] == ["sft_dp0_batch0", "sft_dp1_batch0"]
    assert result.envelopes[0].meta.sample_ids[0] == "sft_dp0_batch0_row0"
    # One fresh global pad target: every rank materialised the same width = max over ranks.
    longest = max(max(e.meta.sequence_lengths) for e in result.envelopes)
    widths = {w.seen[0]["input_ids"].shape[1] for w in workers}
    assert widths == {longest}
    assert GLOBAL_FORWARD_PAD_SEQLEN not in result.envelopes[0].meta.extra_info  # caller's meta untouched
    assert result.metrics["num_valid_tokens"] == float(sum(e.valid_tokens for e in result.envelopes))
    assert policy._train_step_active is False
    # Committed: batch 0's partition is gone, batch 1 is prefetched (max_partitions=2).
    for w in workers:
        with pytest.raises(KeyError):
            w.dp_client.get_samples([f"sft_dp{w.rank}_batch0_row0"], f"sft_dp{w.rank}_batch0", ["input_ids"])
        assert w.dp_client.list_sample_ids(sft_partition_id(w.rank, 1)) != []
    # Steady state: ONE driver -> worker round trip per step (the envelopes of batch 1 came
    # back from step 0's fused call), and the same rows as the legacy planner's blocks.
    for k in (1, 2, 3):
        group.calls.clear()
        step = sft_sync_step(policy, loaders, k, loss_fn=object())
        assert group.calls == ["run_sft_step"]
        assert step.worker_calls == 1
        assert all(e.prefetched for e in step.envelopes)
        assert [e.source_ids for e in step.envelopes] == _expected_blocks(k)
        assert step.consumed == GBS
        # Between steps the loader holds the next batches up to max_live_batches (2).
        assert [w.colocated_loader_stats()["live"] for w in workers] == [[k + 1, k + 2]] * DP


def test_one_live_batch_loads_the_next_inside_the_fused_call() -> None:
    policy, loaders, workers, _ = _setup(max_partitions=1)
    group = policy.worker_group
    sft_sync_step(policy, loaders, 0, loss_fn=object())
    group.calls.clear()
    step = sft_sync_step(policy, loaders, 1, loss_fn=object())
    assert group.calls == ["run_sft_step"]
    # Batch 1 was loaded after batch 0's commit, in step 0's call: not loaded by an earlier call
    # than the one that returned its envelope.
    assert [e.prefetched for e in step.envelopes] == [False] * DP
    assert all(e.load_time_s > 0 for e in step.envelopes)
    assert [e.source_ids for e in step.envelopes] == _expected_blocks(1)
    assert [w.colocated_loader_stats()["live"] for w in workers] == [[2]] * DP


def _fail_batch_one(rank: int, match: str) -> _Setup:
    """Train batch 0, then batch 1 with rank ``rank`` failing (``match``: the error); ``_setup``'s four."""
    policy, loaders, workers, events = _setup()
    sft_sync_step(policy, loaders, 0, loss_fn=object())
    workers[rank].fail_on_train = True
    events.clear()
    with pytest.raises(RuntimeError, match=match):
        sft_sync_step(policy, loaders, 1, loss_fn=object())
    return policy, loaders, workers, events


def _retry_batch_one(policy: TQPolicy, loaders: ColocatedLoaderGroup, workers: list[_Worker], rank: int) -> Any:
    """Batch 1 again with rank ``rank`` healthy: it sees exactly the same rows; the step."""
    workers[rank].fail_on_train = False
    retry = sft_sync_step(policy, loaders, 1, loss_fn=object())
    assert [e.source_ids for e in retry.envelopes] == _expected_blocks(1)
    return retry


def test_training_failure_aborts_drops_and_leaves_position_unchanged() -> None:
    policy, loaders, workers, events = _fail_batch_one(1, "injected training failure")
    # Rank 1's step was aborted (gradients dropped) where it failed.  The in-process group ran
    # rank 0's whole fused call first, commit included: the driver's abort rolled that back.
    assert ("abort", 1) in events
    assert ("commit", 0) in events and ("commit", 1) not in events
    assert policy._train_step_active is False
    assert all(not w._dp_train_step_active for w in workers)
    for w in workers:  # active and prefetched partitions dropped
        for k in (1, 2):
            pid = sft_partition_id(w.rank, k)
            assert w.dp_client.list_sample_ids(pid) == []
            with pytest.raises(KeyError):
                w.dp_client.get_samples([f"{pid}_row0"], pid, ["input_ids"])
        assert w.quiesce_colocated_loader()["next_batch"] == 1
    retry = _retry_batch_one(policy, loaders, workers, 1)
    assert retry.worker_calls == 2  # the abort dropped the readied envelopes: load again
    with pytest.raises(ValueError, match="next batch is 2"):
        loaders.load(1)


def test_failure_on_the_first_rank_aborts_every_rank() -> None:
    policy, loaders, workers, events = _fail_batch_one(0, "injected training failure on rank 0")
    assert ("abort", 0) in events and not any(e[0] == "commit" for e in events)
    assert policy.worker_group.calls[-2:] == ["abort_train_step_presharded", "abort_sft_batch"]
    assert [w.quiesce_colocated_loader()["next_batch"] for w in workers] == [1] * DP
    _retry_batch_one(policy, loaders, workers, 0)


def test_an_unavailable_store_fails_the_step_at_once_without_an_abort() -> None:
    """A rank whose store stopped answering: the step's error propagates with no abort round
    trip, which would wait on the dead store again and on any rank still inside a collective
    with the failed one (seen as a 150 s exit instead of the documented 90 s bound)."""
    from nemo_dp.data_plane.interfaces import DataPlaneUnavailableError

    policy, loaders, workers, _ = _setup()
    sft_sync_step(policy, loaders, 0, loss_fn=object())
    workers[0].fail_on_train = True
    workers[0].fail_with = DataPlaneUnavailableError
    calls_before = len(policy.worker_group.calls)
    with pytest.raises(DataPlaneUnavailableError, match="injected training failure on rank 0") as info:
        sft_sync_step(policy, loaders, 1, loss_fn=object())
    assert policy.worker_group.calls[calls_before:] == ["run_sft_step"]  # the fused call only
    assert not any(name in ("abort_train_step_presharded", "abort_sft_batch") for name in policy.worker_group.calls)
    assert any("SFT batch 1 was not aborted: the data plane is unavailable" in n for n in info.value.__notes__)


@pytest.mark.parametrize("refusal", ["store_full", "store_error"])
def test_a_next_batch_that_cannot_be_readied_fails_the_step_that_needs_it(
    refusal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nemo_dp.data_plane.interfaces import PartitionLimitError

    policy, loaders, workers, _ = _setup(max_partitions=1)
    sft_sync_step(policy, loaders, 0, loss_fn=object())
    register = workers[0].dp_client.register_partition

    def refuse(*args: Any, **kwargs: Any) -> None:
        if refusal == "store_full":
            raise PartitionLimitError("partition limit reached (injected)")
        raise OSError("injected store error")

    monkeypatch.setattr(workers[0].dp_client, "register_partition", refuse)
    # Step 1 trains and commits (its batch was readied by step 0); rank 0 cannot ready batch 2,
    # which must not fail the step whose optimizer update already happened.
    step1 = sft_sync_step(policy, loaders, 1, loss_fn=object())
    assert [e.source_ids for e in step1.envelopes] == _expected_blocks(1)
    assert loaders._ready is None
    assert workers[0].colocated_loader_stats()["live"] == []
    assert workers[1].colocated_loader_stats()["live"] == [2]
    # Step 2 must load batch 2 itself: the error surfaces there, and the step is aborted.
    with pytest.raises((PartitionLimitError, OSError), match="injected"):
        sft_sync_step(policy, loaders, 2, loss_fn=object())
    assert [w.quiesce_colocated_loader()["next_batch"] for w in workers] == [2] * DP
    monkeypatch.setattr(workers[0].dp_client, "register_partition", register)
    again = sft_sync_step(policy, loaders, 2, loss_fn=object())
    assert again.worker_calls == 2
    assert [e.source_ids for e in again.envelopes] == _expected_blocks(2)  # nothing skipped


def test_a_store_that_stopped_answering_fails_the_next_step_without_a_second_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rank that could not ready batch k+1 because the store timed out: the step that needs
    batch k+1 raises the store error at once and calls no worker to load it again."""
    from nemo_dp.data_plane.interfaces import DataPlaneUnavailableError

    policy, loaders, workers, _ = _setup(max_partitions=1)
    sft_sync_step(policy, loaders, 0, loss_fn=object())

    def dead(*args: Any, **kwargs: Any) -> None:
        raise DataPlaneUnavailableError("register_partition: storage did not answer within 10 s (injected)")

    monkeypatch.setattr(workers[0].dp_client, "register_partition", dead)
    sft_sync_step(policy, loaders, 1, loss_fn=object())  # trained and committed; readying 2 failed
    loads: list[int] = []
    for w in workers:
        original = w.load_sft_batch

        def counting(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            loads.append(1)
            return _original(*args, **kwargs)

        monkeypatch.setattr(w, "load_sft_batch", counting)
    with pytest.raises(DataPlaneUnavailableError, match=r"SFT batch 2: .*DP rank 0: .*injected"):
        sft_sync_step(policy, loaders, 2, loss_fn=object())
    assert loads == []  # no second wait on the dead store
    assert [w.quiesce_colocated_loader()["next_batch"] for w in workers] == [2] * DP


def test_placed_meta_must_be_the_loaded_batch() -> None:
    _, loaders, workers, events = _setup()
    envelopes = loaders.load(0)
    with pytest.raises(ValueError, match=r"differs from the loaded batch 'sft_dp1_batch0' in \['partition_id'"):
        workers[1].run_sft_step(envelopes[0].meta, 0, object())
    with pytest.raises(ValueError, match="asked to train batch 1 but the next batch is 0"):
        workers[0].run_sft_step(envelopes[0].meta, 1, object())
    assert events == []  # nothing began
    loaders.abort(0)
    with pytest.raises(RuntimeError, match="batch 0 is not loaded"):
        workers[0].run_sft_step(envelopes[0].meta, 0, object())
    # A reload of the same batch is a new Local generation: the old envelope no longer matches.
    fresh = loaders.load(0)
    assert fresh[0].meta.extra_info != envelopes[0].meta.extra_info
    with pytest.raises(ValueError, match=r"in \['extra_info'\]"):
        workers[0].run_sft_step(envelopes[0].meta, 0, object())
    with pytest.raises(RuntimeError, match="abort of the step of batch 5 but this rank's next batch is 0"):
        loaders.abort(5)


def test_quiesce_between_steps_drops_the_readied_batch_and_reloads_it() -> None:
    policy, loaders, workers, _ = _setup()
    sft_sync_step(policy, loaders, 0, loss_fn=object())
    assert loaders.quiesce()["next_batch"] == 1
    assert [w.colocated_loader_stats()["live"] for w in workers] == [[]] * DP
    step = sft_sync_step(policy, loaders, 1, loss_fn=object())
    assert step.worker_calls == 2
    assert [e.source_ids for e in step.envelopes] == _expected_blocks(1)


def test_wrong_meta_count_and_dynamic_batching_raise() -> None:
    policy, loaders, workers, _ = _setup()
    envelopes = loaders.load(0)
    policy.begin_train_step(object())
    with pytest.raises(ValueError, match="exactly one batch per DP rank"):
        policy.train_placed_microbatches([envelopes[0].meta])
    policy.abort_train_step()
    loaders.abort()

    policy_db, loaders_db, workers_db, events = _setup(dynamic=True)
    with pytest.raises(ValueError, match="does not support dynamic batching"):
        sft_sync_step(policy_db, loaders_db, 0, loss_fn=object())
    # The placed-metadata checks run on the driver before the fused call: no rank began a step.
    assert events == []
    assert policy_db.worker_group.calls == ["setup_colocated_loader", "load_sft_batch", "abort_sft_batch"]
    for w in workers_db:
        with pytest.raises(KeyError):
            w.dp_client.get_samples([f"{sft_partition_id(w.rank, 0)}_row0"], sft_partition_id(w.rank, 0), ["input_ids"])
        assert w.quiesce_colocated_loader()["next_batch"] == 0


def test_envelope_rank_check_and_microbatch_counts() -> None:
    policy, loaders, workers, _ = _setup()
    envs = loaders.load(0)
    assert [e.num_microbatches for e in envs] == [GBS // DP // MBS] * DP
    loaders.abort()

    class _Dup(_InProcessGroup):
        def run_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
            out = super().run_all(method, *args, **kwargs)
            return [out[0], out[0]] if method == "load_sft_batch" else out

    bad = ColocatedLoaderGroup(_policy(_Dup(workers)), LocalDataPlaneConfig())
    with pytest.raises(ValueError, match=r"DP ranks \[0, 0\]"):
        bad.load(0)


def test_checkpoint_refused_while_active_and_prefetch_rewound() -> None:
    policy, loaders, workers, _ = _setup()
    loaders.load(0)
    with pytest.raises(RuntimeError, match="active"):
        loaders.quiesce()
    with pytest.raises(RuntimeError, match="active"):
        workers[0].save_colocated_data_plane("/nonexistent/never", {})
    loaders.abort()
    sft_sync_step(policy, loaders, 0, loss_fn=object())
    assert workers[0].colocated_loader_stats()["live"] == [1, 2]  # batches 1 and 2 prefetched
    position = loaders.quiesce()
    assert position["next_batch"] == 1
    ref = EpochLoader(_dataset(), batch_size=GBS, seed=3)
    ref.next_batch()
    assert position["loader"] == ref.state_dict()
    assert workers[0].colocated_loader_stats()["live"] == []
    again = sft_sync_step(policy, loaders, 1, loss_fn=object())
    assert [e.source_ids for e in again.envelopes] == _expected_blocks(1)


def test_resume_from_position_and_store_checkpoint(tmp_path: Any) -> None:
    straight_policy, straight_loaders, _, _ = _setup()
    straight = [sft_sync_step(straight_policy, straight_loaders, k, loss_fn=object()) for k in range(4)]

    policy, loaders, workers, _ = _setup()
    for k in range(2):
        sft_sync_step(policy, loaders, k, loss_fn=object())
    position = loaders.quiesce()
    saved = loaders.save_worker_stores(tmp_path / "dp", {"step": 2})
    assert len(saved) == DP

    # A fresh "process": new workers and stores, the template loader at the saved position.
    events: list[tuple[str, int]] = []
    fresh = [_Worker(r, DP, events, 2) for r in range(DP)]
    group = _InProcessGroup(fresh)
    fresh_policy = _policy(group)
    fresh_loaders = ColocatedLoaderGroup(fresh_policy, LocalDataPlaneConfig())
    assert fresh_loaders.load_worker_stores(tmp_path / "dp") == [{"step": 2}] * DP
    template = EpochLoader(_dataset(), batch_size=GBS, seed=3)
    template.load_state_dict(position["loader"])
    fresh_loaders.setup(template, tokenizer=CharTokenizer(), max_seq_len=32, micro_batch_size=MBS, max_live_batches=2)
    fresh_loaders.set_position(position["next_batch"])
    resumed = [sft_sync_step(fresh_policy, fresh_loaders, k, loss_fn=object()) for k in (2, 3)]
    assert [[e.source_ids for e in r.envelopes] for r in resumed] == [
        [e.source_ids for e in r.envelopes] for r in straight[2:]
    ]
    assert [r.metrics["loss"] for r in resumed] == [r.metrics["loss"] for r in straight[2:]]


def test_loader_group_refuses_a_disabled_data_plane_and_bounds_tq() -> None:
    from nemo_dp.data_plane.interfaces import DisabledDataPlaneConfig
    from nemo_dp.data_plane.registry import LOADER_LIVE_BATCHES

    group = _InProcessGroup([])
    with pytest.raises(ValueError, match="data_plane=local or data_plane=tq"):
        ColocatedLoaderGroup(_policy(group), DisabledDataPlaneConfig())
    tq = ColocatedLoaderGroup(_policy(group), OmegaConf.create({"enabled": True, "impl": "transfer_queue"}))
    assert tq.max_live_batches() == LOADER_LIVE_BATCHES
