"""Argument checks of the TransferQueue adapter and the read/write transforms around the wire.

Why this module exists: every call is validated completely before anything reaches the
library (bad input fails before anything is written); these checks need no connection, so they
live apart from the client and its lifetime.  ``densify`` undoes the library's habit of
returning dense columns as jagged nested tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict

from nemo_dp.data_plane.adapters._base import coerce_dataclass_config
from nemo_dp.data_plane.adapters._validation import (
    OBJECT_LEAF,
    check_enum_put,
    check_put_args,
    check_undeclared,
    kind_changed,
    wire_leaf_kind,
)
from nemo_dp.data_plane.interfaces import DataPlaneConfig


def find_in_chain(exc: BaseException, name: str) -> BaseException | None:
    """First exception in ``exc``'s cause/context chain whose class is called ``name``."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if type(cur).__name__ == name:
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def densify(value: Any) -> Any:
    """Turn a nested column whose rows all share one shape into a dense tensor.

    The library packs every non-scalar column into a jagged nested tensor whose ``values()``
    are already contiguous rows; when all rows have one length the dense tensor is a view of
    that buffer (no copy).  Ragged columns, dense tensors and object columns pass through.
    """
    if not isinstance(value, torch.Tensor) or not value.is_nested:
        return value
    if value.layout == torch.jagged and getattr(value, "_ragged_idx", 1) == 1 and value.lengths() is None:
        offsets = value.offsets()
        n = offsets.numel() - 1
        if n <= 0:
            return value
        lengths = offsets.diff()
        first = int(lengths[0])
        if bool((lengths == first).all()):
            values = value.values()
            start = int(offsets[0])
            rows = values[start : start + n * first]
            return rows.reshape(n, first, *values.shape[1:])
        return value
    rows = value.unbind()
    if rows and all(r.shape == rows[0].shape for r in rows):
        return torch.stack(rows)
    return value


def coerce_config(cfg: Any) -> DataPlaneConfig:
    """``cfg`` as a validated :class:`DataPlaneConfig` (see ``coerce_dataclass_config``)."""
    return coerce_dataclass_config(cfg, DataPlaneConfig, "TQDataPlaneClient")


@dataclass
class PutPlan:
    """A put checked completely against the partition's record; nothing written yet.

    Attributes:
        wire: Field -> CPU tensor or per-row ``NonTensorStack`` to send.
        new_types: Fields typed for the first time -> (kind, dtype name).
        tags: JSON-normalised per-row tags, or ``None``.
    """

    ids: list[str]
    names: list[str]
    wire: dict[str, Any]
    new_types: dict[str, tuple[str, str | None]]
    tags: list[dict[str, Any]] | None


def plan_put(
    rec: Any, partition_id: str, sample_ids: Sequence[str], fields: TensorDict | None, tags: Sequence[dict] | None
) -> PutPlan:
    """Validate a put against ``rec``, the partition's registry record (fields, enums, stored types).

    Raises:
        ValueError: Neither fields nor tags, duplicate ids, length mismatch, undeclared
            field, enum value outside its vocabulary.
        TypeError: Non-JSON tags, dtype/kind change of a stored field, a ``NonTensorData``
            (``"non-tensor"``) or nested ``TensorDict`` leaf.
    """
    args = check_put_args(partition_id, sample_ids, fields, tags)
    ids, names, n = args.ids, args.names, len(args.ids)
    leaves = {k: fields.get(k) for k in names}  # type: ignore[union-attr]
    check_undeclared(partition_id, names, rec.fields)
    # Leaf types first (all TypeErrors): a whole-column object must be named as such
    # even when the field already holds tensors.
    kinds = {k: wire_leaf_kind(k, leaves[k], n) for k in names}
    new_types: dict[str, tuple[str, str | None]] = {}
    for k in names:
        kind = kinds[k]
        dtype = None if kind == OBJECT_LEAF else str(leaves[k].dtype)
        stored = rec.field_types.get(k)
        if stored is None:
            new_types[k] = (kind, dtype)
        elif stored != (kind, dtype):
            raise kind_changed(partition_id, k, f"{stored[0]}/{stored[1]}", f"{kind}/{dtype}")
    wire: dict[str, Any] = {}
    for k in names:
        v = leaves[k]
        if k in rec.enums:
            values = v.tolist() if kinds[k] == OBJECT_LEAF else None
            check_enum_put(k, rec.enums[k], values, "" if values is not None else str(v.dtype))
        if kinds[k] == OBJECT_LEAF:
            wire[k] = v
            continue
        v = v.detach()
        if v.device.type != "cpu":
            v = v.cpu()
        wire[k] = v
    return PutPlan(list(ids), names, wire, new_types, args.tags)
