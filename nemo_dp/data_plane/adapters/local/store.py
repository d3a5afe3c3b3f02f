"""Stored columns and partitions of the process-local data plane.

Columns own their bytes and are never mutated after a put, so reads gather from them without the
client's lock.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

import torch

from nemo_dp.data_plane.adapters._book import PartitionRecord
from nemo_dp.utils.packed_tensor import PackedTensor

#: Kinds (in place of a dtype) of a non-tensor, a ``PackedTensor`` and a dict column.
OBJECT_KIND = "object"
PACKED_KIND = "packed"
DICT_KIND = "dict"


def contiguous_run(positions: list[int]) -> tuple[int, int] | None:
    """``(start, stop)`` if ``positions`` is ``start, start+1, ..., stop-1``, else ``None``."""
    if not positions:
        return None
    start, stop = positions[0], positions[0] + len(positions)
    # cheap bound check first; the list comparison then runs in C
    if positions[-1] != stop - 1 or positions != list(range(start, stop)):
        return None
    return start, stop


@dataclass
class Selection:
    """Stored row positions to read, with the contiguous-run fast path computed once."""

    positions: list[int]
    run: tuple[int, int] | None = None
    _index: torch.Tensor | None = None

    @classmethod
    def of(cls, positions: list[int]) -> Selection:
        return cls(positions, contiguous_run(positions))

    @property
    def index(self) -> torch.Tensor:
        if self._index is None:
            self._index = torch.as_tensor(self.positions, dtype=torch.long)
        return self._index


@dataclass
class DenseColumn:
    """A rectangular column: ``data[row]`` is one row."""

    data: torch.Tensor

    @property
    def kind(self) -> str:
        return str(self.data.dtype)

    @property
    def num_rows(self) -> int:
        return self.data.size(0)

    def take(self, sel: Selection) -> torch.Tensor:
        if sel.run is not None:
            return self.data[sel.run[0] : sel.run[1]].clone(memory_format=torch.contiguous_format)
        return self.data.index_select(0, sel.index)


@dataclass
class JaggedColumn:
    """A ragged column: row ``r`` is ``values[offsets[r]:offsets[r + 1]]``."""

    values: torch.Tensor
    offsets: torch.Tensor  # int64, (rows + 1,), starts at 0

    @property
    def kind(self) -> str:
        return str(self.values.dtype)

    @property
    def num_rows(self) -> int:
        return self.offsets.numel() - 1

    def take_parts(self, sel: Selection) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh compact ``(values, offsets)`` of the selected rows."""
        run = sel.run
        if run is not None:
            lo = int(self.offsets[run[0]])
            hi = int(self.offsets[run[1]])
            values = self.values[lo:hi].clone(memory_format=torch.contiguous_format)
            offsets = self.offsets[run[0] : run[1] + 1] - lo
            return values, offsets
        starts = self.offsets[:-1]
        return gather_jagged(self.values, starts, self.offsets[1:] - starts, sel.index)

    def take(self, sel: Selection) -> torch.Tensor:
        values, offsets = self.take_parts(sel)
        return torch.nested.nested_tensor_from_jagged(values, offsets)


