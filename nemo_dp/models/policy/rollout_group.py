"""Driver side of the rollout actors: weights, dispatch, streaming claims, teardown."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_dp.data_plane.factory import maybe_configure_data_plane_env
from nemo_dp.data_plane.interfaces import KVBatchMeta
from nemo_dp.data_plane.schema import TASK_PREV_LP, TASK_REF_LP, TASK_TRAIN
from nemo_dp.models.builders import policy_for_workers
from nemo_dp.models.policy.rollout_worker import (
    POLICY_VERSION,
    ROLLOUT_PARTITION_PREFIX,
    STREAM_FIELDS,
    TAG_ORDINAL,
    AdvantageFn,
    RolloutWorker,
    partition_for_batch,
    shard_bounds,
)
from nemo_dp.models.policy.scoring_pair import ScoringPairSender, pair_digest

__all__ = ["RolloutShard", "RolloutStats", "RolloutGroup"]


@dataclass
class RolloutShard:
    """One dispatched shard of rollout batch ``batch`` on actor ``worker``; ``ref`` is the pending Ray result."""

    batch: int
    worker: int
    ref: Any
    rows: int
    scoring_digest: str


@dataclass
class RolloutStats:
    """Counters for per-step metrics: rows ``generated`` in the run, and seconds in the :meth:`window`."""

    generated: int = 0
    busy_s: float = 0.0
    gen_s: float = 0.0
    put_s: float = 0.0
    claim_wait_s: float = 0.0
    finished: list[dict[str, Any]] = field(default_factory=list)

    def window(self) -> dict[str, float]:
        """The window's ``{"busy_s", "gen_s", "put_s", "claim_wait_s"}``, then reset them (not ``generated``)."""
        out = {"busy_s": self.busy_s, "gen_s": self.gen_s, "put_s": self.put_s, "claim_wait_s": self.claim_wait_s}
        self.busy_s = self.gen_s = self.put_s = self.claim_wait_s = 0.0
        return out


