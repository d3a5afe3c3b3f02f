"""The Local adapter's put and read checks and plans: nothing here touches the client's state."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from nemo_dp.data_plane.adapters._validation import (
    check_enum_put,
    check_put_args,
    check_read_args,
    check_undeclared,
    kind_changed,
    unknown_ids,
    unproduced_fields,
)
from nemo_dp.data_plane.adapters.local.store import (
    DICT_KIND,
    OBJECT_KIND,
    PACKED_KIND,
    Column,
    DictColumn,
    ObjectColumn,
    PackedColumn,
    Partition,
    Selection,
    store_tensor,
)
from nemo_dp.utils.packed_tensor import PackedTensor


@dataclass
class PendingPut:
    """A validated put, ready to be committed."""

    row_of: dict[str, int]
    columns: dict[str, Column]
    tags: list[dict[str, Any]] | None


def _classify_packed(where: str, packed: PackedTensor, n: int) -> tuple[str, Any]:
    if len(packed) != n:
        raise ValueError(f"{where}: PackedTensor column has {len(packed)} entries, expected {n}")
    for i, t in enumerate(packed.tensors):
        if t is not None and (t.is_nested or t.layout != torch.strided):
            raise TypeError(f"{where}: PackedTensor entry {i} is a {t.layout} tensor; entries must be dense")
    return PACKED_KIND, packed


def _classify_dict(where: str, data: Mapping[Any, Any], n: int) -> tuple[str, Any]:
    """A dict column: every value is a batch-major column of ``n`` rows (checked recursively)."""
    if not data:
        raise ValueError(f"{where}: a dict column needs at least one key")
    parts: dict[str, tuple[str, Any]] = {}
    for key, value in data.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"{where}: dict column keys must be non-empty str, got {key!r}")
        sub = f"{where}[{key!r}]"
        if isinstance(value, PackedTensor):
            parts[key] = _classify_packed(sub, value, n)
        elif isinstance(value, Mapping):
            parts[key] = _classify_dict(sub, value, n)
        elif isinstance(value, torch.Tensor):
            rows = value.size(0) if value.dim() > 0 else None
            if rows != n:
                raise ValueError(f"{sub}: tensor has batch size {rows}, expected {n}")
            parts[key] = (str(value.dtype), value)
        elif isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim >= 1):
            if len(value) != n:
                raise ValueError(f"{sub}: holds {len(value)} values, expected {n}")
            parts[key] = (OBJECT_KIND, list(value))
        else:
            raise TypeError(
                f"{sub}: a dict column value must be a tensor, PackedTensor, dict or a sequence "
                f"of {n} values, got {type(value).__name__}"
            )
    return DICT_KIND, parts


def classify_leaf(name: str, leaf: Any, n: int) -> tuple[str, Any]:
    """``(kind, payload)`` for a put leaf: payload is the tensor, the objects, the ``PackedTensor``, or
    (dict column) the sub-column name -> ``(kind, payload)`` mapping."""
    if isinstance(leaf, NonTensorStack):
        values = leaf.tolist()
        if len(values) != n:
            raise ValueError(f"field {name!r}: non-tensor column has {len(values)} rows, expected {n}")
        return OBJECT_KIND, values
    if isinstance(leaf, NonTensorData):
        data = leaf.data
        if isinstance(data, PackedTensor):
            return _classify_packed(f"field {name!r}", data, n)
        if isinstance(data, Mapping):
            return _classify_dict(f"field {name!r}", data, n)
        if isinstance(data, (list, tuple)) or (isinstance(data, np.ndarray) and data.ndim >= 1):
            values = list(data)
        else:
            raise TypeError(
                f"field {name!r}: a NonTensorData column must hold a list, tuple, 1-D array, "
                f"PackedTensor or dict of {n}-row columns, got {type(data).__name__}"
            )
        if len(values) != n:
            raise ValueError(f"field {name!r}: NonTensorData column holds {len(values)} values, expected {n}")
        return OBJECT_KIND, values
    if isinstance(leaf, TensorDictBase):
        raise TypeError(f"field {name!r}: nested TensorDict leaves are not supported; flatten them")
    if isinstance(leaf, torch.Tensor):
        return str(leaf.dtype), leaf
    raise TypeError(f"field {name!r}: unsupported leaf type {type(leaf).__name__}")


def store_leaf(name: str, kind: str, payload: Any) -> Column:
    """The one stored copy of a classified leaf (see :func:`classify_leaf`)."""
    if kind == OBJECT_KIND:
        return ObjectColumn(copy.deepcopy(payload))
    if kind == PACKED_KIND:
        return PackedColumn.of(payload)
    if kind == DICT_KIND:
        return DictColumn({k: store_leaf(f"{name}[{k!r}]", *part) for k, part in payload.items()})
    return store_tensor(name, payload)


def validate_put(
    part: Partition, sample_ids: Sequence[str], fields: TensorDict | None, tags: Sequence[dict] | None
) -> PendingPut:
    """Check a put completely and take the one copy per column; nothing is stored yet."""
    args = check_put_args(
        part.partition_id, sample_ids, fields, tags, exact_tags=True, allow_no_columns=True
    )
    ids, names, n = args.ids, args.names, len(args.ids)
    check_undeclared(part.partition_id, names, part.fields)
    leaves: dict[str, tuple[str, Any]] = {}
    for name in names:
        kind, payload = classify_leaf(name, fields.get(name), n)  # type: ignore[union-attr]
        stored = part.field_kinds.get(name)
        if stored is not None and stored != kind:
            raise kind_changed(part.partition_id, name, stored, kind)
        if name in part.enums:
            values = payload if kind == OBJECT_KIND else None
            check_enum_put(name, part.enums[name], values, kind, tensor_error=TypeError)
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
    columns = {name: store_leaf(name, kind, payload) for name, (kind, payload) in leaves.items()}
    return PendingPut(dict(zip(ids, range(n))), columns, args.tags)


def plan_get(
    part: Partition, sample_ids: Sequence[str], select_fields: Sequence[str] | None
) -> tuple[int, list[tuple[str, Column]], Selection]:
    """Validate a read and capture what to copy (stored columns are immutable)."""
    ids, names = check_read_args(sample_ids, select_fields)
    if not ids:
        return 0, [], Selection([])
    row_of = part.row_of
    try:
        positions = [row_of[sid] for sid in ids]
    except KeyError:
        raise unknown_ids(part.partition_id, [sid for sid in ids if sid not in row_of]) from None
    if unproduced := [f for f in names if f not in part.columns]:
        raise unproduced_fields(part.partition_id, unproduced, part.columns)
    return len(ids), [(f, part.columns[f]) for f in names], Selection.of(positions)


def build_read(plan: tuple[int, list[tuple[str, Column]], Selection]) -> TensorDict:
    n, cols, sel = plan
    out: dict[str, Any] = {}
    for name, col in cols:
        if isinstance(col, (ObjectColumn, PackedColumn, DictColumn)):
            out[name] = NonTensorData(col.take(sel), batch_size=(n,))
        else:
            out[name] = col.take(sel)
    return TensorDict(out, batch_size=(n,))
