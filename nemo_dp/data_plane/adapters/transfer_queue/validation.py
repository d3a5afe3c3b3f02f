"""Argument checks of the TransferQueue adapter and the read/write transforms around the wire.

Why this module exists: every call is validated completely before anything reaches the
library (bad input fails before anything is written); these checks need no connection, so they
live apart from the client and its lifetime.  ``densify`` undoes the library's habit of
returning dense columns as jagged nested tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from nemo_dp.data_plane.adapters._validation import duplicates as _duplicates
from nemo_dp.data_plane.interfaces import DataPlaneConfig
from nemo_dp.data_plane.schema import INPUT_LENGTHS, RESERVED_PREFIX, TAG_INPUT_LENGTHS
from nemo_dp.utils.checkpoint_io import validate_json_metadata

KIND_TENSOR = "tensor"
KIND_OBJECT = "object"
_MAX_LISTED = 20


def listed(items: Iterable[str]) -> str:
    ordered = sorted(items)
    head = ordered[:_MAX_LISTED]
    more = len(ordered) - len(head)
    return f"{head}" + (f" (+{more} more)" if more else "")


def check_name(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__} ({value!r})")
    if not value:
        raise ValueError(f"{what} must be a non-empty string")
    return value


def check_partition_id(partition_id: Any) -> str:
    check_name(partition_id, "partition_id")
    if partition_id.startswith(RESERVED_PREFIX):
        raise ValueError(
            f"partition_id {partition_id!r} is reserved: ids starting with {RESERVED_PREFIX!r} "
            "belong to nemo_dp's own bookkeeping"
        )
    return partition_id


def check_names(values: Any, what: str) -> list[str]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be a sequence of str, got {type(values).__name__}")
    out = [check_name(v, f"{what} entry") for v in values]
    return out


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


def leaf_kind(value: Any) -> str | None:
    """``"tensor"`` / ``"object"`` for a storable leaf; ``None`` for an unsupported one."""
    if isinstance(value, torch.Tensor):
        return KIND_TENSOR
    if isinstance(value, (NonTensorStack, NonTensorData)):
        return KIND_OBJECT
    return None


def dtype_name(value: Any) -> str | None:
    return str(value.dtype) if isinstance(value, torch.Tensor) else None


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
    if isinstance(cfg, DataPlaneConfig):
        return cfg
    if isinstance(cfg, Mapping):
        from omegaconf import DictConfig, OmegaConf

        container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
        merged = OmegaConf.merge(OmegaConf.structured(DataPlaneConfig), container)
        out = OmegaConf.to_object(merged)
        assert isinstance(out, DataPlaneConfig)
        return out
    raise TypeError(
        f"TQDataPlaneClient needs a DataPlaneConfig (or a mapping of it), got {type(cfg).__name__}"
    )



def receipt_lengths(
    wire: Mapping[str, Any], tags: list[dict[str, Any]] | None
) -> list[int] | None:
    col = wire.get(INPUT_LENGTHS)
    if (
        isinstance(col, torch.Tensor)
        and not col.is_nested
        and col.dim() == 1
        and not col.is_floating_point()
        and not col.is_complex()
        and col.dtype != torch.bool
    ):
        return [int(x) for x in col.tolist()]
    if tags and all(TAG_INPUT_LENGTHS in t for t in tags):
        return [int(t[TAG_INPUT_LENGTHS]) for t in tags]
    return None


@dataclass
class PutPlan:
    """A put checked completely against the partition's record; nothing written yet.

    Attributes:
        ids: The sample ids, in put order.
        names: Field names of the put.
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
    rec: Any,
    partition_id: str,
    sample_ids: Sequence[str],
    fields: TensorDict | None,
    tags: Sequence[dict] | None,
) -> PutPlan:
    """Validate a put against the partition's registry record.

    Args:
        rec: The partition's registry record (declared fields, enums, stored field types).
        partition_id: The partition (for messages).
        sample_ids: The ids to write.
        fields: The columns, or ``None``.
        tags: Per-row tags, or ``None``.

    Returns:
        The plan.

    Raises:
        ValueError: Neither fields nor tags, duplicate ids, length mismatch, undeclared
            field, enum value outside its vocabulary.
        TypeError: Non-JSON tags, dtype/kind change of a stored field, a ``NonTensorData``
            (``"non-tensor"``) or nested ``TensorDict`` leaf.
    """
    ids = check_names(sample_ids, "sample_ids")
    if fields is None and tags is None:
        raise ValueError("put_samples needs fields or tags (got neither)")
    if dups := _duplicates(ids):
        raise ValueError(f"duplicate sample ids in one put to {partition_id!r}: {listed(dups)}")
    n = len(ids)
    names: list[str] = []
    leaves: dict[str, Any] = {}
    if fields is not None:
        if not isinstance(fields, TensorDictBase):
            raise TypeError(f"fields must be a TensorDict, got {type(fields).__name__}")
        if fields.batch_dims != 1 or fields.batch_size[0] != n:
            raise ValueError(
                f"fields batch_size {tuple(fields.batch_size)} does not match "
                f"{n} sample ids (expected ({n},))"
            )
        names = list(fields.keys())
        leaves = {k: fields.get(k) for k in names}
    tag_list: list[dict[str, Any]] | None = None
    if tags is not None:
        tag_list = list(tags)
        if len(tag_list) != n:
            raise ValueError(f"tags has {len(tag_list)} entries for {n} sample ids")
        checked: list[dict[str, Any]] = []
        for i, t in enumerate(tag_list):
            if not isinstance(t, Mapping):
                raise TypeError(f"tags[{i}] must be a dict, got {type(t).__name__}")
            try:
                # A detached JSON-normalised copy; non-str keys and objects are rejected.
                checked.append(validate_json_metadata(t))
            except (TypeError, ValueError) as exc:
                raise TypeError(f"tags[{i}] is not JSON-compatible: {exc}") from exc
        tag_list = checked
    if fields is not None and not names and tag_list is None:
        raise ValueError("put_samples needs fields or tags (fields has no columns)")
    undeclared = [k for k in names if k not in rec.fields]
    if undeclared:
        raise ValueError(
            f"fields {undeclared} are not declared for partition {partition_id!r} "
            f"(declared: {rec.fields})"
        )
    # Leaf types first (all TypeErrors): a whole-column object must be named as such
    # even when the field already holds tensors.
    for k in names:
        v = leaves[k]
        if isinstance(v, NonTensorData):
            raise TypeError(
                f"field {k!r} is a NonTensorData (one non-tensor object for the whole "
                "column); the wire would drop it - use a per-row NonTensorStack "
                "(pack_jagged_fields builds one)"
            )
        if leaf_kind(v) is None:
            if isinstance(v, TensorDictBase):
                raise TypeError(
                    f"field {k!r} is a nested TensorDict; only tensors and per-row "
                    "NonTensorStack columns are fields"
                )
            raise TypeError(f"field {k!r} has unsupported type {type(v).__name__}")
    new_types: dict[str, tuple[str, str | None]] = {}
    for k in names:
        kind = leaf_kind(leaves[k])
        assert kind is not None
        dtype = dtype_name(leaves[k])
        stored = rec.field_types.get(k)
        if stored is None:
            new_types[k] = (kind, dtype)
        elif stored != (kind, dtype):
            raise TypeError(
                f"field {k!r} of partition {partition_id!r} is stored as "
                f"{stored[0]}/{stored[1]}, this put has {kind}/{dtype}; a field's dtype "
                "cannot change"
            )
    wire: dict[str, Any] = {}
    for k in names:
        v = leaves[k]
        if isinstance(v, NonTensorStack):
            if k in rec.enums:
                vocab = rec.enums[k]
                for value in v.tolist():
                    if value not in vocab:
                        raise ValueError(
                            f"field {k!r} value {value!r} is not in its declared enum "
                            f"vocabulary {vocab}"
                        )
            wire[k] = v
            continue
        if k in rec.enums:
            raise ValueError(
                f"field {k!r} takes values from its enum vocabulary {rec.enums[k]}, "
                f"got a tensor column ({v.dtype})"
            )
        v = v.detach()
        if v.device.type != "cpu":
            v = v.cpu()
        wire[k] = v
    return PutPlan(list(ids), names, wire, new_types, tag_list)
