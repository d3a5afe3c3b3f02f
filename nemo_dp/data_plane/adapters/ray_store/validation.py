"""Checks a client runs before anything of a call leaves its process, and the put's plan.

Why this module exists: bad input must fail before anything is written, and every check that
needs no partition state (id and name types, duplicates, batch sizes, tags that are not JSON,
unsupported leaves) can run in the calling process before a byte goes to the object store.  The
checks that need the partition (declared fields, a field's dtype, enum vocabularies) run in the
metadata actor (``state``) before it commits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDictBase

from nemo_dp.data_plane.adapters._validation import duplicates
from nemo_dp.data_plane.adapters._validation import check_names, listed
from nemo_dp.data_plane.schema import INPUT_LENGTHS, TAG_INPUT_LENGTHS
from nemo_dp.utils.checkpoint_io import validate_json_metadata

__all__ = ["PutPlan", "check_read_args", "plan_put", "receipt_lengths"]


@dataclass
class PutPlan:
    """A put checked as far as possible without the partition; nothing sent yet.

    Attributes:
        ids: Sample ids, in put order.
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
    partition_id: str,
    sample_ids: Sequence[str],
    fields: TensorDictBase | None,
    tags: Sequence[dict] | None,
) -> PutPlan:
    """Validate a put's arguments.

    Raises:
        ValueError: Neither fields nor tags (or fields without columns and no tags), duplicate
            ids, batch size or tags length differing from the ids.
        TypeError: Non-str ids, fields not a TensorDict, a tag that is not a JSON-compatible
            dict, a nested TensorDict, a whole-column ``NonTensorData`` or another unsupported
            leaf.
    """
    ids = check_names(sample_ids, "sample_ids")
    if fields is None and tags is None:
        raise ValueError("put_samples needs fields or tags (got neither)")
    if dups := duplicates(ids):
        raise ValueError(f"duplicate sample ids in one put to {partition_id!r}: {listed(dups)}")
    n = len(ids)
    names: list[str] = []
    if fields is not None:
        if not isinstance(fields, TensorDictBase):
            raise TypeError(f"fields must be a TensorDict, got {type(fields).__name__}")
        if fields.batch_dims != 1 or fields.batch_size[0] != n:
            raise ValueError(
                f"fields batch_size {tuple(fields.batch_size)} does not match {n} sample ids "
                f"(expected ({n},))"
            )
        names = list(fields.keys())
    tag_list: list[dict[str, Any]] | None = None
    if tags is not None:
        if isinstance(tags, (str, bytes, Mapping)) or not isinstance(tags, Sequence):
            raise TypeError(f"tags must be a sequence of dicts, got {type(tags).__name__}")
        if len(tags) != n:
            raise ValueError(f"tags has {len(tags)} entries for {n} sample ids")
        tag_list = []
        for i, t in enumerate(tags):
            if not isinstance(t, Mapping):
                raise TypeError(f"tags[{i}] must be a dict, got {type(t).__name__}")
            try:
                tag_list.append(validate_json_metadata(t))
            except (TypeError, ValueError) as exc:
                raise TypeError(f"tags[{i}] is not JSON-compatible: {exc}") from exc
    if fields is not None and not names and tag_list is None:
        raise ValueError("put_samples needs fields or tags (fields has no columns)")
    tensors: dict[str, torch.Tensor] = {}
    objects: dict[str, list[Any]] = {}
    for name in names:
        leaf = fields.get(name)  # type: ignore[union-attr]
        if isinstance(leaf, NonTensorStack):
            values = leaf.tolist()
            if len(values) != n:
                raise ValueError(f"field {name!r}: non-tensor column has {len(values)} rows, expected {n}")
            objects[name] = values
        elif isinstance(leaf, NonTensorData):
            raise TypeError(
                f"field {name!r} is a NonTensorData (one non-tensor object for the whole column); "
                "this store keeps one value per row - use a per-row NonTensorStack "
                "(pack_jagged_fields builds one)"
            )
        elif isinstance(leaf, TensorDictBase):
            raise TypeError(
                f"field {name!r} is a nested TensorDict; only tensors and per-row "
                "NonTensorStack columns are fields"
            )
        elif isinstance(leaf, torch.Tensor):
            tensors[name] = leaf
        else:
            raise TypeError(f"field {name!r} has unsupported type {type(leaf).__name__}")
    return PutPlan(ids, tensors, objects, names, tag_list)


def check_read_args(sample_ids: Any, select_fields: Any) -> tuple[list[str], list[str]]:
    """Validate a read's ids and fields.

    Returns:
        ``(ids, fields)``.

    Raises:
        ValueError: ``select_fields`` missing or empty; duplicate fields or ids.
        TypeError: Non-str entries.
    """
    if select_fields is None:
        raise ValueError("get_samples needs a non-empty select_fields (no 'fetch everything')")
    fields = check_names(select_fields, "select_fields")
    if not fields:
        raise ValueError("get_samples needs a non-empty select_fields (no 'fetch everything')")
    if dups := duplicates(fields):
        raise ValueError(f"select_fields must be unique; duplicated: {dups}")
    ids = check_names(sample_ids, "sample_ids")
    if dups := duplicates(ids):
        raise ValueError(f"duplicate sample ids in one get: {listed(dups)}")
    return ids, fields


def receipt_lengths(
    tensors: Mapping[str, torch.Tensor], tags: list[dict[str, Any]] | None
) -> list[int] | None:
    """A put receipt's ``sequence_lengths``: the ``input_lengths`` column, else the tags'."""
    col = tensors.get(INPUT_LENGTHS)
    if (
        isinstance(col, torch.Tensor)
        and not col.is_nested
        and col.dim() == 1
        and not (col.is_floating_point() or col.is_complex() or col.dtype == torch.bool)
    ):
        return [int(x) for x in col.tolist()]
    if tags and all(TAG_INPUT_LENGTHS in t for t in tags):
        values = [t[TAG_INPUT_LENGTHS] for t in tags]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return [int(v) for v in values]
    return None