def gather_jagged(
    values: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One ``index_select`` gathering rows ``rows`` of a (possibly holey) jagged layout."""
    sel_starts = starts.index_select(0, rows).to(torch.long)
    sel_lengths = lengths.index_select(0, rows).to(torch.long)
    offsets = torch.zeros(rows.numel() + 1, dtype=torch.long)
    torch.cumsum(sel_lengths, 0, out=offsets[1:])
    total = int(offsets[-1])
    # element k of output row i comes from values[sel_starts[i] + k]
    shift = torch.repeat_interleave(sel_starts - offsets[:-1], sel_lengths, output_size=total)
    index = torch.arange(total, dtype=torch.long) + shift
    return values.index_select(0, index), offsets


@dataclass
class ObjectColumn:
    """A non-tensor column: one Python object per row (deep-copied on the way in and out)."""

    values: list[Any]
    kind: ClassVar[str] = OBJECT_KIND

    @property
    def num_rows(self) -> int:
        return len(self.values)

    def take(self, sel: Selection) -> list[Any]:
        return copy.deepcopy([self.values[p] for p in sel.positions])


def _own_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True, memory_format=torch.contiguous_format)


@dataclass
class PackedColumn:
    """A ``PackedTensor`` column: one owned CPU entry (or ``None``) per row."""

    entries: list[torch.Tensor | None]
    dim_to_pack: int
    kind: ClassVar[str] = PACKED_KIND

    @classmethod
    def of(cls, packed: PackedTensor) -> PackedColumn:
        return cls([None if t is None else _own_copy(t) for t in packed.tensors], packed.dim_to_pack)

    @property
    def num_rows(self) -> int:
        return len(self.entries)

    def take(self, sel: Selection) -> PackedTensor:
        picked = [self.entries[p] for p in sel.positions]
        return PackedTensor([None if t is None else t.clone() for t in picked], self.dim_to_pack)


@dataclass
class DictColumn:
    """A dict column: key -> sub-column, every sub-column with the same rows."""

    columns: dict[str, Column]
    kind: ClassVar[str] = DICT_KIND

    @property
    def num_rows(self) -> int:
        return next(iter(self.columns.values())).num_rows

    def take(self, sel: Selection) -> dict[str, Any]:
        return {k: col.take(sel) for k, col in self.columns.items()}


Column = Union[DenseColumn, JaggedColumn, ObjectColumn, PackedColumn, DictColumn]


def store_tensor(name: str, t: torch.Tensor) -> DenseColumn | JaggedColumn:
    """One detached, compact CPU copy of a put's tensor leaf."""
    t = t.detach()
    if not t.is_nested:
        return DenseColumn(t.to("cpu", copy=True, memory_format=torch.contiguous_format))
    if t.layout == torch.jagged:
        values = t.values()
        offsets = t.offsets().to("cpu", torch.long)
        lengths = t.lengths()
        if lengths is None:
            lo, hi = int(offsets[0]), int(offsets[-1])
            stored = values[lo:hi].to("cpu", copy=True, memory_format=torch.contiguous_format)
            return JaggedColumn(stored, (offsets - lo).contiguous())
        rows = torch.arange(offsets.numel() - 1, dtype=torch.long)
        values, offsets = gather_jagged(values.cpu(), offsets[:-1], lengths.cpu(), rows)
        return JaggedColumn(values, offsets)
    # strided nested tensor: rows may differ only in their first dimension
    rows_list = [r.to("cpu") for r in t.unbind()]
    trailing = {tuple(r.shape[1:]) for r in rows_list}
    if any(r.dim() == 0 for r in rows_list) or len(trailing) > 1:
        raise TypeError(
            f"field {name!r}: nested tensor rows must share all but their first dimension; "
            "use layout=torch.jagged"
        )
    lengths = torch.tensor([r.size(0) for r in rows_list], dtype=torch.long)
    offsets = torch.zeros(len(rows_list) + 1, dtype=torch.long)
    torch.cumsum(lengths, 0, out=offsets[1:])
    values = torch.cat(rows_list) if rows_list else torch.empty(0, dtype=t.dtype)
    return JaggedColumn(values.contiguous(), offsets)


@dataclass
class Partition(PartitionRecord):
    """The book's record plus its rows, stored once as columns.

    Attributes:
        generation: Registration counter value, checked by ``get_data`` against stale metadata.
        row_of: live id -> row of the stored columns; insertion order is the stored order.
    """

    generation: int = 0
    written: bool = False
    row_of: dict[str, int] = field(default_factory=dict)
    columns: dict[str, Column] = field(default_factory=dict)

    def row_ids(self) -> dict[str, int]:
        return self.row_of

    def ready_rows(self, required: Sequence[str]) -> Iterable[str]:
        return self.row_of if all(f in self.columns for f in required) else ()

    def drop_row(self, sample_id: str) -> None:
        """Forget a row (its column cells stay until the partition is dropped)."""
        del self.row_of[sample_id]
