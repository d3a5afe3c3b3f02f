"""Driver-side data-plane methods of the policy / value façades (``TQDriverMixin``) and DP sharding of metas.

Each dispatch stamps a fresh pad target on an isolated copy of the meta (a target on a shared
meta would leak between policy and critic and across PPO epochs).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from nemo_dp.data_plane.column_io import read_columns, round_up, write_columns
from nemo_dp.data_plane.interfaces import DataPlaneClient, KVBatchMeta
from nemo_dp.data_plane.schema import (
    ELEM_COUNTS_PER_GB,
    GLOBAL_FORWARD_PAD_SEQLEN,
    INPUT_IDS,
    INPUT_LENGTHS,
    META_IDX,
    MICRO_BATCH_INDICES,
    MICRO_BATCH_LENGTHS,
    PAD_TO_MULTIPLE,
    SAMPLE_MASK,
)
from nemo_dp.distributed.batched_data_dict import BatchedDataDict

__all__ = [
    "MB_TOKENS_KEYS",
    "TQDriverMixin",
    "cfg_value",
    "isolated_copy",
    "placed_pad_target",
    "shard_meta_for_dp",
    "stamp_placed_metas",
]

#: The two microbatch token budgets a dispatch may ask for.
MB_TOKENS_KEYS: tuple[str, ...] = ("logprob_mb_tokens", "train_mb_tokens")

#: Per-op statistics of a worker's store window kept in the slowest-rank breakdown.
_BREAKDOWN_STATS: frozenset[str] = frozenset({"calls", "rows", "mb", "wall_ms"})


def cfg_value(node: Any, key: str, path: str) -> Any:
    """``key`` of a ``Mapping`` or attribute-style config node; ``KeyError`` naming ``path.key`` if absent."""
    if not (key in node if isinstance(node, Mapping) else hasattr(node, key)):
        raise KeyError(f"config key {path}.{key} is missing")
    return node[key] if isinstance(node, Mapping) else getattr(node, key)


def _pad_to_multiple(meta: KVBatchMeta) -> int:
    # extra_info is metadata written by producers, not config: absent means "no alignment".
    value = int(meta.extra_info.get(PAD_TO_MULTIPLE, 1))
    if value < 1:
        raise ValueError(f"extra_info[{PAD_TO_MULTIPLE!r}] must be >= 1, got {value} (partition {meta.partition_id!r})")
    return value


def isolated_copy(
    meta: KVBatchMeta, *, fields: Sequence[str] | None, task_name: str | None, keep_tags: bool = True
) -> KVBatchMeta:
    """A copy of ``meta`` with ``fields``/``task_name`` replaced and ``global_forward_pad_seqlen`` dropped.

    Containers and tag dicts are fresh; other ``extra_info`` values are shared.  ``keep_tags=False``
    leaves tags out (workers never read them).
    """
    extra = {k: v for k, v in meta.extra_info.items() if k != GLOBAL_FORWARD_PAD_SEQLEN}
    return KVBatchMeta(
        partition_id=meta.partition_id,
        task_name=task_name,
        sample_ids=list(meta.sample_ids),
        fields=list(fields) if fields is not None else None,
        sequence_lengths=[int(x) for x in meta.sequence_lengths] if meta.sequence_lengths is not None else None,
        extra_info=extra,
        tags=[copy.deepcopy(t) for t in meta.tags] if keep_tags and meta.tags is not None else None,
    )


def placed_pad_target(metas: Sequence[KVBatchMeta], *, seq_round: int = 1) -> int:
    """``round_up(longest row, lcm(max pad_to_multiple, seq_round))`` over DP ranks' metas.

    A ``global_forward_pad_seqlen`` the metas carry is ignored (it would ratchet up to a historical
    maximum).  ``seq_round`` is the dynamic-batching length rounding (1 = none).

    Raises:
        ValueError: No metas, a meta without ``sequence_lengths``, no rows at all, or ``seq_round < 1``.
    """
    metas = list(metas)
    if not metas:
        raise ValueError("placed_pad_target: no metas given")
    if int(seq_round) < 1:
        raise ValueError(f"placed_pad_target: seq_round must be >= 1, got {seq_round}")
    longest: int | None = None
    multiple = 1
    for rank, meta in enumerate(metas):
        if meta.sequence_lengths is None:
            raise ValueError(
                f"placed_pad_target: meta {rank} (partition {meta.partition_id!r}) has no "
                "sequence_lengths; the pad target needs every row's length"
            )
        multiple = max(multiple, _pad_to_multiple(meta))
        if meta.sequence_lengths:
            rank_max = max(int(x) for x in meta.sequence_lengths)
            longest = rank_max if longest is None else max(longest, rank_max)
    if longest is None:
        raise ValueError("placed_pad_target: the metas hold no rows")
    return round_up(longest, math.lcm(multiple, int(seq_round)))


def stamp_placed_metas(metas: Sequence[KVBatchMeta], *, seq_round: int = 1) -> list[KVBatchMeta]:
    """Like :func:`placed_pad_target`, but returns ``isolated_copy`` metas (input order) stamped with it."""
    target = placed_pad_target(metas, seq_round=seq_round)
    out = [isolated_copy(meta, fields=meta.fields, task_name=meta.task_name) for meta in metas]
    for meta in out:
        meta.extra_info[GLOBAL_FORWARD_PAD_SEQLEN] = target
    return out


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

    The planner settings pass on unchanged; their ``input_key`` / ``input_lengths_key`` must be
    ``input_ids`` / ``input_lengths``.  ``batch_size`` defaults to ``meta.size``.

    Returns:
        ``(metas, order)``: ``metas[r]`` = ``meta.subset(rows of rank r)`` whose ``extra_info`` is
        the input's, its plan keys replaced by the shard's own plan copies.  ``order[p]`` is the
        original index of row ``p`` of the concatenated output, or ``None`` for the identity.

    Raises:
        ValueError: Empty meta, missing/misaligned ``sequence_lengths``, both packing argument sets,
            indivisible sizes, or ``dp_world < 1``.
    """
    n = meta.size
    if n == 0:
        raise ValueError("shard_meta_for_dp: empty meta — nothing to shard")
    lengths = meta.sequence_lengths
    if lengths is None or len(lengths) != n:
        got = "None" if lengths is None else f"{len(lengths)} entries"
        raise ValueError(
            f"shard_meta_for_dp requires meta.sequence_lengths aligned with its {n} sample ids (got {got})"
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


class TQDriverMixin:
    """Driver-side metadata helpers for façades that dispatch ``KVBatchMeta`` shards.

    The host provides ``cfg`` (keys a micro-batching mode needs have no defaults: ``KeyError``),
    ``dp_client``, ``dp_size`` and optionally bools ``use_dynamic_batches`` / ``use_sequence_packing``.
    """

    cfg: Any
    dp_client: DataPlaneClient
    dp_size: int

    def _mode_on(self, attribute: str, section: str) -> bool:
        """Whether a micro-batching mode is on: the host attribute, else the config section's ``enabled``."""
        flag = getattr(self, attribute, None)
        if flag is not None:
            return bool(flag)
        if isinstance(self.cfg, Mapping):
            node = self.cfg[section] if section in self.cfg else None
        else:
            node = getattr(self.cfg, section, None)
        if node is None:
            return False
        return bool(cfg_value(node, "enabled", f"cfg.{section}"))

    def _packing_args(self, mb_tokens_key: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """Fresh ``(sequence_packing_args, dynamic_batching_args)`` for ``mb_tokens_key``; dynamic batching wins.

        Raises:
            ValueError: ``mb_tokens_key`` is not one of the two budgets.
            KeyError: A config key the enabled mode needs is missing.
        """
        if mb_tokens_key not in MB_TOKENS_KEYS:
            raise ValueError(
                f"_packing_args: mb_tokens_key must be one of {list(MB_TOKENS_KEYS)}, got {mb_tokens_key!r}"
            )
        if self._mode_on("use_dynamic_batches", "dynamic_batching"):
            db = cfg_value(self.cfg, "dynamic_batching", "cfg")
            dba = {
                "max_tokens_per_microbatch": int(cfg_value(db, mb_tokens_key, "cfg.dynamic_batching")),
                "sequence_length_round": int(cfg_value(db, "sequence_length_round", "cfg.dynamic_batching")),
                "input_key": INPUT_IDS,
                "input_lengths_key": INPUT_LENGTHS,
            }
            return None, dba
        if self._mode_on("use_sequence_packing", "sequence_packing"):
            sp = cfg_value(self.cfg, "sequence_packing", "cfg")
            spa = {
                "max_tokens_per_microbatch": int(cfg_value(sp, mb_tokens_key, "cfg.sequence_packing")),
                "algorithm": str(cfg_value(sp, "algorithm", "cfg.sequence_packing")),
                "sequence_length_pad_multiple": int(
                    cfg_value(sp, "sequence_length_pad_multiple", "cfg.sequence_packing")
                ),
                "input_key": INPUT_IDS,
                "input_lengths_key": INPUT_LENGTHS,
                "microbatch_order": cfg_value(sp, "microbatch_order", "cfg.sequence_packing"),
            }
            return spa, None
        return None, None

    def _seq_round(self) -> int:
        """The dynamic-batching ``sequence_length_round``, or 1 when dynamic batching is off."""
        _, dba = self._packing_args("train_mb_tokens")
        return int(dba["sequence_length_round"]) if dba is not None else 1

    def _stamp_pad_seqlen(self, meta: KVBatchMeta) -> None:
        """Stamp ``global_forward_pad_seqlen`` in place as :func:`placed_pad_target` of ``meta`` alone.

        No-op without lengths or rows, or when a target is present.  ``ValueError``: ``pad_to_multiple`` < 1.
        """
        if not meta.sequence_lengths or GLOBAL_FORWARD_PAD_SEQLEN in meta.extra_info:
            return
        meta.extra_info[GLOBAL_FORWARD_PAD_SEQLEN] = placed_pad_target([meta], seq_round=self._seq_round())

    def _isolated_meta(
        self, meta: KVBatchMeta, *, fields: Sequence[str] | None, task_name: str | None, keep_tags: bool = True
    ) -> KVBatchMeta:
        """Like :func:`isolated_copy`, plus a fresh pad target for this host."""
        out = isolated_copy(meta, fields=fields, task_name=task_name, keep_tags=keep_tags)
        self._stamp_pad_seqlen(out)
        return out

    def _shard_meta(self, meta: KVBatchMeta, *, batch_size: int | None, mb_tokens_key: str) -> list[KVBatchMeta]:
        """``shard_meta_for_dp`` into ``self.dp_size`` shards with the host's planner arguments."""
        spa, dba = self._packing_args(mb_tokens_key)
        shards, _ = shard_meta_for_dp(
            meta, dp_world=self.dp_size, batch_size=batch_size, sequence_packing_args=spa, dynamic_batching_args=dba
        )
        return shards

    def _placed_metas(self, metas: Sequence[KVBatchMeta]) -> list[KVBatchMeta]:
        """``stamp_placed_metas`` with this host's rounding: one target over all ranks' metas."""
        return stamp_placed_metas(metas, seq_round=self._seq_round())

    def _worker_store_metrics(self, step_time_s: float, prefix: str) -> dict[str, float]:
        """Every rank's per-step store metrics (windows reset), summed, plus the slowest rank's breakdown.

        Returns:
            ``{prefix}/step/{wall_ms, bytes_written_mb, bytes_read_mb}`` summed over ranks,
            ``{prefix}/step/max_rank_wall_ms``, ``{prefix}/max_rank/rank`` and the slowest rank's
            ``{prefix}/max_rank/{op}/{calls, rows, mb, wall_ms}``; ``{}`` when the workers record nothing.
        """
        ranks = self._dispatch_all("data_plane_step_metrics", float(step_time_s))  # type: ignore[attr-defined]
        if not ranks or any(not r for r in ranks):
            return {}
        out: dict[str, float] = {}
        for key in ("step/wall_ms", "step/bytes_written_mb", "step/bytes_read_mb"):
            out[f"{prefix}/{key}"] = float(sum(float(r[key]) for r in ranks))
        slowest = max(range(len(ranks)), key=lambda i: float(ranks[i]["step/wall_ms"]))
        out[f"{prefix}/step/max_rank_wall_ms"] = float(ranks[slowest]["step/wall_ms"])
        out[f"{prefix}/max_rank/rank"] = float(slowest)
        for key, value in ranks[slowest].items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "step" and parts[2] in _BREAKDOWN_STATS:
                out[f"{prefix}/max_rank/{parts[1]}/{parts[2]}"] = float(value)
        return out

    def read_from_dataplane(
        self,
        meta: KVBatchMeta,
        *,
        select_fields: Sequence[str],
        pad_value_dict: Mapping[str, float | int] | None = None,
    ) -> BatchedDataDict:
        """``read_columns`` of ``meta`` (untouched) padded to its stamped pad target, else to a fresh one.

        Raises:
            ValueError: ``select_fields`` is empty, or the stamped target is not an int >= 0.
            KeyError: Unknown partition, ids or fields (from the store).
        """
        if GLOBAL_FORWARD_PAD_SEQLEN in meta.extra_info:
            target = meta.extra_info[GLOBAL_FORWARD_PAD_SEQLEN]
            if isinstance(target, bool) or not isinstance(target, int) or target < 0:
                raise ValueError(
                    f"extra_info[{GLOBAL_FORWARD_PAD_SEQLEN!r}] must be an int >= 0, got "
                    f"{target!r} (partition {meta.partition_id!r})"
                )
            isolated = isolated_copy(meta, fields=select_fields, task_name=meta.task_name)
            isolated.extra_info[GLOBAL_FORWARD_PAD_SEQLEN] = target
        else:
            isolated = self._isolated_meta(meta, fields=select_fields, task_name=meta.task_name)
        return read_columns(self.dp_client, isolated, list(select_fields), pad_value_dict=pad_value_dict)

    def write_to_dataplane(self, meta: KVBatchMeta, fields: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        """``write_columns`` under ``meta``'s ids (rows in ``meta.sample_ids`` order)."""
        write_columns(self.dp_client, meta, fields)
