"""Whole-column batches (one ``NonTensorData`` leaf per non-tensor column): what a loader puts and Local returns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, TensorDict, TensorDictBase

from nemo_dp.data_plane.codec import materialize, materialize_local
from nemo_dp.data_plane.interfaces import KVBatchMeta
from nemo_dp.data_plane.schema import LOCAL_PARTITION_GENERATION, Layout
from nemo_dp.distributed.batched_data_dict import BatchedDataDict

__all__ = ["is_local_batch_meta", "local_batch_to_tensordict", "materialize_for_meta"]


def is_local_batch_meta(meta: KVBatchMeta) -> bool:
    """Whether a ``LocalDataPlaneClient`` minted ``meta`` (by its ``extra_info`` key); ``TypeError`` for a non-meta."""
    if not isinstance(meta, KVBatchMeta):
        raise TypeError(f"is_local_batch_meta expects a KVBatchMeta, got {type(meta).__name__}")
    return LOCAL_PARTITION_GENERATION in meta.extra_info


def _column_rows(name: str, value: Any) -> int:
    """Rows of one whole-column value; a dict column's values must agree."""
    if isinstance(value, Mapping):
        if not value:
            raise ValueError(f"Local field {name!r} is an empty dict column.")
        rows = {k: _column_rows(f"{name}[{k!r}]", v) for k, v in value.items()}
        distinct = set(rows.values())
        if len(distinct) > 1:
            raise ValueError(f"Local field {name!r}: its dict values disagree on the batch size: {rows}")
        return distinct.pop()
    is_tensor = isinstance(value, torch.Tensor)
    if (is_tensor or isinstance(value, np.ndarray)) and value.ndim == 0:
        raise ValueError(f"Local field {name!r} is 0-d; it has no batch dimension.")
    if not is_tensor and (isinstance(value, (str, bytes)) or not hasattr(value, "__len__")):
        raise ValueError(f"Local field {name!r} ({type(value).__name__}) has no batch dimension.")
    return value.size(0) if is_tensor else len(value)


def local_batch_to_tensordict(fields: Mapping[str, Any], *, batch_size: int) -> TensorDict:
    """Wrap a loader batch (name -> value of ``batch_size`` rows) as the TensorDict Local's ``put_samples`` takes.

    Tensors become tensor leaves (not copied here); any other column (list, tuple, object array,
    ``PackedTensor``, or a dict of such columns) becomes one ``NonTensorData``.

    Raises:
        TypeError: ``batch_size`` is not an int, or a field name is not a str.
        ValueError: ``batch_size < 0``, an empty field name, a 0-d value, an empty dict, a dict
            whose values disagree, or a value with another batch size.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size must be an int, got {type(batch_size).__name__}")
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    leaves: dict[str, Any] = {}
    for name, value in fields.items():
        if not isinstance(name, str):
            raise TypeError(f"field name must be a str, got {type(name).__name__} ({name!r})")
        if not name:
            raise ValueError("field name must be a non-empty str")
        rows = _column_rows(name, value)
        if rows != batch_size:
            raise ValueError(f"Local field {name!r} has batch size {rows}, expected {batch_size}.")
        is_tensor = isinstance(value, torch.Tensor)
        leaves[name] = value if is_tensor else NonTensorData(value, batch_size=(batch_size,))
    return TensorDict(leaves, batch_size=(batch_size,))



def materialize_for_meta(
    meta: Any,
    td: TensorDictBase,
    *,
    layout: Layout = "padded",
    pad_value_dict: Mapping[str, float | int] | None = None,
    pad_to_seqlen: int = 0,
) -> BatchedDataDict:
    """``materialize_local`` for a Local meta's read, else ``materialize`` (``TypeError`` on whole-column leaves)."""
    if is_local_batch_meta(meta):
        return materialize_local(td, layout=layout, pad_value_dict=pad_value_dict, pad_to_seqlen=pad_to_seqlen)
    bad = [k for k in td.keys() if isinstance(td.get(k), NonTensorData)]
    if bad:
        raise TypeError(
            f"materialize_for_meta: non-tensor column(s) {bad} are single NonTensorData "
            "leaves (whole columns); reading them with materialize would collapse N rows "
            "into one. A Local-adapter batch must be read with materialize_local."
        )
    return materialize(td, layout=layout, pad_value_dict=pad_value_dict, pad_to_seqlen=pad_to_seqlen)
