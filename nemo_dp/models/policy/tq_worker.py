"""``TQPolicyWorker``: the policy worker with the data-plane entrypoints and rollout into the store mixed in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nemo_dp.data_plane.column_io import first_write
from nemo_dp.data_plane.interfaces import KVBatchMeta
from nemo_dp.data_plane.schema import GENERATION_LOGPROBS, INPUT_IDS, INPUT_LENGTHS, SAMPLE_MASK, TOKEN_MASK
from nemo_dp.data_plane.worker_mixin import TQWorkerMixin
from nemo_dp.models.policy.rollout_worker import PROMPT_LENGTHS, rollout_columns, score_rollout
from nemo_dp.models.policy.scoring_pair import ScoringPairHolder
from nemo_dp.models.policy.sft_loader_worker import ColocatedLoaderMixin
from nemo_dp.models.policy.worker import PolicyWorker

__all__ = ["TQPolicyWorker", "PROMPT_LENGTHS", "ROLLOUT_STORE_FIELDS", "CARRY_KEYS"]

#: Columns a rollout writes into the store (bulk per-token columns plus two per-row ones).
ROLLOUT_STORE_FIELDS: tuple[str, ...] = (
    INPUT_IDS, INPUT_LENGTHS, PROMPT_LENGTHS, GENERATION_LOGPROBS, TOKEN_MASK, SAMPLE_MASK,
)

#: Keys of the per-row ``driver_carry`` (all 1-D, one value per sample).
CARRY_KEYS: tuple[str, ...] = ("rewards", "input_lengths", "prompt_lengths", "response_lengths", "truncated")


class TQPolicyWorker(ColocatedLoaderMixin, TQWorkerMixin, PolicyWorker):
    """A ``PolicyWorker`` with the store entrypoints (the mixin first, so its hooks see ``PolicyWorker``'s)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._scoring = ScoringPairHolder(f"TQPolicyWorker[{self.rank}]")

    def generate_into_store(
        self, shard: Mapping[str, Sequence[Any]], greedy: bool, *, partition_id: str, task_name: str | None,
        tokenizer: Any = None, env: Any = None, return_responses: bool = False, scoring_digest: str | None = None,
    ) -> dict[str, Any]:
        """Generate this rank's prompts (as ``generate``), score them and write the bulk columns to the store.

        ``shard`` is ``{"prompts", "seeds", "sample_ids", "answers"}``.  ``scoring_digest`` names the
        ``tokenizer`` and ``env`` pair: sent with them, the worker keeps the pair; sent alone, it scores
        with the pair it keeps under that digest.  Returns ``{"meta", "carry", "responses"}``: the
        receipt (``None`` for an empty shard), the per-row ``CARRY_KEYS`` (plus each ``reward/<fn>`` of
        several rewards), nothing per-token.  Raises ``ValueError`` for misaligned lists,
        ``RuntimeError`` without a data-plane client or without the pair a digest names.
        """
        tokenizer, env = self._scoring.resolve(tokenizer, env, scoring_digest)
        prompts, seeds = shard["prompts"], shard["seeds"]
        sample_ids, answers = list(shard["sample_ids"]), list(shard["answers"])
        n = len(prompts)
        if not (len(seeds) == len(sample_ids) == len(answers) == n):
            raise ValueError(
                f"TQPolicyWorker[{self.rank}].generate_into_store: prompts ({n}), seeds "
                f"({len(seeds)}), sample_ids ({len(sample_ids)}) and answers ({len(answers)}) "
                "must align"
            )
        client = self._require_dp_client()
        if n == 0:
            return {"meta": None, "carry": {}, "responses": [] if return_responses else None}
        out = self.generate({"prompts": prompts, "seeds": seeds}, greedy)
        responses, rewards, scored = score_rollout(out, tokenizer, env, answers)
        columns = rollout_columns(out, torch.ones(n, dtype=torch.float32))
        meta: KVBatchMeta | None = None
        if self._is_replica_leader():
            meta = first_write(
                columns, sample_ids=sample_ids, dp_client=client, partition_id=partition_id, task_name=task_name
            )
        carry = {
            "rewards": rewards,
            "input_lengths": out[INPUT_LENGTHS].to(torch.int32),
            "prompt_lengths": out[PROMPT_LENGTHS].to(torch.int32),
            "response_lengths": out[TOKEN_MASK].sum(dim=1).to(torch.int32),
            "truncated": out["truncated"].to(torch.bool),
            **scored,
        }
        return {"meta": meta, "carry": carry, "responses": responses if return_responses else None}

    def shutdown(self) -> None:
        """Forget the colocated loader, close this worker's data-plane client, then leave the process group."""
        self.close_colocated_loader()
        client, self.dp_client = self.dp_client, None
        try:
            if client is not None:
                client.close()
        finally:
            super().shutdown()
