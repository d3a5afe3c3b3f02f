"""``PackedTensor``: a batch column of per-sample tensors that a model consumes concatenated.

For inputs like ``pixel_values`` whose size differs per sample: one entry per sample (or
``None``), so a batch can be selected, sharded and stored per sample; :meth:`as_tensor` gives the
model input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import torch

__all__ = ["IMAGE_FIELDS", "IMAGE_GRID_THW", "PIXEL_VALUES", "PackedTensor"]

#: A vision-language batch's per-sample image columns (``PackedTensor``, one entry per row):
#: the patches of a row's images, and one ``(t, h, w)`` grid per image.
PIXEL_VALUES = "pixel_values"
IMAGE_GRID_THW = "image_grid_thw"
IMAGE_FIELDS: tuple[str, ...] = (PIXEL_VALUES, IMAGE_GRID_THW)

Entry = Optional[torch.Tensor]


def _check_dim(dim_to_pack: object) -> int:
    if isinstance(dim_to_pack, bool) or not isinstance(dim_to_pack, int):
        raise TypeError(
            f"PackedTensor: dim_to_pack must be an int, got {type(dim_to_pack).__name__} "
            f"({dim_to_pack!r})"
        )
    return dim_to_pack


def _check_entries(entries: list[object], where: str) -> list[Entry]:
    for i, t in enumerate(entries):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(
                f"{where}: entry {i} must be a torch.Tensor or None, got {type(t).__name__}"
            )
    return entries  # type: ignore[return-value]


class PackedTensor:
    """Per-sample tensors (or ``None``) packed along ``dim_to_pack`` when used.

    Args:
        tensors: One tensor (a column of one entry) or a non-empty list whose entries are
            tensors or ``None``.  The list is copied; the tensors are not.

    Raises:
        TypeError: ``tensors`` is neither a tensor nor a list, an entry is neither a tensor nor
            ``None``, or ``dim_to_pack`` is not an int.
        ValueError: ``tensors`` is an empty list.
    """

    __slots__ = ("tensors", "dim_to_pack")

    def __init__(self, tensors: Union[torch.Tensor, Sequence[Entry]], dim_to_pack: int) -> None:
        self.dim_to_pack = _check_dim(dim_to_pack)
        if isinstance(tensors, torch.Tensor):
            self.tensors: list[Entry] = [tensors]
        elif isinstance(tensors, (list, tuple)):
            if len(tensors) == 0:
                raise ValueError("PackedTensor: tensors must be a tensor or a non-empty list")
            self.tensors = _check_entries(list(tensors), "PackedTensor")
        elif tensors is None:
            raise TypeError("PackedTensor: tensors must be a tensor or a non-empty list, got None")
        else:
            raise TypeError(
                "PackedTensor: tensors must be a tensor or a non-empty list of tensors/None, "
                f"got {type(tensors).__name__}"
            )

    def as_tensor(self, device: Union[str, torch.device, None] = None) -> Optional[torch.Tensor]:
        """The non-``None`` entries concatenated along ``dim_to_pack``; ``None`` when all are ``None``.

        With ``device``, the entries are first moved there (in place, as :meth:`to`).
        """
        if device is not None:
            self.to(device)
        present = [t for t in self.tensors if t is not None]
        if not present:
            return None
        return torch.cat(present, dim=self.dim_to_pack)

    def __len__(self) -> int:
        return len(self.tensors)

    def to(self, device: Union[str, torch.device]) -> PackedTensor:
        """Move every entry to ``device`` in place; returns ``self``."""
        self.tensors = [None if t is None else t.to(device) for t in self.tensors]
        return self

    def slice(self, indices: Union[Sequence[int], torch.Tensor]) -> PackedTensor:
        """The entries at ``indices`` (in order, duplicates allowed) as a new PackedTensor sharing them.

        ``indices`` may be an integer tensor of any shape (flattened).

        Raises:
            TypeError: An index is not an integer.
            IndexError: An index is outside ``[-len, len)``.
            ValueError: ``indices`` is empty (a PackedTensor has at least one entry).
        """
        if isinstance(indices, torch.Tensor):
            if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
                raise TypeError(f"PackedTensor.slice: indices tensor of dtype {indices.dtype}")
            idx = [int(i) for i in indices.reshape(-1).tolist()]
        else:
            idx = []
            for i in indices:
                if isinstance(i, bool) or not isinstance(i, int):
                    raise TypeError(
                        f"PackedTensor.slice: index {i!r} is a {type(i).__name__}, not an int"
                    )
                idx.append(i)
        n = len(self.tensors)
        for i in idx:
            if not -n <= i < n:
                raise IndexError(f"PackedTensor.slice: index {i} out of range for {n} entries")
        return PackedTensor([self.tensors[i] for i in idx], self.dim_to_pack)

    @classmethod
    def empty_like(cls, other: PackedTensor) -> PackedTensor:
        """A PackedTensor with as many entries as ``other``, all ``None``, same ``dim_to_pack``.

        Raises:
            TypeError: ``other`` is not a PackedTensor.
        """
        if not isinstance(other, PackedTensor):
            raise TypeError(f"PackedTensor.empty_like: expected a PackedTensor, got {type(other).__name__}")
        return cls([None] * len(other), other.dim_to_pack)

    @staticmethod
    def _common_dim(parts: Sequence[PackedTensor], op: str) -> int:
        if isinstance(parts, PackedTensor) or not isinstance(parts, (list, tuple)):
            raise TypeError(f"PackedTensor.{op}: expected a list of PackedTensors")
        if not parts:
            raise ValueError(f"PackedTensor.{op}: needs at least one PackedTensor")
        for i, p in enumerate(parts):
            if not isinstance(p, PackedTensor):
                raise TypeError(f"PackedTensor.{op}: item {i} is a {type(p).__name__}, not a PackedTensor")
        dims = sorted({p.dim_to_pack for p in parts})
        if len(dims) > 1:
            raise ValueError(f"PackedTensor.{op}: the inputs pack along different dims {dims}")
        return dims[0]

    @classmethod
    def concat(cls, from_packed_tensors: Sequence[PackedTensor]) -> PackedTensor:
        """All entries of the inputs, in order (``len`` is the sum of the inputs' lengths).

        Raises:
            TypeError: Not a list of PackedTensors.
            ValueError: Empty list, or the inputs have different ``dim_to_pack``.
        """
        dim = cls._common_dim(from_packed_tensors, "concat")
        return cls([t for p in from_packed_tensors for t in p.tensors], dim)

    @classmethod
    def flattened_concat(cls, from_packed_tensors: Sequence[PackedTensor]) -> PackedTensor:
        """One entry per input: that input's :meth:`as_tensor` (``None`` if it has none); raises as :meth:`concat`."""
        dim = cls._common_dim(from_packed_tensors, "flattened_concat")
        return cls([p.as_tensor() for p in from_packed_tensors], dim)

    def __repr__(self) -> str:
        shapes = [None if t is None else tuple(t.shape) for t in self.tensors]
        return f"PackedTensor(dim_to_pack={self.dim_to_pack}, entries={shapes})"