class RolloutGroup:
    """Starts the ``RolloutWorker`` actors, pushes them weights, dispatches rollout batches and claims rows.

    ``policy`` is the ``TQPolicy`` (its store client, its rank-0 worker's weights); ``tokenizer``,
    ``env`` and ``advantage_fn`` go to the actors.  Raises ``RuntimeError`` when Ray is not running.
    """

    def __init__(
        self, policy: Any, master_config: Any, *, tokenizer: Any, env: Any, advantage_fn: AdvantageFn,
        num_workers: int, torch_threads: int,
    ) -> None:
        import ray

        from nemo_dp.data_plane.factory import coerce_data_plane_config

        if not ray.is_initialized():
            raise RuntimeError("RolloutGroup: Ray is not initialised")
        self._policy = policy
        self._client = policy.dp_client
        self._tokenizer = tokenizer
        self._env = env
        self._scoring = ScoringPairSender()
        algo = master_config.algorithm
        self.group_size = int(algo.num_generations_per_prompt)
        self.dp_size = int(master_config.policy.dp_size)
        self.stats = RolloutStats()
        self._pending: list[RolloutShard] = []
        self._live: set[str] = set()
        policy_cfg = policy_for_workers(master_config.policy)
        dp_cfg = coerce_data_plane_config(master_config.data_plane)
        env_vars = maybe_configure_data_plane_env(dp_cfg)
        options: dict[str, Any] = {"num_cpus": 0}
        if env_vars:
            options["runtime_env"] = {"env_vars": dict(env_vars)}
        remote_cls = ray.remote(RolloutWorker)
        self.workers = [
            remote_cls.options(**options).remote(
                index=i,
                policy_cfg=policy_cfg,
                group_size=self.group_size,
                overlong_filtering=bool(algo.overlong_filtering),
                advantage_fn=advantage_fn,
                vocab_size=int(tokenizer.vocab_size),
                pad_id=int(tokenizer.pad_id),
                eos_id=int(tokenizer.eos_id),
                seed=int(master_config.seed),
                dp_cfg=dp_cfg,
                torch_threads=int(torch_threads),
            )
            for i in range(int(num_workers))
        ]
        try:
            ray.get([w.ready.remote() for w in self.workers])
        except BaseException:
            self._kill()
            raise

    def sync_weights(self, version: int) -> None:
        """Queue training rank 0's current weights on every actor, stamped ``version`` (trainer steps done).

        Ray runs an actor's calls in order, so shards dispatched after this call use these weights.
        """
        ref = self._policy.worker_group.workers[0].get_state.remote(include_weights=True)
        self._weight_acks = [w.load_weights.remote(ref, int(version)) for w in self.workers]

    def dispatch(self, batch: int, problems: Sequence[Any], seeds: Sequence[int]) -> str:
        """Register rollout batch ``batch``'s partition, queue its shards on the actors (no wait); return the id.

        ``seeds``: one per row, prompt-major.  ``ValueError`` for a wrong count or a live partition.
        """
        g = self.group_size
        n = len(problems) * g
        if len(seeds) != n:
            raise ValueError(f"RolloutGroup.dispatch: {len(seeds)} seeds for {n} rows (batch {batch})")
        pid = partition_for_batch(batch)
        self._client.register_partition(
            pid,
            fields=[*STREAM_FIELDS, *self._policy.image_fields],
            num_samples=n,
            consumer_tasks=[TASK_PREV_LP, TASK_REF_LP, TASK_TRAIN],
            grpo_group_size=g,
        )
        self._live.add(pid)
        prompts = [self._tokenizer.encode_prompt(p.prompt) for p in problems for _ in range(g)]
        answers = [p.answer for p in problems for _ in range(g)]
        ids = [f"a{batch}_p{j}_g{i}" for j in range(len(problems)) for i in range(g)]
        digest = pair_digest(self._tokenizer, self._env)
        for r, (a, b) in enumerate(shard_bounds(len(problems), g, self.dp_size)):
            if a == b:
                continue
            shard = {
                "prompts": prompts[a:b],
                "seeds": [int(s) for s in seeds[a:b]],
                "sample_ids": ids[a:b],
                "answers": answers[a:b],
                "ordinals": list(range(a, b)),
            }
            w = r % len(self.workers)
            ref = self.workers[w].generate_into_store.remote(
                shard, partition_id=pid, **self._scoring.kwargs(w, digest, self._tokenizer, self._env)
            )
            self._pending.append(RolloutShard(batch, w, ref, b - a, digest))
        return pid

    def _collect_finished(self, timeout_s: float = 0.0) -> None:
        """Fetch results of finished shards (raises the first rollout failure)."""
        import ray

        if not self._pending:
            return
        refs = [s.ref for s in self._pending]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if not done:
            return
        done_set = set(done)
        still: list[RolloutShard] = []
        for s in self._pending:
            if s.ref in done_set:
                info = ray.get(s.ref)
                self._scoring.sent(s.worker, s.scoring_digest)
                self.stats.generated += int(info["rows"])
                self.stats.gen_s += float(info["gen_s"])
                self.stats.put_s += float(info["put_s"])
                self.stats.busy_s += float(info["gen_s"]) + float(info["put_s"])
                self.stats.finished.append(dict(info, batch=s.batch, worker=s.worker))
            else:
                still.append(s)
        self._pending = still

    def claim_batch(self, batch: int, num_rows: int, *, poll_s: float, timeout_s: float) -> KVBatchMeta:
        """Claim batch ``batch``'s rows as they become ready (polling every ``poll_s``); return them by ``ordinal``.

        Raises ``TimeoutError`` after ``timeout_s``, ``ValueError`` for untagged rows, or a shard's failure.
        """
        pid = partition_for_batch(batch)
        parts: list[KVBatchMeta] = []
        have = 0
        t0 = time.perf_counter()
        deadline = t0 + float(timeout_s)
        while have < num_rows:
            self._collect_finished()
            # All remaining rows in one claim when they are ready, else one group at a time (a
            # claim of more rows than are ready returns nothing and claims nothing).
            got = self._client.claim_meta(pid, TASK_TRAIN, [POLICY_VERSION], num_rows - have, blocking=False)
            if not got.size and num_rows - have > self.group_size:
                got = self._client.claim_meta(pid, TASK_TRAIN, [POLICY_VERSION], self.group_size, blocking=False)
            if got.size:
                parts.append(got)
                have += got.size
                continue
            if time.perf_counter() > deadline:
                raise TimeoutError(
                    f"RolloutGroup.claim_batch: {have} of {num_rows} rows of batch {batch} (partition "
                    f"{pid!r}) arrived within algorithm.async_rollout.claim_timeout_s={timeout_s:g}"
                )
            time.sleep(poll_s)
        self.stats.claim_wait_s += time.perf_counter() - t0
        # Every row is in the store, so the shards are returning: wait for them (bounded) so the
        # counters include the batch being trained, whatever order Ray delivers the results in.
        import ray

        batch_refs = [s.ref for s in self._pending if s.batch == batch]
        if batch_refs:
            ray.wait(batch_refs, num_returns=len(batch_refs), timeout=max(deadline - time.perf_counter(), 1.0))
        self._collect_finished()
        meta = parts[0].concat(*parts[1:])
        if meta.tags is None or any(TAG_ORDINAL not in t for t in meta.tags):
            raise ValueError(f"RolloutGroup.claim_batch: claimed rows of {pid!r} lack the {TAG_ORDINAL!r} tag")
        order = sorted(range(meta.size), key=lambda i: int(meta.tags[i][TAG_ORDINAL]))  # type: ignore[index]
        return meta.subset(order)

    def finish_batch(self, batch: int) -> None:
        """Drop batch ``batch``'s partition (its rows were trained)."""
        pid = partition_for_batch(batch)
        if pid in self._live:
            self._live.discard(pid)
            self._client.clear_samples(None, pid)

    def occupancy(self) -> int:
        """Rows currently held in the store by live rollout partitions (claimed or not)."""
        return sum(len(self._client.list_sample_ids(pid)) for pid in sorted(self._live))

    def in_flight_batches(self) -> list[int]:
        """Sorted indices of batches dispatched but not yet finished (generating or untrained)."""
        return sorted(int(pid[len(ROLLOUT_PARTITION_PREFIX):]) for pid in self._live)

    def _kill(self) -> None:
        import ray

        for w in self.workers:
            with contextlib.suppress(Exception):  # actor already gone
                ray.kill(w, no_restart=True)
        self.workers = []

    def shutdown(self) -> None:
        """Drop live partitions, close the actors' clients and kill the actors (idempotent)."""
        import ray

        try:
            if self._pending:
                # A failed or interrupted run: let queued shards finish (their rows are dropped
                # with the partitions) so no put races the partition drop; errors are moot now.
                refs = [s.ref for s in self._pending]
                done, _ = ray.wait(refs, num_returns=len(refs), timeout=60)
                for ref in done:
                    with contextlib.suppress(Exception):  # the run is already failing or done
                        ray.get(ref)
                if len(done) < len(refs):
                    self._kill()
            for pid in sorted(self._live):
                with contextlib.suppress(Exception):  # best effort: the system may be closing
                    self._client.clear_samples(None, pid)
            self._live.clear()
            if self.workers:
                with contextlib.suppress(Exception):  # the actors are killed next anyway
                    ray.get([w.shutdown.remote() for w in self.workers], timeout=30)
        finally:
            self._pending = []
            self._kill()
