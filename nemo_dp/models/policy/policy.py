"""``Policy``: the driver-side facade over a group of ``PolicyWorker`` Ray actors (results in input order)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from omegaconf import DictConfig, OmegaConf

from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.distributed.worker_group import RayCluster, RayWorkerGroup
from nemo_dp.models.builders import policy_for_workers
from nemo_dp.utils.packed_tensor import IMAGE_FIELDS
from nemo_dp.models.policy.images import wire_prompt
from nemo_dp.models.policy.worker import COUNT_METRICS, PolicyWorker

__all__ = ["Policy"]

_ROW_IDX = "__row_idx"
_MB_TOKENS_KEYS: tuple[str, ...] = ("logprob_mb_tokens", "train_mb_tokens")


def _as_dictconfig(cfg: Any) -> DictConfig:
    if isinstance(cfg, DictConfig):
        return cfg
    return OmegaConf.structured(cfg) if not isinstance(cfg, Mapping) else OmegaConf.create(dict(cfg))


class Policy:
    """The policy: ``dp_size`` workers, each a model replica with its optimizer; ``self.cfg`` is a ``DictConfig``."""

    #: The worker class the group runs; a data-plane subclass swaps in its mixed-in worker.
    worker_class: ClassVar[type] = PolicyWorker

    def __init__(
        self, *, cluster: RayCluster, config: Any, vocab_size: int, pad_id: int, eos_id: int, seed: int,
        name_prefix: str = "policy",
    ) -> None:
        self.cfg = _as_dictconfig(config)
        self.dp_size = int(self.cfg.dp_size)
        self.pad_id = pad_id
        self.eos_id = eos_id
        self.name_prefix = name_prefix
        worker_cfg = policy_for_workers(self.cfg)
        self.worker_group = RayWorkerGroup(
            self.worker_class,
            world_size=self.dp_size,
            init_kwargs={
                "policy_cfg": worker_cfg, "vocab_size": vocab_size, "pad_id": pad_id, "eos_id": eos_id, "seed": seed,
            },
            cluster=cluster,
            name_prefix=name_prefix,
        )

    def _packing_args(self, mb_tokens_key: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """Planner arguments ``(sequence_packing_args, dynamic_batching_args)``; dynamic batching wins if both are on.

        Raises ``ValueError`` for an unknown ``mb_tokens_key``.
        """
        if mb_tokens_key not in _MB_TOKENS_KEYS:
            raise ValueError(f"mb_tokens_key must be one of {list(_MB_TOKENS_KEYS)}, got {mb_tokens_key!r}")
        db = self.cfg.dynamic_batching
        if db.enabled:
            return None, {
                "max_tokens_per_microbatch": int(db[mb_tokens_key]),
                "sequence_length_round": int(db.sequence_length_round),
                "input_key": "input_ids",
                "input_lengths_key": "input_lengths",
            }
        sp = self.cfg.sequence_packing
        if sp.enabled:
            return {
                "max_tokens_per_microbatch": int(sp[mb_tokens_key]),
                "algorithm": str(sp.algorithm),
                "sequence_length_pad_multiple": int(sp.sequence_length_pad_multiple),
                "input_key": "input_ids",
                "input_lengths_key": "input_lengths",
                "microbatch_order": str(sp.microbatch_order),
            }, None
        return None, None

    def _shard_for_dp(
        self, data: BatchedDataDict, *, batch_size: int | None, mb_tokens_key: str
    ) -> tuple[list[BatchedDataDict], list[int]]:
        """``(shards, order)``: ``data`` over the DP ranks; ``order[p]`` is the input index of concatenated row ``p``.

        ``batch_size`` None makes the whole batch one chunk.  Raises ``ValueError`` when the batch is
        empty or does not divide over the ranks / global batches.
        """
        n = data.size
        if n == 0:
            raise ValueError(f"{self.name_prefix}: cannot shard an empty batch")
        bs = n if batch_size is None else int(batch_size)
        if n % bs != 0 or bs % self.dp_size != 0:
            raise ValueError(
                f"{self.name_prefix}: batch of {n} rows does not split into global batches of {bs} "
                f"over dp_size={self.dp_size} ranks (need size % batch_size == 0 and "
                f"batch_size % dp_size == 0)"
            )
        spa, dba = self._packing_args(mb_tokens_key)
        tagged = BatchedDataDict(dict(data))
        tagged[_ROW_IDX] = torch.arange(n, dtype=torch.long)
        result = tagged.shard_by_batch_size(self.dp_size, bs, dynamic_batching_args=dba, sequence_packing_args=spa)
        shards = result[0] if isinstance(result, tuple) else result
        order: list[int] = []
        for shard in shards:
            order.extend(int(i) for i in shard[_ROW_IDX].tolist())
            del shard[_ROW_IDX]
        return list(shards), order

    def _dispatch_sharded(self, method: str, shards: Sequence[Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method(shard_r, *args, **kwargs)`` on every rank ``r``; results in rank order."""
        return self.worker_group.run_sharded(method, shards, *args, **kwargs)

    def _dispatch_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method(*args, **kwargs)`` on every rank; results in rank order."""
        return self.worker_group.run_all(method, *args, **kwargs)

    def _prompt_shards(self, prompts: Sequence[Any], seeds: Sequence[int], **lists: Sequence[Any]) -> list[dict]:
        """Rank ``r``'s contiguous run of ``ceil(n / dp_size)`` prompts, seeds and ``lists`` entries per shard."""
        n = len(prompts)
        per = -(-n // self.dp_size)
        bounds = [(min(r * per, n), min((r + 1) * per, n)) for r in range(self.dp_size)]
        return [
            {
                "prompts": [wire_prompt(p) for p in prompts[a:b]],
                "seeds": [int(s) for s in seeds[a:b]],
                **{k: list(v[a:b]) for k, v in lists.items()},
            }
            for a, b in bounds
        ]

    def _per_token(self, method: str, data: BatchedDataDict, key: str) -> BatchedDataDict:
        """``{key: float32 [B, S]}`` in input order from worker ``method`` over the log-prob view of ``data``."""
        extra = {k: data[k] for k in ("token_mask", *IMAGE_FIELDS) if k in data}
        view = BatchedDataDict({"input_ids": data["input_ids"], "input_lengths": data["input_lengths"], **extra})
        shards, order = self._shard_for_dp(view, batch_size=None, mb_tokens_key="logprob_mb_tokens")
        out = BatchedDataDict.from_batches(self._dispatch_sharded(method, shards)).reorder_data(order)
        width = data["input_ids"].shape[1]
        value = out[key]
        if value.shape[1] < width:
            value = torch.nn.functional.pad(value, (0, width - value.shape[1]))
        return BatchedDataDict({key: value[:, :width].contiguous()})

    @staticmethod
    def _aggregate_train_results(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Combine per-rank ``{"per_step": [...]}`` into metrics, ``num_optimizer_steps``, ``per_step_loss``.

        Metric shares are summed over ranks, then averaged over the call's global batches (counts
        are summed instead); ``grad_norm`` and ``lr`` (the same on all ranks) are averaged.
        """
        per_rank = [r["per_step"] for r in results]
        n_steps = len(per_rank[0])
        if any(len(p) != n_steps for p in per_rank):
            raise RuntimeError(f"ranks ran different numbers of steps: {[len(p) for p in per_rank]}")
        step_values: dict[str, list[float]] = {}
        for k in range(n_steps):
            ranks = [p[k] for p in per_rank if p[k].get("is_replica_leader", True)]
            for key in [key for key in ranks[0] if key not in ("is_replica_leader", "skipped")]:
                same = key in ("grad_norm", "lr")
                value = float(ranks[0][key]) if same else float(sum(float(m[key]) for m in ranks))
                step_values.setdefault(key, []).append(value)
        out: dict[str, Any] = {
            key: float(sum(values)) if key in COUNT_METRICS else float(sum(values) / len(values))
            for key, values in step_values.items()
        }
        out["num_optimizer_steps"] = n_steps
        out["per_step_loss"] = step_values.get("loss", [])
        return out

    def generate(
        self, prompts: Sequence[Any], seeds: Sequence[int], *, greedy: bool, return_images: bool = True
    ) -> BatchedDataDict:
        """Generate one response per prompt over the workers; each row's own seed makes it independent of ``dp_size``.

        ``prompts`` are token ids (bos included) or ``VisualPrompt`` specs; ``return_images=False``
        keeps image columns on the workers.  Returns ``generation.generate``'s fields in prompt order
        (``ValueError`` for no prompts or mismatched seeds).
        """
        n = len(prompts)
        if n == 0:
            raise ValueError(f"{self.name_prefix}.generate: no prompts")
        if len(seeds) != n:
            raise ValueError(f"{self.name_prefix}.generate: {len(seeds)} seeds for {n} prompts")
        shards = self._prompt_shards(prompts, seeds)
        outs = self._dispatch_sharded("generate", shards, greedy, return_images=return_images)
        parts = [o for o in outs if len(o) > 0]
        return BatchedDataDict.from_batches(parts, pad_value_dict={"input_ids": self.pad_id})

    def get_logprobs(self, data: BatchedDataDict) -> BatchedDataDict:
        """``{"logprobs": float32 [B, S]}`` of ``input_ids`` under the current policy, in input order.

        Column 0 and padding are 0; with a ``token_mask`` [B, S] so are a row's columns before its
        first masked token (all of a row with none), since the LM head skips the prompt.
        """
        return self._per_token("get_logprobs", data, "logprobs")

    def get_reference_policy_logprobs(self, data: BatchedDataDict) -> BatchedDataDict:
        """Like :meth:`get_logprobs` under the frozen reference policy, as ``{"reference_logprobs": ...}``."""
        return self._per_token("get_reference_policy_logprobs", data, "reference_logprobs")

    def train(self, data: BatchedDataDict, loss_fn: Any, eval_mode: bool = False, gbs: int | None = None,
              mbs: int | None = None) -> dict[str, Any]:
        """Train on ``data``: one optimizer step per ``gbs`` rows; returns ``_aggregate_train_results``.

        ``eval_mode``: loss only.  ``gbs`` / ``mbs`` default to ``policy.train_global_batch_size`` /
        ``policy.train_micro_batch_size`` (rows per microbatch without a plan).
        """
        gbs = int(gbs or self.cfg.train_global_batch_size)
        shards, _ = self._shard_for_dp(data, batch_size=gbs, mb_tokens_key="train_mb_tokens")
        results = self._dispatch_sharded("train", shards, loss_fn=loss_fn, eval_mode=eval_mode, gbs=gbs, mbs=mbs)
        return self._aggregate_train_results(results)

    def snapshot_reference_policy(self) -> None:
        """Freeze the current weights as the reference policy (start of an RL phase)."""
        self._dispatch_all("snapshot_reference_policy")

    def reset_optimizer(self, lr: float, decay_steps: int | None = None, warmup_steps: int | None = None) -> None:
        """Fresh optimizer state at ``lr`` on every rank for a phase (``warmup_steps`` None: the config's)."""
        self._dispatch_all(
            "reset_optimizer",
            float(lr),
            None if decay_steps is None else int(decay_steps),
            None if warmup_steps is None else int(warmup_steps),
        )

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state ``{"weights": rank 0's weights/optimizer, "worker_rng": [per rank]}``."""
        states = [self.worker_group.run_rank(r, "get_state", include_weights=(r == 0)) for r in range(self.dp_size)]
        weights = {k: v for k, v in states[0].items() if k not in ("rng", "rank")}
        return {"weights": weights, "worker_rng": [s["rng"] for s in states]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output on every rank (``ValueError`` unless one RNG state per rank)."""
        rngs = list(state["worker_rng"])
        if len(rngs) != self.dp_size:
            raise ValueError(
                f"{self.name_prefix}: checkpoint has {len(rngs)} worker RNG states but "
                f"policy.dp_size={self.dp_size}"
            )
        weights = copy.copy(state["weights"])
        import ray

        ray.get([w.load_state.remote(weights, rngs[r]) for r, w in enumerate(self.worker_group.workers)])

    def load_initial_weights(self, model_state: Mapping[str, Any]) -> None:
        """Make ``model_state`` (``policy.init_from``) the trained and reference model on every rank.

        The optimizer stays fresh and the RNG streams are kept; a state that does not fit raises
        torch's ``RuntimeError``.
        """
        import ray

        from nemo_dp.utils.checkpoint import PRETRAINED_KEY

        current = self.worker_group.run_rank(0, "get_state", include_weights=True)
        weights = {k: v for k, v in current.items() if k not in ("rng", "rank", PRETRAINED_KEY)}
        weights["model"] = dict(model_state)
        weights["reference_model"] = dict(model_state)
        ray.get([w.load_state.remote(weights, None) for w in self.worker_group.workers])

    def weights_checksums(self) -> list[float]:
        """Per-rank parameter checksums (equal when the replicas agree)."""
        return [float(x) for x in self._dispatch_all("weights_checksum")]

    def shutdown(self) -> None:
        """Stop the workers (idempotent)."""
        self.worker_group.shutdown()
