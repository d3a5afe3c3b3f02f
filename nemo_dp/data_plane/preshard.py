"""Driver-side DP sharding of a ``KVBatchMeta``: the ordinary planner run on a skeleton of its lengths (no I/O)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from nemo_dp.data_plane.column_io import round_up
from nemo_dp.data_plane.interfaces import KVBatchMeta
from nemo_dp.data_plane.schema import (
    ELEM_COUNTS_PER_GB,
    INPUT_IDS,
    INPUT_LENGTHS,
    META_IDX,
    MICRO_BATCH_INDICES,
    MICRO_BATCH_LENGTHS,
    SAMPLE_MASK,
)
from nemo_dp.distributed.batched_data_dict import BatchedDataDict

__all__ = ["shard_meta_for_dp"]

_PLAN_KEYS = (MICRO_BATCH_INDICES, MICRO_BATCH_LENGTHS, ELEM_COUNTS_PER_GB)


def shard_meta_for_dp(
    meta: KVBatchMeta,
    *,
    dp_world: int,
    batch_size: int | None = None,
    sequence_packing_args: Mapping[str, Any] | None = None,
    dynamic_batching_args: Mapping[str, Any] | None = None,
) -> tuple[list[KVBatchMeta], list[int] | None]:
    """Split ``meta`` (needs ``sequence_lengths``) into one meta per DP rank, with its microbatch plan.

    Args:
        batch_size: Global batch size (defaults to ``meta.size``).
        sequence_packing_args, dynamic_batching_args: Planner settings, passed on unchanged; their
            ``input_key`` / ``input_lengths_key`` must be ``input_ids`` / ``input_lengths``.

    Returns:
        ``(metas, order)``: ``metas[r]`` = ``meta.subset(rows of rank r)`` whose ``extra_info`` is
        the input's, its plan keys replaced by the shard's own plan copies.  ``order[p]`` is the
        original index of row ``p`` of the concatenated output, or ``None`` for the identity.

    Raises:
        ValueError: Empty meta, missing/misaligned ``sequence_lengths``, both packing
            argument sets, indivisible sizes, or ``dp_world < 1``.
    """
    n = meta.size
    if n == 0:
        raise ValueError("shard_meta_for_dp: empty meta — nothing to shard")
    lengths = meta.sequence_lengths
    if lengths is None or len(lengths) != n:
        got = "None" if lengths is None else f"{len(lengths)} entries"
        raise ValueError(
            f"shard_meta_for_dp requires meta.sequence_lengths aligned with its {n} sample ids "
            f"(got {got})"
        )
    if sequence_packing_args is not None and dynamic_batching_args is not None:
        raise ValueError("Pass at most one of sequence_packing_args / dynamic_batching_args.")
    if int(dp_world) < 1:
        raise ValueError(f"shard_meta_for_dp: dp_world must be >= 1, got {dp_world}")
    bs = n if batch_size is None else int(batch_size)
    if bs < 1 or n % bs != 0:
        raise ValueError(f"shard_meta_for_dp: meta size {n} is not a multiple of batch_size {bs}")
    if bs % dp_world != 0:
        raise ValueError(f"shard_meta_for_dp: batch_size {bs} is not divisible by dp_world {dp_world}")

    int_lengths = [int(x) for x in lengths]
    if dynamic_batching_args is not None:
        # The planner caps each microbatch length at the input width: a narrow placeholder
        # would clamp every planned length (width 1 -> one-token sequences, zero gradients).
        round_to = int(dynamic_batching_args["sequence_length_round"])
        width = max(1, round_up(max(int_lengths), round_to))
    else:
        width = 1
    # A stride-0 placeholder: shape (n, width) without allocating n * width elements.
    placeholder = torch.zeros((), dtype=torch.int64).expand(n, width)
    skeleton = BatchedDataDict(
        {
            INPUT_IDS: placeholder,
            INPUT_LENGTHS: torch.tensor(int_lengths, dtype=torch.int64),
            SAMPLE_MASK: torch.ones(n, dtype=torch.float32),
            META_IDX: torch.arange(n, dtype=torch.int64),
        }
    )
    result = skeleton.shard_by_batch_size(
        dp_world,
        batch_size=bs,
        dynamic_batching_args=dynamic_batching_args,
        sequence_packing_args=sequence_packing_args,
    )
    shards = result[0] if isinstance(result, tuple) else result

    metas: list[KVBatchMeta] = []
    order: list[int] = []
    for shard in shards:
        rows = [int(i) for i in shard[META_IDX].tolist()]
        order.extend(rows)
        sub = meta.subset(rows)
        extra = {k: v for k, v in meta.extra_info.items() if k not in _PLAN_KEYS}
        # The plan keys are also the planner's attribute names.
        plan = {k: getattr(shard, k) for k in _PLAN_KEYS}
        extra.update({k: copy.deepcopy(v) for k, v in plan.items() if v is not None})
        sub.extra_info = extra
        metas.append(sub)
    return metas, (None if order == list(range(n)) else order)
