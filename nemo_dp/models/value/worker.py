"""``ValueWorker``: a ``PolicyWorker`` over a ``ValueModel``; the loss receives ``[b, s]`` values in place of logits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.models.builders import build_model, cfg_get
from nemo_dp.models.policy.worker import PolicyWorker
from nemo_dp.models.token_ops import align_values
from nemo_dp.models.value_model import BACKBONE_PREFIX, VALUE_HEAD_PREFIX, ValueModel

__all__ = ["ValueWorker", "VALUE_HEAD_PARAMS"]

#: Parameters that exist only in the value head (not copied from a policy checkpoint).
VALUE_HEAD_PARAMS: frozenset[str] = frozenset({f"{VALUE_HEAD_PREFIX}weight"})


class ValueWorker(PolicyWorker):
    """One critic DP rank; its unused reference copy keeps the inherited checkpoint methods working."""

    def _build_model(self) -> torch.nn.Module:
        # A zero-initialised head: the first advantages are the whitened reward-to-go, not noise.
        return ValueModel(build_model(self.cfg, vocab_size=self.vocab_size, seed=self.seed))

    def generate(self, shard: Mapping[str, Any], greedy: bool) -> BatchedDataDict:
        """Raises ``RuntimeError``, as do the log-prob methods: the critic has no LM head."""
        raise RuntimeError(f"ValueWorker[{self.rank}]: a value model cannot generate")

    def get_logprobs(self, data: BatchedDataDict, micro_batch_size: int | None = None) -> BatchedDataDict:
        raise RuntimeError(f"ValueWorker[{self.rank}]: a value model has no log-probs; use get_values")

    def get_reference_policy_logprobs(
        self, data: BatchedDataDict, micro_batch_size: int | None = None
    ) -> BatchedDataDict:
        raise RuntimeError(f"ValueWorker[{self.rank}]: a value model has no reference policy")

    @torch.no_grad()
    def get_values(self, data: BatchedDataDict, micro_batch_size: int | None = None) -> BatchedDataDict:
        """Like ``get_logprobs``, but ``{"values": float32 [b, S]}`` of ``tokens < t`` (0 at column 0, padding)."""
        self.model.eval()
        mbs = int(micro_batch_size or cfg_get(self.cfg, "logprob_batch_size"))
        out = torch.zeros((data.size, data["input_ids"].shape[1]), dtype=torch.float32)
        for spec, mb, w in self._micro_batches(data, mbs):
            values = align_values(self._forward(self.model, mb["input_ids"][:, :w].to(self.device))).cpu()
            lengths = mb["input_lengths"].to(torch.long)
            valid = torch.arange(w).unsqueeze(0) < lengths.unsqueeze(1)
            out[spec.start : spec.end, :w] = values * valid
        return BatchedDataDict({"values": out})

    def init_trunk_from(self, policy_model_state: Mapping[str, torch.Tensor]) -> int:
        """Copy every tensor but the value head from a policy state dict and rebuild the optimizer; return the count.

        Raises ``KeyError`` for a missing backbone tensor, ``ValueError`` for a shape that differs.
        """
        own = self.model.state_dict()
        backbone = {k[len(BACKBONE_PREFIX) :]: v for k, v in own.items() if k.startswith(BACKBONE_PREFIX)}
        for key, value in backbone.items():
            if key not in policy_model_state:
                raise KeyError(f"ValueWorker.init_trunk_from: policy state lacks {key!r}")
            if tuple(policy_model_state[key].shape) != tuple(value.shape):
                raise ValueError(
                    f"ValueWorker.init_trunk_from: {key!r} has shape "
                    f"{tuple(policy_model_state[key].shape)} in the policy, {tuple(value.shape)} "
                    "in the critic (algorithm.value must use the policy's model)"
                )
        new_state = {BACKBONE_PREFIX + k: policy_model_state[k] for k in backbone}
        new_state.update({k: own[k] for k in VALUE_HEAD_PARAMS})
        self.model.load_state_dict(new_state)
        self.reference_model = self._frozen_copy(self.model)
        self.optimizer = self._make_optimizer(self.lr)
        return len(backbone)
