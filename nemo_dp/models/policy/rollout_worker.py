"""``RolloutWorker``: a rollout actor with its own model copy that generates as ``PolicyWorker.generate``,
scores, computes group advantages and writes the rows tagged with their ``policy_version``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict

from nemo_dp.data_plane.column_io import first_write
from nemo_dp.data_plane.factory import build_data_plane_client
from nemo_dp.data_plane.schema import (
    ADVANTAGES, DP_TRAIN_FIELDS, GENERATION_LOGPROBS, INPUT_IDS, INPUT_LENGTHS, SAMPLE_MASK, TAG_BASELINE,
    TAG_INPUT_LENGTHS, TAG_STD, TOKEN_MASK,
)
from nemo_dp.environments.weighted import score_parts
from nemo_dp.models.builders import build_model
from nemo_dp.models.policy.images import generate_rows
from nemo_dp.models.policy.scoring_pair import ScoringPairHolder
from nemo_dp.models.policy.worker import configure_worker_process
from nemo_dp.models.precision import resolve_precision
from nemo_dp.models.token_ops import rollout_sample_mask
from nemo_dp.utils.packed_tensor import IMAGE_FIELDS

__all__ = [
    "POLICY_VERSION", "TAG_ORDINAL", "PROMPT_LENGTHS", "ROLLOUT_PARTITION_PREFIX", "STREAM_FIELDS", "AdvantageFn",
    "RolloutWorker", "partition_for_batch", "shard_bounds",
]

#: Per-row column and tag: the policy version whose weights generated the row.
POLICY_VERSION = "policy_version"
#: Tag: the row's position in its rollout batch (prompt-major), i.e. the synchronous order.
TAG_ORDINAL = "ordinal"
PROMPT_LENGTHS = "prompt_lengths"
ROLLOUT_PARTITION_PREFIX = "async_rollout_b"
#: Columns of a streamed rollout partition.
STREAM_FIELDS: tuple[str, ...] = tuple(dict.fromkeys((*DP_TRAIN_FIELDS, PROMPT_LENGTHS, POLICY_VERSION)))


def partition_for_batch(batch: int) -> str:
    """The store partition id of 1-based rollout batch ``batch`` (= the trainer step that trains it)."""
    return f"{ROLLOUT_PARTITION_PREFIX}{int(batch)}"


#: ``rewards [N] -> (baseline [N], std [N], advantages [N])`` over contiguous whole groups; must
#: be picklable (it travels to the actors).  The trainer supplies it from its algorithm config.
AdvantageFn = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def score_rollout(out: Mapping[str, Any], tokenizer: Any, env: Any, answers: Sequence[Any]) -> tuple[list, Any, dict]:
    """``(responses, rewards, other reward parts)`` of generated rows, decoded and scored by ``env``."""
    ids, starts, ends = out[INPUT_IDS], out[PROMPT_LENGTHS].tolist(), out[INPUT_LENGTHS].tolist()
    responses = [tokenizer.decode(ids[i, int(s) : int(e)].tolist()) for i, (s, e) in enumerate(zip(starts, ends))]
    scored = score_parts(env, responses, answers)
    return responses, scored.pop("rewards"), scored


def rollout_columns(out: Mapping[str, Any], sample_mask: torch.Tensor, **extra: torch.Tensor) -> dict[str, Any]:
    """The store columns of generated rows: the bulk per-token ones, ``sample_mask``, ``extra`` and any images."""
    columns = {k: out[k] for k in (INPUT_IDS, INPUT_LENGTHS, PROMPT_LENGTHS, GENERATION_LOGPROBS, TOKEN_MASK)}
    return {**columns, SAMPLE_MASK: sample_mask, **extra, **{k: out[k] for k in IMAGE_FIELDS if k in out}}


def shard_bounds(num_prompts: int, group_size: int, dp_size: int) -> list[tuple[int, int]]:
    """``dp_size`` half-open row ranges (possibly empty) of a rollout batch's shards, covering every row.

    ``Policy.generate``'s split (runs of ``ceil(n / dp_size)`` rows), or, when such a run would cut
    a GRPO group, runs of ``ceil(num_prompts / dp_size)`` whole groups.
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
    """One rollout actor: a model copy, its store client (attached to the driver's), generation + scoring."""

    def __init__(
        self, *, index: int, policy_cfg: Mapping[str, Any], group_size: int, overlong_filtering: bool,
        advantage_fn: AdvantageFn, vocab_size: int, pad_id: int, eos_id: int, seed: int, dp_cfg: Any,
        torch_threads: int,
    ) -> None:
        if int(group_size) < 1:
            raise ValueError(f"RolloutWorker[{index}]: group_size must be >= 1, got {group_size}")
        configure_worker_process(policy_cfg, int(torch_threads))
        self.index = index
        self.cfg = policy_cfg
        self.group_size = int(group_size)
        self.overlong_filtering = bool(overlong_filtering)
        self.advantage_fn = advantage_fn
        self.pad_id = pad_id
        self.eos_id = eos_id
        self.model = build_model(policy_cfg, vocab_size=int(vocab_size), seed=int(seed)).eval()
        self.precision = resolve_precision(policy_cfg)
        self.version: int | None = None
        self.dp_client = build_data_plane_client(dp_cfg, bootstrap=False)
        self._scoring = ScoringPairHolder(f"RolloutWorker[{index}]")

    def ready(self) -> int:
        """Round trip used to wait for construction; returns the actor's index."""
        return self.index

    def load_weights(self, state: Mapping[str, Any], version: int) -> int:
        """Load ``state["model"]`` (training rank 0's ``PolicyWorker.get_state``) as policy ``version``; return it."""
        self.model.load_state_dict(state["model"])
        self.model.eval()
        self.version = int(version)
        return self.version

    def generate_into_store(
        self, shard: Mapping[str, Sequence[Any]], *, partition_id: str, tokenizer: Any = None, env: Any = None,
        scoring_digest: str | None = None,
    ) -> dict[str, Any]:
        """Generate whole groups, score them (``env``), compute advantages and write the rows.

        ``shard`` is ``{"prompts", "seeds", "sample_ids", "answers", "ordinals"}`` of whole groups;
        ``scoring_digest`` names the ``tokenizer`` and ``env`` pair (see ``ScoringPairHolder``).
        One put writes every training column with the tags, then one put ``policy_version``, the
        column claims wait for.  Returns ``{"rows", "version", "gen_s", "put_s", "start", "end"}``.

        Raises:
            RuntimeError: No weights were loaded yet, or a digest alone names no pair this actor holds.
            ValueError: Misaligned lists or a shard that is not a whole number of groups.
        """
        tokenizer, env = self._scoring.resolve(tokenizer, env, scoring_digest)
        start = time.time()
        if self.version is None:
            raise RuntimeError(f"RolloutWorker[{self.index}]: generate_into_store before load_weights")
        prompts, seeds = shard["prompts"], shard["seeds"]
        ids, answers, ordinals = list(shard["sample_ids"]), list(shard["answers"]), list(shard["ordinals"])
        n = len(prompts)
        group = self.group_size
        if not (len(seeds) == len(ids) == len(answers) == len(ordinals) == n) or n == 0 or n % group:
            raise ValueError(
                f"RolloutWorker[{self.index}]: shard of {n} prompts, {len(seeds)} seeds, {len(ids)} ids, "
                f"{len(answers)} answers, {len(ordinals)} ordinals must align and hold whole groups of {group}"
            )
        t0 = time.perf_counter()
        with torch.no_grad():
            # The same chunking and call as PolicyWorker.generate, so rows are bit-identical.
            out = generate_rows(self, prompts, seeds, greedy=False)
        _, rewards, scored = score_rollout(out, tokenizer, env, answers)
        ends = out[INPUT_LENGTHS].tolist()
        baseline, std, adv = self.advantage_fn(rewards)
        if not (baseline.shape == std.shape == adv.shape == rewards.shape):
            raise ValueError(
                f"RolloutWorker[{self.index}]: advantage_fn returned shapes {tuple(baseline.shape)}, "
                f"{tuple(std.shape)}, {tuple(adv.shape)} for {n} rewards"
            )
        truncated = out["truncated"].to(torch.bool)
        sample_mask = rollout_sample_mask(truncated, overlong_filtering=self.overlong_filtering)
        token_mask = out[TOKEN_MASK]
        gen_s = time.perf_counter() - t0
        response_lengths = token_mask.sum(dim=1).to(torch.int32)
        columns = rollout_columns(out, sample_mask, **{ADVANTAGES: adv.unsqueeze(1) * token_mask.float()})
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
                # reward/<fn> of a list; None (not NaN: tags may go into JSON) = not applicable
                **{key: None if math.isnan(float(v[i])) else float(v[i]) for key, v in scored.items()},
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


