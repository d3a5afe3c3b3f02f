"""Checks a client runs before anything of a call leaves its process, and the put's plan.

Every check that needs no partition state runs in the calling process before a byte goes to the
object store; those that need the partition (declared fields, dtypes, enums) run in the
metadata actor (``state``) before it commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase

from nemo_dp.data_plane.adapters._validation import TENSOR_LEAF, check_put_args, wire_leaf_kind

__all__ = ["PutPlan", "plan_put"]


@dataclass
class PutPlan:
    """A put checked as far as possible without the partition; nothing sent yet.

    Attributes:
        tensors: field -> tensor leaf (encoded and ``ray.put`` by the client).
        objects: field -> per-row Python values.
        names: Every field of the put, in the TensorDict's order.
        tags: JSON-normalised detached per-row tags, or ``None``.
    """

    ids: list[str]
    tensors: dict[str, torch.Tensor]
    objects: dict[str, list[Any]]
    names: list[str]
    tags: list[dict[str, Any]] | None


def plan_put(
    partition_id: str, sample_ids: Sequence[str], fields: TensorDictBase | None, tags: Sequence[dict] | None
) -> PutPlan:
    """Validate a put's arguments.

    Raises:
        ValueError: As :func:`~nemo_dp.data_plane.adapters._validation.check_put_args`.
        TypeError: As ``check_put_args``, or a leaf that is not a tensor or a per-row
            ``NonTensorStack``.
    """
    args = check_put_args(partition_id, sample_ids, fields, tags)
    n = len(args.ids)
    tensors: dict[str, torch.Tensor] = {}
    objects: dict[str, list[Any]] = {}
    for name in args.names:
        leaf = fields.get(name)  # type: ignore[union-attr]
        if wire_leaf_kind(name, leaf, n) == TENSOR_LEAF:
            tensors[name] = leaf
        else:
            objects[name] = leaf.tolist()
    return PutPlan(args.ids, tensors, objects, args.names, args.tags)
