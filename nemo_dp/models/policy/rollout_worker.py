"""Rollout actors separate from the training workers, and the driver-side group that runs them.

Why this module exists: asynchronous GRPO generates while the trainer trains, so generation
cannot live in the training workers (they are busy).  A ``RolloutWorker`` is a Ray actor
(``num_cpus=0``) holding its own copy of the policy model.  It generates its shard of a rollout
batch exactly as ``PolicyWorker.generate`` does (same ``nemo_dp.models.generation.generate``
call, same ``generation_batch_size`` chunks, per-row seeds), scores the responses, computes the
group-relative advantages of its whole groups, and writes every column the trainer needs into
the store in one put, with the generating policy version on each row (column and tag
``policy_version``).  Nothing per-token goes back to the driver.

``RolloutGroup`` is the driver side: it starts the actors, pushes new weights to them straight
from training rank 0 through Ray's object store (the driver never holds the tensors), registers
one partition per rollout batch, dispatches shards without waiting, and claims a batch's rows
with ``claim_meta`` as they become ready.  Rollout failures surface at the next claim instead of
as a claim timeout.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict

from nemo_dp.data_plane.column_io import first_write
from nemo_dp.data_plane.factory import build_data_plane_client, maybe_configure_data_plane_env
from nemo_dp.data_plane.interfaces import KVBatchMeta
from nemo_dp.data_plane.schema import (
    ADVANTAGES,
    DP_TRAIN_FIELDS,
    GENERATION_LOGPROBS,
    INPUT_IDS,
    INPUT_LENGTHS,
    SAMPLE_MASK,
    TAG_BASELINE,
    TAG_INPUT_LENGTHS,
    TAG_STD,
    TASK_PREV_LP,
    TASK_REF_LP,
    TASK_TRAIN,
    TOKEN_MASK,
)
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.models.generation import generate as generate_tokens
from nemo_dp.models.model import ModelConfig, TinyCausalLM

__all__ = [
    "POLICY_VERSION",
    "TAG_ORDINAL",
    "ROLLOUT_PARTITION_PREFIX",
    "STREAM_FIELDS",
    "RolloutWorker",
    "RolloutShard",
    "RolloutGroup",
    "partition_for_batch",
    "shard_bounds",
]

#: Per-row column and tag: the policy version whose weights generated the row.
POLICY_VERSION = "policy_version"
#: Tag: the row's position in its rollout batch (prompt-major), i.e. the synchronous order.
TAG_ORDINAL = "ordinal"
PROMPT_LENGTHS = "prompt_lengths"
#: Per-row tags the driver reads to log a step (small scalars only).
ROW_TAGS: tuple[str, ...] = ("reward", "advantage", "response_length", "truncated", POLICY_VERSION)
ROLLOUT_PARTITION_PREFIX = "async_rollout_b"
#: Columns of a streamed rollout partition.
STREAM_FIELDS: tuple[str, ...] = tuple(dict.fromkeys((*DP_TRAIN_FIELDS, PROMPT_LENGTHS, POLICY_VERSION)))


def partition_for_batch(batch: int) -> str:
    """The store partition of rollout batch ``batch`` (one partition per batch).

    Args:
        batch: 1-based rollout batch index (= the trainer step that trains it).

    Returns:
        The partition id.
    """
    return f"{ROLLOUT_PARTITION_PREFIX}{int(batch)}"


def _cfg_get(cfg: Any, key: str) -> Any:
    return cfg[key] if isinstance(cfg, Mapping) else getattr(cfg, key)


def shard_bounds(num_prompts: int, group_size: int, dp_size: int) -> list[tuple[int, int]]:
    """Row ranges of a rollout batch's shards: ``Policy.generate``'s split over ``dp_size`` ranks.

    Contiguous runs of ``ceil(n / dp_size)`` rows (so each shard's generation sub-batches are the
    synchronous path's), or, when such a run would cut a GRPO group, runs of
    ``ceil(num_prompts / dp_size)`` whole groups.

    Args:
        num_prompts: Prompts in the batch.
        group_size: Generations per prompt.
        dp_size: Training ranks the synchronous path splits over.

    Returns:
        ``dp_size`` half-open ``(start, end)`` row ranges (possibly empty), covering every row.

    Raises:
        ValueError: A non-positive argument.
    """
    if num_prompts < 1 or group_size < 1 or dp_size < 1:
        raise ValueError(
            f"shard_bounds: num_prompts={num_prompts}, group_size={group_size}, dp_size={dp_size} "
            "must all be >= 1"
        )
    n = num_prompts * group_size
    per = -(-n // dp_size)
    if per % group_size == 0:
        return [(min(r * per, n), min((r + 1) * per, n)) for r in range(dp_size)]
    per_p = -(-num_prompts // dp_size)
    return [
        (min(r * per_p, num_prompts) * group_size, min((r + 1) * per_p, num_prompts) * group_size)
        for r in range(dp_size)
    ]


class RolloutWorker:
    """One rollout actor: a model copy, its store client, generation + scoring + advantages.

    Args:
        index: This actor's index in its group (for messages).
        policy_cfg: The ``policy`` config as a plain mapping (model shape, generation knobs).
        grpo_cfg: ``{"group_size", "leave_one_out", "normalize_rewards", "overlong_filtering"}``.
        vocab_size: Tokenizer vocabulary size.
        pad_id: Padding token id.
        eos_id: End-of-sequence token id.
        seed: Run seed (initial weights; replaced by :meth:`load_weights` before any rollout).
        dp_cfg: The validated ``data_plane`` config (the actor attaches to the driver's system).
        torch_threads: Compute threads of this actor.
    """

    def __init__(
        self,
        *,
        index: int,
        policy_cfg: Mapping[str, Any],
        grpo_cfg: Mapping[str, Any],
        vocab_size: int,
        pad_id: int,
        eos_id: int,
        seed: int,
        dp_cfg: Any,
        torch_threads: int,
    ) -> None:
        import os

        torch.set_num_threads(int(torch_threads))
        os.environ["OMP_NUM_THREADS"] = str(int(torch_threads))
        self.index = index
        self.cfg = policy_cfg
        self.grpo = dict(grpo_cfg)
        self.pad_id = pad_id
        self.eos_id = eos_id
        m = _cfg_get(policy_cfg, "model")
        self.model = TinyCausalLM(
            ModelConfig(
                vocab_size=vocab_size,
                n_layers=int(_cfg_get(m, "n_layers")),
                d_model=int(_cfg_get(m, "d_model")),
                n_heads=int(_cfg_get(m, "n_heads")),
                max_seq_len=int(_cfg_get(m, "max_seq_len")),
                dropout=float(_cfg_get(m, "dropout")),
            ),
            seed=seed,
        ).eval()
        self.version: int | None = None
        self.dp_client = build_data_plane_client(dp_cfg, bootstrap=False)

    def ready(self) -> int:
        """Round trip used to wait for construction.

        Returns:
            The actor's index.
        """
        return self.index

    def load_weights(self, state: Mapping[str, Any], version: int) -> int:
        """Replace the model weights (``PolicyWorker.get_state`` output of training rank 0).

        Args:
            state: A worker state holding ``"model"``.
            version: The policy version of these weights.

        Returns:
            ``version``.
        """
        self.model.load_state_dict(state["model"])
        self.model.eval()
        self.version = int(version)
        return self.version

    def _generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int]) -> BatchedDataDict:
        # The same chunking and call as PolicyWorker.generate, so rows are bit-identical.
        gen_cfg = _cfg_get(self.cfg, "generation")
        bs = int(_cfg_get(self.cfg, "generation_batch_size"))
        parts = []
        for s in range(0, len(prompts), bs):
            out = generate_tokens(
                self.model,
                [list(p) for p in prompts[s : s + bs]],
                max_new_tokens=int(_cfg_get(gen_cfg, "max_new_tokens")),
                eos_id=self.eos_id,
                pad_id=self.pad_id,
                greedy=False,
                temperature=float(_cfg_get(gen_cfg, "temperature")),
                seeds=[int(x) for x in seeds[s : s + bs]],
            )
            parts.append(BatchedDataDict(out))
        return BatchedDataDict.from_batches(parts, pad_value_dict={INPUT_IDS: self.pad_id})

    def generate_into_store(
        self,
        shard: Mapping[str, Sequence[Any]],
        *,
        partition_id: str,
        tokenizer: Any,
        env: Any,
    ) -> dict[str, Any]:
        """Generate whole groups, score them, compute advantages and write the rows.

        Args:
            shard: ``{"prompts", "seeds", "sample_ids", "answers", "ordinals"}``, one entry per
                row, groups contiguous and whole.
            partition_id: The batch's registered partition.
            tokenizer: Decodes responses.
            env: Scores responses.

        The rows are written in one put of every training column with the rows' tags, then one
        put of ``policy_version``, the column claims wait for.

        Returns:
            ``{"rows", "version", "gen_s", "put_s", "start", "end"}`` (``time.time`` stamps).

        Raises:
            RuntimeError: No weights were loaded yet.
            ValueError: Misaligned lists or a shard that is not a whole number of groups.
        """
        from nemo_dp.algorithms.advantages import grpo_advantages, grpo_baseline_and_std

        start = time.time()
        if self.version is None:
            raise RuntimeError(f"RolloutWorker[{self.index}]: generate_into_store before load_weights")
        prompts, seeds = shard["prompts"], shard["seeds"]
        ids, answers, ordinals = list(shard["sample_ids"]), list(shard["answers"]), list(shard["ordinals"])
        n = len(prompts)
        group = int(self.grpo["group_size"])
        if not (len(seeds) == len(ids) == len(answers) == len(ordinals) == n) or n == 0 or n % group:
            raise ValueError(
                f"RolloutWorker[{self.index}]: shard of {n} prompts, {len(seeds)} seeds, {len(ids)} ids, "
                f"{len(answers)} answers, {len(ordinals)} ordinals must align and hold whole groups of {group}"
            )
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self._generate(prompts, seeds)
        token_ids = out[INPUT_IDS]
        starts, ends = out[PROMPT_LENGTHS].tolist(), out[INPUT_LENGTHS].tolist()
        responses = [
            tokenizer.decode(token_ids[i, int(s) : int(e)].tolist()) for i, (s, e) in enumerate(zip(starts, ends))
        ]
        rewards = env.score(responses, answers).to(torch.float32)
        baseline, std = grpo_baseline_and_std(rewards, group, bool(self.grpo["leave_one_out"]))
        adv = grpo_advantages(rewards, baseline, std, bool(self.grpo["normalize_rewards"]))
        truncated = out["truncated"].to(torch.bool)
        sample_mask = torch.ones(n, dtype=torch.float32)
        if bool(self.grpo["overlong_filtering"]):
            sample_mask = sample_mask * (~truncated).float()
        token_mask = out[TOKEN_MASK]
        gen_s = time.perf_counter() - t0
        response_lengths = token_mask.sum(dim=1).to(torch.int32)
        columns = {
            INPUT_IDS: token_ids,
            INPUT_LENGTHS: out[INPUT_LENGTHS],
            PROMPT_LENGTHS: out[PROMPT_LENGTHS],
            GENERATION_LOGPROBS: out[GENERATION_LOGPROBS],
            TOKEN_MASK: token_mask,
            SAMPLE_MASK: sample_mask,
            ADVANTAGES: adv.unsqueeze(1) * token_mask.float(),
        }
        tags = [
            {
                TAG_INPUT_LENGTHS: int(ends[i]),
                TAG_ORDINAL: int(ordinals[i]),
                TAG_STD: float(std[i]),
                TAG_BASELINE: float(baseline[i]),
                "reward": float(rewards[i]),
                "advantage": float(adv[i]),
                "response_length": int(response_lengths[i]),
                "truncated": bool(truncated[i]),
                "sample_mask": float(sample_mask[i]),
                POLICY_VERSION: self.version,
            }
            for i in range(n)
        ]
        t1 = time.perf_counter()
        first_write(columns, sample_ids=ids, dp_client=self.dp_client, partition_id=partition_id,
                    task_name=None, tags=tags)
        # The commit marker: claims require this column, written only after the first put (and
        # with it the rows' tags) has returned, so a claim never sees rows without their tags.
        self.dp_client.put_samples(
            ids, partition_id, TensorDict({POLICY_VERSION: torch.full((n,), self.version, dtype=torch.int64)},
                                          batch_size=[n])
        )
        put_s = time.perf_counter() - t1
        return {"rows": n, "version": self.version, "gen_s": gen_s, "put_s": put_s, "start": start, "end": time.time()}

    def shutdown(self) -> None:
        """Close this actor's attached client (never the system: the driver owns it)."""
        client, self.dp_client = self.dp_client, None
        if client is not None:
            client.close()


@dataclass
class RolloutShard:
    """One dispatched shard of a rollout batch.

    Attributes:
        batch: Rollout batch index.
        worker: Index of the actor generating it.
        ref: The pending Ray result.
        rows: Rows in the shard.
    """

    batch: int
    worker: int
    ref: Any
    rows: int


@dataclass
class RolloutStats:
    """Counters the trainer turns into per-step metrics (reset with :meth:`window`).

    Attributes:
        generated: Rows written into the store since the start of the run.
        busy_s: Summed generation + put seconds of finished shards in the current window.
        gen_s: Summed generation seconds in the window.
        put_s: Summed store-put seconds in the window.
        claim_wait_s: Seconds the trainer waited in claims in the window.
    """

    generated: int = 0
    busy_s: float = 0.0
    gen_s: float = 0.0
    put_s: float = 0.0
    claim_wait_s: float = 0.0
    finished: list[dict[str, Any]] = field(default_factory=list)

    def window(self) -> dict[str, float]:
        """The window's counters, then reset them (``generated`` keeps counting).

        Returns:
            ``{"busy_s", "gen_s", "put_s", "claim_wait_s"}``.
        """
        out = {"busy_s": self.busy_s, "gen_s": self.gen_s, "put_s": self.put_s, "claim_wait_s": self.claim_wait_s}
        self.busy_s = self.gen_s = self.put_s = self.claim_wait_s = 0.0
        return out


class RolloutGroup:
    """Driver side of the rollout actors (models layer: the trainer sees only these methods).

    Args:
        policy: The ``TQPolicy`` (its store client registers, claims and clears partitions; its
            rank-0 worker is the source of new weights).
        master_config: Root config (``policy``, ``algorithm``, ``seed``, ``data_plane``).
        tokenizer: The tokenizer (shipped to the actors for decoding).
        env: The reward environment (shipped to the actors for scoring).
        num_workers: Rollout actors to start.
        torch_threads: Compute threads per actor.

    Raises:
        RuntimeError: Ray is not running or an actor failed to start.
    """

    def __init__(
        self,
        policy: Any,
        master_config: Any,
        *,
        tokenizer: Any,
        env: Any,
        num_workers: int,
        torch_threads: int,
    ) -> None:
        import ray
        from omegaconf import OmegaConf

        from nemo_dp.data_plane.factory import coerce_data_plane_config

        if not ray.is_initialized():
            raise RuntimeError("RolloutGroup: Ray is not initialised")
        self._policy = policy
        self._client = policy.dp_client
        self._tokenizer = tokenizer
        self._env = env
        algo = master_config.algorithm
        self.group_size = int(algo.num_generations_per_prompt)
        self.dp_size = int(master_config.policy.dp_size)
        self.stats = RolloutStats()
        self._pending: list[RolloutShard] = []
        self._live: set[str] = set()
        policy_cfg = OmegaConf.to_container(master_config.policy, resolve=True)
        dp_cfg = coerce_data_plane_config(master_config.data_plane)
        env_vars = maybe_configure_data_plane_env(dp_cfg)
        options: dict[str, Any] = {"num_cpus": 0}
        if env_vars:
            options["runtime_env"] = {"env_vars": dict(env_vars)}
        remote_cls = ray.remote(RolloutWorker)
        grpo_cfg = {
            "group_size": self.group_size,
            "leave_one_out": bool(algo.use_leave_one_out_baseline),
            "normalize_rewards": bool(algo.normalize_rewards),
            "overlong_filtering": bool(algo.overlong_filtering),
        }
        self.workers = [
            remote_cls.options(**options).remote(
                index=i,
                policy_cfg=policy_cfg,
                grpo_cfg=grpo_cfg,
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

    # --- weights --------------------------------------------------------------------------------
    def sync_weights(self, version: int) -> None:
        """Queue training rank 0's current weights on every actor, stamped ``version``.

        The weights move rank 0 -> object store -> actors; the driver holds only the reference.
        Ray runs an actor's calls in submission order, so every shard dispatched after this
        call generates with these weights and every shard dispatched before it with older ones.

        Args:
            version: The policy version (trainer steps completed).
        """
        ref = self._policy.worker_group.workers[0].get_state.remote(include_weights=True)
        self._weight_acks = [w.load_weights.remote(ref, int(version)) for w in self.workers]

    # --- rollout --------------------------------------------------------------------------------
    def dispatch(self, batch: int, problems: Sequence[Any], seeds: Sequence[int]) -> str:
        """Register batch ``batch``'s partition and queue its shards on the actors (no wait).

        Args:
            batch: Rollout batch index (the step that will train it).
            problems: The batch's problems (``prompt``, ``answer``).
            seeds: One sampling seed per row (prompt-major, ``len(problems) * group_size``).

        Returns:
            The partition id.

        Raises:
            ValueError: ``seeds`` does not match the row count, or the partition is live.
        """
        g = self.group_size
        n = len(problems) * g
        if len(seeds) != n:
            raise ValueError(f"RolloutGroup.dispatch: {len(seeds)} seeds for {n} rows (batch {batch})")
        pid = partition_for_batch(batch)
        self._client.register_partition(
            pid,
            fields=list(STREAM_FIELDS),
            num_samples=n,
            consumer_tasks=[TASK_PREV_LP, TASK_REF_LP, TASK_TRAIN],
            grpo_group_size=g,
        )
        self._live.add(pid)
        prompts = [self._tokenizer.encode_prompt(p.prompt) for p in problems for _ in range(g)]
        answers = [p.answer for p in problems for _ in range(g)]
        ids = [f"a{batch}_p{j}_g{i}" for j in range(len(problems)) for i in range(g)]
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
                shard, partition_id=pid, tokenizer=self._tokenizer, env=self._env
            )
            self._pending.append(RolloutShard(batch, w, ref, b - a))
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
                self.stats.generated += int(info["rows"])
                self.stats.gen_s += float(info["gen_s"])
                self.stats.put_s += float(info["put_s"])
                self.stats.busy_s += float(info["gen_s"]) + float(info["put_s"])
                self.stats.finished.append(dict(info, batch=s.batch, worker=s.worker))
            else:
                still.append(s)
        self._pending = still

    def claim_batch(self, batch: int, num_rows: int, *, poll_s: float, timeout_s: float) -> KVBatchMeta:
        """Claim batch ``batch``'s rows as they become ready; rows in the synchronous order.

        Args:
            batch: Rollout batch index.
            num_rows: Rows of the batch.
            poll_s: Sleep between non-blocking claims.
            timeout_s: Bound on the whole wait.

        Returns:
            One meta over all ``num_rows`` rows, sorted by their ``ordinal`` tag.

        Raises:
            TimeoutError: The rows did not all arrive within ``timeout_s``.
            ValueError: A claimed row lacks its tags.
            Exception: The first failure of a rollout shard, re-raised.
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
        self._collect_finished()
        meta = parts[0].concat(*parts[1:])
        if meta.tags is None or any(TAG_ORDINAL not in t for t in meta.tags):
            raise ValueError(f"RolloutGroup.claim_batch: claimed rows of {pid!r} lack the {TAG_ORDINAL!r} tag")
        order = sorted(range(meta.size), key=lambda i: int(meta.tags[i][TAG_ORDINAL]))  # type: ignore[index]
        return meta.subset(order)

    def finish_batch(self, batch: int) -> None:
        """Drop batch ``batch``'s partition (its rows were trained).

        Args:
            batch: Rollout batch index.
        """
        pid = partition_for_batch(batch)
        if pid in self._live:
            self._live.discard(pid)
            self._client.clear_samples(None, pid)

    def occupancy(self) -> int:
        """Rows currently held in the store by live rollout partitions (claimed or not).

        Returns:
            The row count.
        """
        return sum(len(self._client.list_sample_ids(pid)) for pid in sorted(self._live))

    def in_flight_batches(self) -> list[int]:
        """Batches dispatched but not yet finished (generated-but-untrained or generating).

        Returns:
            Sorted batch indices.
        """
        return sorted(int(pid[len(ROLLOUT_PARTITION_PREFIX):]) for pid in self._live)

    def _kill(self) -> None:
        import ray

        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # noqa: BLE001 - actor already gone
                pass
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
                    try:
                        ray.get(ref)
                    except Exception:  # noqa: BLE001 - the run is already failing or done
                        pass
                if len(done) < len(refs):
                    self._kill()
            for pid in sorted(self._live):
                try:
                    self._client.clear_samples(None, pid)
                except Exception:  # noqa: BLE001 - best effort: the system may be closing
                    pass
            self._live.clear()
            if self.workers:
                try:
                    ray.get([w.shutdown.remote() for w in self.workers], timeout=30)
                except Exception:  # noqa: BLE001 - the actors are killed next anyway
                    pass
        finally:
            self._pending = []
            self._kill()
