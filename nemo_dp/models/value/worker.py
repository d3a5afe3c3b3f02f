"""``ValueWorker``: one data-parallel rank of the PPO critic (a Ray actor).

Why this module exists: the critic is trained exactly like the policy - a model replica per DP
rank, its own AdamW optimizer, the same global-count loss normalisation, gradients all-reduced
over its own gloo group, the same microbatch plans - so it reuses ``PolicyWorker`` for all of
that and changes only the model (the same small transformer with a scalar value head) and the
forward-only method (``get_values`` instead of log-probs).  Because ``PolicyWorker.train``
hands the raw model output to the loss function, the critic's loss
(``ClippedValueLossFn``) receives the value head's ``[b, s]`` output in place of logits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from nemo_dp.algorithms.ppo_losses import align_values
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.models.model import TinyCausalLM
from nemo_dp.models.policy.worker import PolicyWorker, _cfg_get

__all__ = ["ValueWorker", "VALUE_HEAD_PARAMS"]

#: Parameters that exist only in the value head (not copied from a policy checkpoint).
VALUE_HEAD_PARAMS: frozenset[str] = frozenset({"head.weight"})


class ValueWorker(PolicyWorker):
    """One critic DP rank: value model, optimizer and gloo group membership.

    Constructed like ``PolicyWorker`` (``rank``, ``world_size``, ``policy_cfg`` = the critic's
    config node with the policy config's keys, ``vocab_size``, ``pad_id``, ``eos_id``,
    ``seed``).  The inherited reference copy is a frozen copy of the value model; it is never
    used for computation and exists only so that the inherited checkpoint state methods work
    unchanged.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # PolicyWorker builds a language model; swap in the value-head variant with the same
        # shape and seed, and rebuild what refers to the model's parameters.
        self.model = TinyCausalLM(self.model_config, value_head=True, seed=self.seed)
        self._zero_value_head()
        self.reference_model = self._frozen_copy(self.model)
        self.optimizer = self._make_optimizer(self.lr)

    def _zero_value_head(self) -> None:
        # The critic starts by predicting 0 everywhere: its first advantages are then the
        # (whitened) reward-to-go instead of noise from a random head, which would push the
        # warm-started policy in random directions before the critic has learned anything.
        with torch.no_grad():
            self.model.head.weight.zero_()

    # --- what a critic does not do ----------------------------------------------------------
    def generate(self, shard: Mapping[str, Any], greedy: bool) -> BatchedDataDict:
        """Not available: the critic has no language-model head.

        Raises:
            RuntimeError: Always.
        """
        raise RuntimeError(f"ValueWorker[{self.rank}]: a value model cannot generate")

    def get_logprobs(self, data: BatchedDataDict, micro_batch_size: int | None = None) -> BatchedDataDict:
        """Not available: the critic has no language-model head.

        Raises:
            RuntimeError: Always.
        """
        raise RuntimeError(f"ValueWorker[{self.rank}]: a value model has no log-probs; use get_values")

    def get_reference_policy_logprobs(
        self, data: BatchedDataDict, micro_batch_size: int | None = None
    ) -> BatchedDataDict:
        """Not available: the critic has no reference policy.

        Raises:
            RuntimeError: Always.
        """
        raise RuntimeError(f"ValueWorker[{self.rank}]: a value model has no reference policy")

    # --- values --------------------------------------------------------------------------------
    @torch.no_grad()
    def get_values(self, data: BatchedDataDict, micro_batch_size: int | None = None) -> BatchedDataDict:
        """Per-token values of this rank's shard (``values[:, t]`` = value of ``tokens < t``).

        Args:
            data: Shard with ``input_ids`` [b, S] and ``input_lengths`` [b] (a plan, if
                attached, is followed).
            micro_batch_size: Rows per forward pass (default ``logprob_batch_size``).

        Returns:
            ``{"values": float32 [b, S]}`` (column 0 and columns at or beyond each row's length
            are 0), rows in input order.
        """
        self.model.eval()
        mbs = int(micro_batch_size or _cfg_get(self.cfg, "logprob_batch_size"))
        width = data["input_ids"].shape[1]
        dynamic = data.micro_batch_indices is not None and data.elem_counts_per_gb is None
        out = torch.zeros((data.size, width), dtype=torch.float32)
        for spec in self._specs(data, mbs, None):
            mb = data.slice(spec.start, spec.end)
            w = self._mb_width(mb, spec, dynamic)
            values = align_values(self.model(mb["input_ids"][:, :w]))
            lengths = mb["input_lengths"].to(torch.long)
            valid = torch.arange(w).unsqueeze(0) < lengths.unsqueeze(1)
            out[spec.start : spec.end, :w] = values * valid
        return BatchedDataDict({"values": out})

    def init_trunk_from(self, policy_model_state: Mapping[str, torch.Tensor]) -> int:
        """Copy every parameter except the value head from a policy model state dict.

        Used to start the critic from the warm-started policy's representation; the optimizer
        is rebuilt (its state referred to the old tensors' values).

        Args:
            policy_model_state: ``TinyCausalLM.state_dict()`` of a policy with the same shape.

        Returns:
            The number of tensors copied.

        Raises:
            KeyError: A trunk parameter is missing from ``policy_model_state``.
            ValueError: A tensor's shape differs.
        """
        own = self.model.state_dict()
        trunk = {k: v for k, v in own.items() if k not in VALUE_HEAD_PARAMS}
        for key, value in trunk.items():
            if key not in policy_model_state:
                raise KeyError(f"ValueWorker.init_trunk_from: policy state lacks {key!r}")
            if tuple(policy_model_state[key].shape) != tuple(value.shape):
                raise ValueError(
                    f"ValueWorker.init_trunk_from: {key!r} has shape "
                    f"{tuple(policy_model_state[key].shape)} in the policy, {tuple(value.shape)} "
                    "in the critic (algorithm.value must use the policy's model shape)"
                )
        self.model.load_state_dict(
            {k: policy_model_state[k] for k in trunk} | {k: own[k] for k in VALUE_HEAD_PARAMS}
        )
        self.reference_model = self._frozen_copy(self.model)
        self.optimizer = self._make_optimizer(self.lr)
        return len(trunk)
