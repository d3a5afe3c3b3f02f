"""Column reads and writes between trainer batches and any ``DataPlaneClient``.

``first_write`` mints a batch, ``write_columns`` adds columns under the same ids, ``read_columns`` fetches rectangles.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from nemo_dp.data_plane.batch_columns import is_local_batch_meta
from nemo_dp.data_plane.codec import materialize, materialize_local, pack_jagged_fields
from nemo_dp.data_plane.interfaces import DataPlaneClient, KVBatchMeta
from nemo_dp.data_plane.schema import (
    GLOBAL_FORWARD_PAD_SEQLEN,
    INPUT_LENGTHS,
    PAD_TO_MULTIPLE,
    SAMPLE_MASK,
    TOKEN_ALIGNED_FIELDS,
    Layout,
)
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.utils.packed_tensor import PackedTensor

__all__ = ["round_up", "first_write", "read_columns", "write_columns"]


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``value``; identity when ``multiple <= 1``."""
    value, multiple = int(value), int(multiple)
    return value if multiple <= 1 else -(-value // multiple) * multiple


def _check_column(name: str, value: Any, where: str) -> None:
    if isinstance(value, (torch.Tensor, PackedTensor)):
        return
    if isinstance(value, np.ndarray) and value.dtype == object and value.ndim == 1:
        return
    raise TypeError(
        f"{where}: field {name!r} has unsupported type {type(value).__name__}"
        + (f" (dtype {value.dtype}, ndim {value.ndim})" if isinstance(value, np.ndarray) else "")
        + "; expected a torch.Tensor, a PackedTensor or a 1-D object np.ndarray"
    )


def _column_rows(name: str, value: Any, where: str) -> int:
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            raise ValueError(f"{where}: field {name!r} is 0-d and has no batch dim")
        return int(value.shape[0])
    if isinstance(value, PackedTensor):
        return len(value)
    return int(value.shape[0])


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, PackedTensor):
        return PackedTensor([None if t is None else t.detach().cpu() for t in value.tensors], value.dim_to_pack)
    return value


def first_write(
    batch: Mapping[str, Any],
    *,
    sample_ids: Sequence[str],
    dp_client: DataPlaneClient,
    partition_id: str,
    task_name: str | None,
    extra_info: Mapping[str, Any] | None = None,
    pad_to_multiple: int = 1,
    tags: Sequence[dict] | None = None,
    token_aligned_fields: Collection[str] = TOKEN_ALIGNED_FIELDS,
) -> KVBatchMeta:
    """The producer's first put of a batch (one put); return its meta.

    ``batch`` must hold ``sample_mask`` (batch-size oracle) and ``input_lengths`` (the meta's
    ``sequence_lengths``); ``pad_to_multiple`` > 1 is recorded in the meta's ``extra_info``.

    Raises:
        KeyError: ``sample_mask`` or ``input_lengths`` is missing.
        ValueError: Id count differs from the batch size, an empty batch, duplicate ids, misaligned
            tags, ``pad_to_multiple < 1``.
        TypeError: A value is neither a tensor, a PackedTensor nor a 1-D object ndarray.
    """
    where = "first_write"
    if SAMPLE_MASK not in batch:
        raise KeyError(f"{where}: batch has no {SAMPLE_MASK!r} column (the batch-size oracle)")
    if INPUT_LENGTHS not in batch:
        raise KeyError(f"{where}: batch has no {INPUT_LENGTHS!r} column")
    for name, value in batch.items():
        _check_column(name, value, where)
    n = _column_rows(SAMPLE_MASK, batch[SAMPLE_MASK], where)
    ids = list(sample_ids)
    if n == 0 or len(ids) != n:
        raise ValueError(f"first_write: sample_ids ({len(ids)}) must match batch size ({n})")
    if len(set(ids)) != n:
        dupes = sorted({s for s in ids if ids.count(s) > 1})
        raise ValueError(f"{where}: duplicate sample ids {dupes}")
    if tags is not None and len(tags) != n:
        raise ValueError(f"{where}: tags ({len(tags)}) must align 1:1 with the batch ({n} rows)")
    if int(pad_to_multiple) < 1:
        raise ValueError(f"{where}: pad_to_multiple must be >= 1, got {pad_to_multiple}")
    lengths_value = batch[INPUT_LENGTHS]
    if not isinstance(lengths_value, torch.Tensor) or lengths_value.dim() != 1:
        raise ValueError(f"{where}: {INPUT_LENGTHS!r} must be a 1-D integer tensor")
    lengths = lengths_value.detach().cpu()

    columns = {name: _to_cpu(value) for name, value in batch.items()}
    td = pack_jagged_fields(columns, lengths=lengths, token_aligned_fields=token_aligned_fields)
    receipt = dp_client.put_samples(ids, partition_id, td, list(tags) if tags is not None else None)

    extra: dict[str, Any] = {**receipt.extra_info, **(extra_info or {})}
    if int(pad_to_multiple) > 1:
        extra[PAD_TO_MULTIPLE] = int(pad_to_multiple)
    return KVBatchMeta(
        partition_id,
        task_name,
        ids,
        fields=list(td.keys()),
        sequence_lengths=[int(x) for x in lengths.tolist()],
        extra_info=extra,
        tags=copy.deepcopy(list(tags)) if tags is not None else None,
    )


