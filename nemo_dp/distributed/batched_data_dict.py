"""``BatchedDataDict`` (a ``UserDict`` of batch-major fields) and the DP sharding planner.

The planner emits the micro-batch plan every rank must follow identically (re-planning per rank
desynchronises collectives)."""

from __future__ import annotations

import copy
from collections import UserDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nemo_dp.distributed.packers import get_packer
from nemo_dp.utils.packed_tensor import PackedTensor

__all__ = ["BatchedDataDict", "MicrobatchSpec", "MICROBATCH_ORDERS"]

MICROBATCH_ORDERS: tuple[str | None, ...] = (None, "packer", "largest_first")


@dataclass(frozen=True)
class MicrobatchSpec:
    """One planned microbatch of a shard: rows ``[start, end)`` (absolute) of global batch ``chunk``.

    ``padded_length``: every row's padded length (dynamic batching), the bin's padded tokens (packing) or ``None``."""

    chunk: int
    start: int
    end: int
    padded_length: int | None


def _round_up(value: int, multiple: int) -> int:
    return int(value) if multiple <= 1 else -(-int(value) // multiple) * multiple


def _rows_of(key: str, value: Any) -> int:
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            raise ValueError(f"BatchedDataDict: field {key!r} is a 0-d tensor (no batch dim)")
        return int(value.size(0))
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            raise ValueError(f"BatchedDataDict: field {key!r} is a 0-d array (no batch dim)")
        return int(value.shape[0])
    if isinstance(value, (list, tuple, PackedTensor)):
        return len(value)
    raise TypeError(
        f"BatchedDataDict: field {key!r} has unsupported type {type(value).__name__} "
        "(expected a tensor, list, tuple, np.ndarray or PackedTensor)"
    )


def _is_broadcast_constant(t: torch.Tensor) -> bool:
    return t.dim() > 0 and t.numel() > 0 and all(s == 0 for s in t.stride())


def _nested(values: torch.Tensor, offsets: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """A jagged tensor of ``values`` cut at ``offsets``, its min/max row length taken from ``lens``."""
    some = lens.numel() > 0
    return torch.nested.nested_tensor_from_jagged(
        values, offsets, min_seqlen=int(lens.min()) if some else 0, max_seqlen=int(lens.max()) if some else 0
    )


def _jagged_select(nt: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Rows ``idx`` of a jagged tensor (ragged dim 1), vectorised via a gather on values."""
    offsets = nt.offsets()
    explicit = nt.lengths()
    starts = offsets[:-1]
    lens = explicit if explicit is not None else offsets[1:] - offsets[:-1]
    values = nt.values()
    idx = idx.to(offsets.device)
    new_lens = lens.index_select(0, idx).to(torch.int64)
    new_offsets = torch.zeros(idx.numel() + 1, dtype=torch.int64, device=offsets.device)
    if idx.numel() > 0:
        torch.cumsum(new_lens, 0, out=new_offsets[1:])
    total = int(new_offsets[-1])
    pos = torch.arange(total, device=offsets.device) - new_offsets[:-1].repeat_interleave(new_lens)
    gather = starts.index_select(0, idx).to(torch.int64).repeat_interleave(new_lens) + pos
    return _nested(values.index_select(0, gather.to(values.device)), new_offsets.to(values.device), new_lens)


def _jagged_cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """Row-wise concatenation of jagged tensors (ragged dim 1) via their values/offsets."""
    if any(p._ragged_idx != 1 for p in parts):  # noqa: SLF001
        rows = [r for p in parts for r in p.unbind()]
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    # Re-selecting all rows compacts each part to values starting at offset 0.
    dense = [_jagged_select(p, torch.arange(p.size(0), dtype=torch.int64)) for p in parts]
    values = torch.cat([d.values() for d in dense], dim=0)
    lens = torch.cat([d.offsets()[1:] - d.offsets()[:-1] for d in dense])
    offsets = torch.zeros(lens.numel() + 1, dtype=torch.int64, device=values.device)
    if lens.numel() > 0:
        torch.cumsum(lens.to(values.device), 0, out=offsets[1:])
    return _nested(values, offsets, lens)


def _select(key: str, value: Any, indices: list[int]) -> Any:
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            if value.layout != torch.jagged or value._ragged_idx != 1:  # noqa: SLF001
                rows = value.unbind()
                return torch.nested.as_nested_tensor([rows[i] for i in indices], layout=value.layout)
            return _jagged_select(value, torch.tensor(indices, dtype=torch.int64))
        if _is_broadcast_constant(value):
            # Every row aliases the same element (e.g. an expanded placeholder): keep it a view.
            return value.as_strided((), (), value.storage_offset()).expand(len(indices), *value.shape[1:])
        idx = torch.tensor(indices, dtype=torch.int64, device=value.device)
        return value.index_select(0, idx)
    if isinstance(value, np.ndarray):
        return value[np.asarray(indices, dtype=np.int64)]
    if isinstance(value, tuple):
        return tuple(value[i] for i in indices)
    if isinstance(value, list):
        return [value[i] for i in indices]
    if isinstance(value, PackedTensor):
        if not indices:
            raise ValueError(f"BatchedDataDict: field {key!r} is a PackedTensor, which cannot hold zero rows")
        return PackedTensor([value.tensors[i] for i in indices], value.dim_to_pack)
    raise TypeError(f"BatchedDataDict: cannot select rows of field {key!r} ({type(value).__name__})")


def _concat(key: str, values: list[Any], pad: float | int) -> Any:
    first = values[0]
    if isinstance(first, torch.Tensor):
        if not all(isinstance(v, torch.Tensor) for v in values):
            raise TypeError(f"BatchedDataDict.from_batches: field {key!r} mixes tensors and others")
        if any(v.is_nested for v in values):
            if not all(v.is_nested and v.layout == torch.jagged for v in values):
                raise TypeError(f"BatchedDataDict.from_batches: field {key!r} mixes nested and dense tensors")
            return _jagged_cat(values)
        if first.dim() >= 2:
            width = max(int(v.shape[1]) for v in values)
            return torch.cat([_pad_width(v, width, pad) for v in values], dim=0)
        return torch.cat(values, dim=0)
    if isinstance(first, np.ndarray):
        return np.concatenate(values, axis=0)
    if isinstance(first, PackedTensor):
        if not all(isinstance(v, PackedTensor) for v in values):
            raise TypeError(f"BatchedDataDict.from_batches: field {key!r} mixes PackedTensor and others")
        return PackedTensor.concat(values)
    if isinstance(first, (list, tuple)):
        return [x for v in values for x in v]
    raise TypeError(f"BatchedDataDict.from_batches: unsupported type for {key!r}")


def _pad_width(v: torch.Tensor, width: int, pad: float | int) -> torch.Tensor:
    """``v`` right-padded on dim 1 to ``width`` with ``pad`` (``v`` itself when wide enough)."""
    if int(v.shape[1]) >= width:
        return v
    p = torch.full((v.shape[0], width, *v.shape[2:]), pad, dtype=v.dtype, device=v.device)
    p[:, : v.shape[1]] = v
    return p


class BatchedDataDict(UserDict):
    """Field name -> batch-major value, plus an optional microbatch plan, per chunk (global batch):
    ``micro_batch_indices`` (``[start, end)`` rows within this shard's part of the chunk),
    ``micro_batch_lengths`` (as :attr:`MicrobatchSpec.padded_length`) and, for sequence packing,
    ``elem_counts_per_gb`` (rows of the chunk in this shard).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.micro_batch_indices: list[list[list[int]]] | None = None
        self.micro_batch_lengths: list[list[int]] | None = None
        self.elem_counts_per_gb: list[int] | None = None

    @property
    def size(self) -> int:
        """The common batch size of all values (0 for an empty dict); ValueError if they disagree."""
        sizes = {k: _rows_of(k, v) for k, v in self.data.items()}
        distinct = set(sizes.values())
        if len(distinct) > 1:
            raise ValueError(f"BatchedDataDict: fields disagree on the batch size: {sizes}")
        return distinct.pop() if distinct else 0

    def _new(self, data: dict[str, Any]) -> BatchedDataDict:
        out = type(self)()
        out.data = data
        return out

    @classmethod
    def from_batches(
        cls,
        batches: Sequence[Mapping[str, Any]],
        pad_value_dict: Mapping[str, float | int] | None = None,
    ) -> BatchedDataDict:
        """Concatenate batches with identical key sets row-wise (no plan attached).

        Tensors of dim >= 2 are right-padded on dim 1 to the widest (pad from ``pad_value_dict``,
        default 0); jagged tensors stay jagged.  ValueError for no batches or differing key sets,
        TypeError for a field mixing value kinds.
        """
        if not batches:
            raise ValueError("BatchedDataDict.from_batches: no batches given")
        keys = list(batches[0].keys())
        for b in batches[1:]:
            if set(b.keys()) != set(keys):
                raise ValueError(
                    "BatchedDataDict.from_batches: batches have different keys: "
                    f"{sorted(keys)} vs {sorted(b.keys())}"
                )
        out = cls()
        for key in keys:
            out[key] = _concat(key, [b[key] for b in batches], (pad_value_dict or {}).get(key, 0))
        return out

    def select_indices(self, indices: Sequence[int] | torch.Tensor | np.ndarray) -> BatchedDataDict:
        """Rows at ``indices`` in order (duplicates allowed; IndexError outside ``[0, size)``), without the plan."""
        idx = [int(i) for i in (indices.reshape(-1).tolist() if isinstance(indices, torch.Tensor) else indices)]
        n = self.size
        for i in idx:
            if i < 0 or i >= n:
                raise IndexError(f"BatchedDataDict.select_indices: index {i} out of range for size {n}")
        return self._new({k: _select(k, v, idx) for k, v in self.data.items()})

    def slice(self, start: int, end: int) -> BatchedDataDict:
        """Rows ``start:end`` (IndexError unless ``0 <= start <= end <= size``); the plan is dropped."""
        n = self.size
        if not 0 <= start <= end <= n:
            raise IndexError(f"BatchedDataDict.slice: need 0 <= start <= end <= size, got {start}, {end}, {n}")
        data: dict[str, Any] = {}
        for k, v in self.data.items():
            if (isinstance(v, torch.Tensor) and v.is_nested) or isinstance(v, PackedTensor):
                data[k] = _select(k, v, list(range(start, end)))
            else:
                data[k] = v[start:end]
        return self._new(data)

    def repeat_interleave(self, num_repeats: int) -> BatchedDataDict:
        """Each row repeated ``num_repeats`` (>= 1, else ValueError) times in place (``a, a, b, b, ...``)."""
        if int(num_repeats) < 1:
            raise ValueError(f"repeat_interleave: num_repeats must be >= 1, got {num_repeats}")
        return self.select_indices([i for i in range(self.size) for _ in range(int(num_repeats))])

    def reorder_data(self, order: Sequence[int] | torch.Tensor) -> BatchedDataDict:
        """Reorder rows so that row ``j`` is the row whose ``order`` value is the j-th smallest (with ``order``
        from ``shard_meta_for_dp``/``shard_by_batch_size``: the input order).  In place, dropping the plan;
        returns ``self``; ValueError if ``len(order) != size``."""
        keys = [int(x) for x in (order.tolist() if isinstance(order, torch.Tensor) else order)]
        if len(keys) != self.size:
            raise ValueError(f"reorder_data: order has {len(keys)} entries, batch has {self.size}")
        self.data = self.select_indices(sorted(range(len(keys)), key=lambda j: keys[j])).data
        self.micro_batch_indices = self.micro_batch_lengths = self.elem_counts_per_gb = None
        return self

    def to(self, device: str | torch.device) -> BatchedDataDict:
        """Move every tensor to ``device`` (in place); returns ``self``."""
        for k, v in self.data.items():
            if isinstance(v, (torch.Tensor, PackedTensor)):
                self.data[k] = v.to(device)
        return self

    def shard_by_batch_size(
        self,
        shards: int,
        batch_size: int | None = None,
        dynamic_batching_args: Mapping[str, Any] | None = None,
        sequence_packing_args: Mapping[str, Any] | None = None,
    ) -> list[BatchedDataDict] | tuple[list[BatchedDataDict], list[int]]:
        """Split the batch across ``shards`` DP ranks.

        The ``T`` rows are processed in ``T / batch_size`` consecutive chunks (global
        batches); each rank receives its part of chunk k before its part of chunk k+1.

        * No packing: chunk k is cut into ``shards`` contiguous blocks; rank r gets block r.
        * ``dynamic_batching_args`` (``max_tokens_per_microbatch``, ``sequence_length_round``,
          ``input_key``, ``input_lengths_key``): rows sorted by length (stable) and dealt
          round-robin; a microbatch plan identical on every rank.
        * ``sequence_packing_args`` (``max_tokens_per_microbatch``, ``algorithm``,
          ``sequence_length_pad_multiple``, ``input_key``, ``input_lengths_key``, optional
          ``microbatch_order``): bins packed with ``min_bin_count = bin_count_multiple =
          shards``; rank r takes bins ``r, r + shards, ...``; one bin per microbatch.

        Returns the list of shards without packing, else ``(shards, order)``, ``order[p]`` being the
        original index of row ``p`` of the rank-concatenated shards (for ``reorder_data``).

        Raises:
            ValueError: Empty batch, indivisible sizes, both argument sets, a planned length
                above ``max_tokens_per_microbatch``, or an unknown ``microbatch_order``.
            KeyError: A required argument or field is missing.
        """
        total = self.size
        if int(shards) < 1:
            raise ValueError(f"shard_by_batch_size: shards must be >= 1, got {shards}")
        if total == 0:
            raise ValueError("shard_by_batch_size: the batch is empty")
        if dynamic_batching_args is not None and sequence_packing_args is not None:
            raise ValueError("Pass at most one of sequence_packing_args / dynamic_batching_args.")
        bs = total if batch_size is None else int(batch_size)
        if bs < 1 or total % bs != 0:
            raise ValueError(f"shard_by_batch_size: batch size {total} is not a multiple of batch_size {bs}")
        if bs % shards != 0:
            raise ValueError(f"shard_by_batch_size: batch_size {bs} is not divisible by shards {shards}")
        chunks = total // bs
        per_rank = bs // shards

        if dynamic_batching_args is None and sequence_packing_args is None:
            return [
                self.select_indices([k * bs + r * per_rank + j for k in range(chunks) for j in range(per_rank)])
                for r in range(shards)
            ]

        args = dynamic_batching_args if dynamic_batching_args is not None else sequence_packing_args
        input_key = args["input_key"]
        lengths_key = args["input_lengths_key"]
        max_tokens = int(args["max_tokens_per_microbatch"])
        if input_key not in self.data:
            raise KeyError(f"shard_by_batch_size: input_key {input_key!r} not in the batch")
        if lengths_key not in self.data:
            raise KeyError(f"shard_by_batch_size: input_lengths_key {lengths_key!r} not in the batch")
        raw_lengths = self.data[lengths_key]
        lengths = [int(x) for x in (raw_lengths.tolist() if isinstance(raw_lengths, torch.Tensor) else raw_lengths)]

        rank_rows = [[] for _ in range(shards)]
        plans_idx: list[list[list[list[int]]]] = [[] for _ in range(shards)]
        plans_len: list[list[list[int]]] = [[] for _ in range(shards)]
        counts: list[list[int]] = [[] for _ in range(shards)]

        if dynamic_batching_args is not None:
            round_to = int(dynamic_batching_args["sequence_length_round"])
            inputs = self.data[input_key]
            if not isinstance(inputs, torch.Tensor) or inputs.dim() < 2:
                raise ValueError(
                    f"shard_by_batch_size: dynamic batching needs a 2-D {input_key!r} tensor "
                    "(its width caps each microbatch length)"
                )
            width = int(inputs.shape[1])
            for k in range(chunks):
                base = k * bs
                ordered = sorted(range(base, base + bs), key=lambda i: lengths[i])
                parts = [ordered[r::shards] for r in range(shards)]
                caps = [min(_round_up(max(lengths[p[j]] for p in parts), round_to), width) for j in range(per_rank)]
                for cap_j in caps:
                    if cap_j > max_tokens:
                        raise ValueError(
                            f"shard_by_batch_size: a sequence of padded length {cap_j} exceeds "
                            f"max_tokens_per_microbatch {max_tokens}"
                        )
                indices, mb_lengths = _greedy_microbatches(caps, max_tokens)
                for r in range(shards):
                    rank_rows[r].extend(parts[r])
                    plans_idx[r].append(copy.deepcopy(indices))
                    plans_len[r].append(list(mb_lengths))
        else:
            mb_order = args["microbatch_order"] if "microbatch_order" in args else None
            if mb_order not in MICROBATCH_ORDERS:
                raise ValueError(
                    f"shard_by_batch_size: microbatch_order must be one of {MICROBATCH_ORDERS}, got {mb_order!r}"
                )
            pad_multiple = int(sequence_packing_args["sequence_length_pad_multiple"])
            packer = get_packer(
                sequence_packing_args["algorithm"],
                bin_capacity=max_tokens,
                min_bin_count=shards,
                bin_count_multiple=shards,
            )
            for k in range(chunks):
                base = k * bs
                padded = [_round_up(lengths[base + i], pad_multiple) for i in range(bs)]
                bins = packer.pack(padded)
                for r in range(shards):
                    mine = bins[r::shards]
                    if mb_order == "largest_first":
                        mine = sorted(mine, key=lambda b: sum(padded[i] for i in b), reverse=True)
                    start = 0
                    chunk_idx: list[list[int]] = []
                    chunk_len: list[int] = []
                    for b in mine:
                        rank_rows[r].extend(base + i for i in b)
                        chunk_idx.append([start, start + len(b)])
                        chunk_len.append(sum(padded[i] for i in b))
                        start += len(b)
                    plans_idx[r].append(chunk_idx)
                    plans_len[r].append(chunk_len)
                    counts[r].append(start)

        out: list[BatchedDataDict] = []
        for r in range(shards):
            shard = self.select_indices(rank_rows[r])
            shard.micro_batch_indices = plans_idx[r]
            shard.micro_batch_lengths = plans_len[r]
            shard.elem_counts_per_gb = counts[r] if sequence_packing_args is not None else None
            out.append(shard)
        order = [i for rows in rank_rows for i in rows]
        return out, order

    def microbatch_plan(self, micro_batch_size: int | None = None) -> list[MicrobatchSpec]:
        """The microbatches of this shard as absolute row ranges.

        With a plan attached the chunks are laid out consecutively (chunk k starts where chunk k-1
        ended; ``elem_counts_per_gb``, when present, must agree).  Without a plan the rows are cut
        into runs of ``micro_batch_size`` (required, >= 1; the last run may be shorter).
        ValueError for an inconsistent or incomplete plan, or a missing/invalid ``micro_batch_size``.
        """
        n = self.size
        if self.micro_batch_indices is None:
            if self.micro_batch_lengths is not None:
                raise ValueError("microbatch_plan: micro_batch_lengths set without micro_batch_indices")
            if micro_batch_size is None or int(micro_batch_size) < 1:
                raise ValueError(
                    "microbatch_plan: no plan attached, so micro_batch_size (>= 1) is required, "
                    f"got {micro_batch_size}"
                )
            mbs = int(micro_batch_size)
            return [MicrobatchSpec(0, s, min(s + mbs, n), None) for s in range(0, n, mbs)]
        if self.micro_batch_lengths is None:
            raise ValueError("microbatch_plan: micro_batch_indices set without micro_batch_lengths")
        if len(self.micro_batch_indices) != len(self.micro_batch_lengths):
            raise ValueError(
                f"microbatch_plan: {len(self.micro_batch_indices)} chunks of indices but "
                f"{len(self.micro_batch_lengths)} chunks of lengths"
            )
        specs: list[MicrobatchSpec] = []
        base = 0
        for k, (pairs, lens) in enumerate(zip(self.micro_batch_indices, self.micro_batch_lengths)):
            if len(pairs) != len(lens):
                raise ValueError(f"microbatch_plan: chunk {k} has {len(pairs)} microbatches but {len(lens)} lengths")
            expected = 0
            for (start, end), length in zip(pairs, lens):
                if int(start) != expected or int(end) < int(start):
                    raise ValueError(
                        f"microbatch_plan: chunk {k} microbatch [{start}, {end}) does not continue "
                        f"at row {expected}"
                    )
                specs.append(MicrobatchSpec(k, base + int(start), base + int(end), int(length)))
                expected = int(end)
            if self.elem_counts_per_gb is not None and int(self.elem_counts_per_gb[k]) != expected:
                raise ValueError(
                    f"microbatch_plan: chunk {k} covers {expected} rows but elem_counts_per_gb "
                    f"says {self.elem_counts_per_gb[k]}"
                )
            base += expected
        if base != n:
            raise ValueError(f"microbatch_plan: the plan covers {base} rows, the shard has {n}")
        return specs

    def __repr__(self) -> str:
        return f"BatchedDataDict({self.data!r})"


def _greedy_microbatches(caps: list[int], max_tokens: int) -> tuple[list[list[int]], list[int]]:
    """Cut positions into microbatches while ``count * max(cap) <= max_tokens``."""
    indices: list[list[int]] = []
    lengths: list[int] = []
    start = 0
    current = 0
    for j, cap in enumerate(caps):
        widest = max(current, cap)
        if j > start and (j - start + 1) * widest > max_tokens:
            indices.append([start, j])
            lengths.append(current)
            start = j
            current = cap
        else:
            current = widest
    if caps:
        indices.append([start, len(caps)])
        lengths.append(current)
    return indices, lengths
