"""Validation of the Local adapter's inputs, and the pure halves of its put and get.

Why this module exists: everything here checks arguments or plans a copy without touching the
client's state, so it can run before the client commits anything (bad input fails before
anything is written) and keeps the client module to its locking and bookkeeping.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from nemo_dp.data_plane.adapters._validation import check_name, check_names, check_positive_int, listed
from nemo_dp.data_plane.adapters._validation import duplicates as _duplicates
from nemo_dp.data_plane.adapters.local.store import (
    OBJECT_KIND,
    Column,
    ObjectColumn,
    Partition,
    Selection,
    store_tensor,
)
from nemo_dp.data_plane.schema import INPUT_LENGTHS

def check_tag_value(value: Any, where: str) -> None:
    if value is None or isinstance(value, (str, bool, int, float)):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_tag_value(item, f"{where}[{i}]")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: tag key {key!r} is not a str")
            check_tag_value(item, f"{where}[{key!r}]")
        return
    raise TypeError(f"{where}: {type(value).__name__} value {value!r} is not JSON-compatible")


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_integer_dtype(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def lengths_from_tags(tags: Sequence[Mapping[str, Any]] | None) -> list[int] | None:
    if not tags or any(INPUT_LENGTHS not in t for t in tags):
        return None
    values = [t[INPUT_LENGTHS] for t in tags]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        return None
    return [int(v) for v in values]


@dataclass
class PendingPut:
    """A fully validated put, ready to be committed."""

    row_of: dict[str, int]
    columns: dict[str, Column]
    tags: list[dict[str, Any]] | None


def classify_leaf(name: str, leaf: Any, n: int) -> tuple[str, Any]:
    """Return ``(kind, payload)`` for a put leaf; payload is the tensor or the list of objects."""
    if isinstance(leaf, NonTensorStack):
        values = leaf.tolist()
        if len(values) != n:
            raise ValueError(f"field {name!r}: non-tensor column has {len(values)} rows, expected {n}")
        return OBJECT_KIND, values
    if isinstance(leaf, NonTensorData):
        data = leaf.data
        if isinstance(data, np.ndarray) and data.ndim >= 1:
            values = list(data)
        elif isinstance(data, (list, tuple)):
            values = list(data)
        else:
            raise TypeError(
                f"field {name!r}: a NonTensorData column must hold a list, tuple or 1-D array "
                f"of {n} values, got {type(data).__name__}"
            )
        if len(values) != n:
            raise ValueError(
                f"field {name!r}: NonTensorData column holds {len(values)} values, expected {n}"
            )
        return OBJECT_KIND, values
    if isinstance(leaf, TensorDictBase):
        raise TypeError(f"field {name!r}: nested TensorDict leaves are not supported; flatten them")
    if isinstance(leaf, torch.Tensor):
        return str(leaf.dtype), leaf
    raise TypeError(f"field {name!r}: unsupported leaf type {type(leaf).__name__}")



def validate_put(
    part: Partition,
    ids: list[str],
    fields: TensorDict | None,
    tags: Sequence[dict] | None,
) -> PendingPut:
    """Check a put completely and take the one copy per column; nothing is stored yet."""
    n = len(ids)
    if fields is None and tags is None:
        raise ValueError("put_samples: give fields, tags or both (got neither)")
    if fields is not None and not isinstance(fields, TensorDictBase):
        raise TypeError(f"put_samples: fields must be a TensorDict, got {type(fields).__name__}")
    if tags is not None and (
        isinstance(tags, (str, bytes, Mapping)) or not isinstance(tags, Sequence)
    ):
        raise TypeError(
            f"put_samples: tags must be a sequence of dicts, got {type(tags).__name__}"
        )
    row_of = dict(zip(ids, range(n)))  # doubles as the duplicate check
    if len(row_of) != n:
        raise ValueError(
            f"put_samples: duplicate sample ids in one put: {listed(_duplicates(ids))}"
        )
    if fields is not None and (fields.batch_dims != 1 or fields.batch_size[0] != n):
        raise ValueError(
            f"put_samples: fields.batch_size {tuple(fields.batch_size)} does not match "
            f"{n} sample ids"
        )
    if tags is not None:
        if len(tags) != n:
            raise ValueError(f"put_samples: {len(tags)} tags for {n} sample ids")
        for i, tag in enumerate(tags):
            if not isinstance(tag, Mapping):
                raise TypeError(f"put_samples: tags[{i}] is a {type(tag).__name__}, not a dict")
            check_tag_value(tag, f"put_samples: tags[{i}]")
    names = list(fields.keys()) if fields is not None else []
    if undeclared := [k for k in names if k not in part.fields]:
        raise ValueError(
            f"put_samples: fields {undeclared} are not declared in partition "
            f"{part.partition_id!r} (declared: {list(part.fields)})"
        )
    leaves: dict[str, tuple[str, Any]] = {}
    for name in names:
        kind, payload = classify_leaf(name, fields.get(name), n)  # type: ignore[union-attr]
        stored = part.field_kinds.get(name)
        if stored is not None and stored != kind:
            raise TypeError(
                f"put_samples: field {name!r} is stored as {stored} in partition "
                f"{part.partition_id!r}, this put has {kind}"
            )
        if name in part.enums:
            if kind != OBJECT_KIND:
                raise TypeError(
                    f"put_samples: field {name!r} has an enums vocabulary and must be a "
                    f"non-tensor column, got a {kind} tensor"
                )
            allowed = part.enums[name]
            for value in payload:
                if not isinstance(value, str) or value not in allowed:
                    raise ValueError(
                        f"put_samples: field {name!r} value {value!r} is not in its enums "
                        f"vocabulary {list(allowed)}"
                    )
        leaves[name] = (kind, payload)
    if part.written:
        raise ValueError(
            f"put_samples: partition {part.partition_id!r} already holds its batch; the "
            "Local data plane accepts exactly one put per partition and rejects duplicate "
            "writes (write-back of new columns needs the TransferQueue adapter)"
        )
    if n != part.num_samples:
        raise ValueError(
            f"put_samples: partition {part.partition_id!r} expects exactly "
            f"{part.num_samples} rows in its one put, got {n}"
        )
    # Everything is valid: now take the one copy per column.
    columns: dict[str, Column] = {}
    for name, (kind, payload) in leaves.items():
        if kind == OBJECT_KIND:
            columns[name] = ObjectColumn(copy.deepcopy(payload))
        else:
            columns[name] = store_tensor(name, payload)
    return PendingPut(
        row_of, columns, copy.deepcopy([dict(t) for t in tags]) if tags is not None else None
    )


def plan_get(
    part: Partition, sample_ids: Sequence[str], select_fields: Sequence[str] | None
) -> tuple[int, list[tuple[str, Column]], Selection]:
    """Validate a read and capture what to copy (stored columns are immutable)."""
    if select_fields is None:
        raise ValueError("get_samples: select_fields is required; there is no 'fetch everything'")
    names = check_names(select_fields, "select_fields")
    if not names:
        raise ValueError("get_samples: select_fields must not be empty")
    ids = check_names(sample_ids, "sample_ids")
    if dup := _duplicates(ids):
        raise ValueError(f"get_samples: duplicate sample ids requested: {listed(dup)}")
    if dup := _duplicates(names):
        raise ValueError(f"get_samples: duplicate select_fields: {dup}")
    if not ids:
        return 0, [], Selection([])
    row_of = part.row_of
    try:
        positions = [row_of[sid] for sid in ids]
    except KeyError:
        missing = [sid for sid in ids if sid not in row_of]
        raise KeyError(
            f"get_samples: {len(missing)} unknown or cleared sample ids in partition "
            f"{part.partition_id!r}: {listed(missing)}"
        ) from None
    if unproduced := [f for f in names if f not in part.columns]:
        raise KeyError(
            f"get_samples: fields {unproduced} have not been produced in partition "
            f"{part.partition_id!r} (produced: {sorted(part.columns)})"
        )
    return len(ids), [(f, part.columns[f]) for f in names], Selection.of(positions)

def build_read(plan: tuple[int, list[tuple[str, Column]], Selection]) -> TensorDict:
    n, cols, sel = plan
    out: dict[str, Any] = {}
    for name, col in cols:
        if isinstance(col, ObjectColumn):
            out[name] = NonTensorData(col.take(sel), batch_size=(n,))
        else:
            out[name] = col.take(sel)
    return TensorDict(out, batch_size=(n,))