def read_columns(
    dp_client: DataPlaneClient,
    meta: KVBatchMeta,
    select_fields: Sequence[str],
    *,
    layout: Layout = "padded",
    pad_value_dict: Mapping[str, float | int] | None = None,
) -> BatchedDataDict:
    """Exactly the non-empty ``select_fields`` of ``meta``'s rows, at least ``global_forward_pad_seqlen`` wide.

    Raises:
        ValueError: ``select_fields`` is empty.
        KeyError: The store did not return a requested field.
    """
    fields = list(select_fields)
    if not fields:
        raise ValueError("read_columns: select_fields must name at least one field")
    td = dp_client.get_data(meta, select_fields=fields)
    pad_to_seqlen = int(meta.extra_info.get(GLOBAL_FORWARD_PAD_SEQLEN, 0))
    reader = materialize_local if is_local_batch_meta(meta) else materialize
    data = reader(td, layout=layout, pad_value_dict=pad_value_dict, pad_to_seqlen=pad_to_seqlen)
    missing = [f for f in fields if f not in data]
    if missing:
        raise KeyError(f"read_columns: the store returned no column for {missing}")
    return BatchedDataDict({f: data[f] for f in fields})


def write_columns(
    dp_client: DataPlaneClient, meta: KVBatchMeta, fields: Mapping[str, torch.Tensor | np.ndarray]
) -> None:
    """Write new columns under ``meta``'s ids (one put, no tags; no put at all for no fields).

    Per-token columns land jagged at ``meta.sequence_lengths`` (when present) even when wider.

    Raises:
        ValueError: A value's batch dim differs from ``meta.size``.
        TypeError: A value is neither a tensor, a PackedTensor nor a 1-D object ndarray.
    """
    if len(fields) == 0:
        return
    where = "write_columns"
    columns: dict[str, Any] = {}
    for name, value in fields.items():
        _check_column(name, value, where)
        rows = _column_rows(name, value, where)
        if rows != meta.size:
            raise ValueError(f"{where}: field {name!r} has batch size {rows}, expected meta.size {meta.size}")
        columns[name] = _to_cpu(value)
    lengths = (
        torch.tensor([int(x) for x in meta.sequence_lengths], dtype=torch.int64)
        if meta.sequence_lengths is not None
        else None
    )
    td = pack_jagged_fields(columns, lengths=lengths, token_aligned_fields=TOKEN_ALIGNED_FIELDS)
    dp_client.put_samples(list(meta.sample_ids), meta.partition_id, td)
