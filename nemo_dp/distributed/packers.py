"""Deterministic bin packers for sequence packing (ties broken by index); the bin count is then raised to at
least ``min_bin_count`` and a multiple of ``bin_count_multiple`` so every DP rank gets as many micro-batches."""

from __future__ import annotations

import abc
from collections.abc import Sequence

__all__ = [
    "PACKER_NAMES",
    "SequencePacker",
    "ConcatenativePacker",
    "FirstFitDecreasingPacker",
    "ModifiedFirstFitDecreasingPacker",
    "get_packer",
]


class SequencePacker(abc.ABC):
    """Packs sequence lengths into bins of bounded capacity, then adjusts the bin count.

    ValueError if ``bin_capacity`` < 1, ``min_bin_count`` < 0 or ``bin_count_multiple`` < 1."""

    def __init__(self, bin_capacity: int, min_bin_count: int = 0, bin_count_multiple: int = 1):
        bounds = (("bin_capacity", bin_capacity, 1), ("min_bin_count", min_bin_count, 0))
        for name, value, lower in (*bounds, ("bin_count_multiple", bin_count_multiple, 1)):
            if int(value) < lower:
                raise ValueError(f"{name} must be >= {lower}, got {value}")
        self.bin_capacity = int(bin_capacity)
        self.min_bin_count = int(min_bin_count)
        self.bin_count_multiple = int(bin_count_multiple)

    def pack(self, lengths: Sequence[int]) -> list[list[int]]:
        """Pack non-negative (already padded) ``lengths`` into bins of indices, each index once.

        ValueError if a length is negative or above capacity, or there are fewer items than bins."""
        lens = [int(x) for x in lengths]
        for i, length in enumerate(lens):
            if length < 0:
                raise ValueError(f"sequence {i} has negative length {length}")
            if length > self.bin_capacity:
                raise ValueError(f"sequence {i} has length {length}, above the bin capacity {self.bin_capacity}")
        return self._adjust_bin_count(self._pack(lens), len(lens))

    @abc.abstractmethod
    def _pack(self, lengths: list[int]) -> list[list[int]]:
        """Algorithm-specific packing (lengths already validated)."""

    def _adjust_bin_count(self, bins: list[list[int]], n_items: int) -> list[list[int]]:
        """Split bins until the count reaches the target: each new bin takes the last item of the
        current donor (bins by (item count, index) descending, each used down to one item)."""
        target = max(len(bins), self.min_bin_count)
        target += -target % self.bin_count_multiple
        if target == len(bins):
            return bins
        if n_items < target:
            raise ValueError(
                f"cannot make {target} bins (min_bin_count={self.min_bin_count}, "
                f"bin_count_multiple={self.bin_count_multiple}) from only {n_items} sequences"
            )
        out = [list(b) for b in bins]
        donors = sorted(range(len(out)), key=lambda i: (len(out[i]), i), reverse=True)
        d = 0
        for _ in range(target - len(bins)):
            while len(out[donors[d]]) < 2:
                d += 1
            out.append([out[donors[d]].pop()])
        return out


class ConcatenativePacker(SequencePacker):
    """In input order, append to the current bin while it fits, else open a new bin."""

    def _pack(self, lengths: list[int]) -> list[list[int]]:
        bins: list[list[int]] = []
        used = 0
        for i, length in enumerate(lengths):
            if bins and used + length <= self.bin_capacity:
                bins[-1].append(i)
                used += length
            else:
                bins.append([i])
                used = length
        return bins


def _first_fit(order: Sequence[int], lengths: Sequence[int], capacity: int) -> list[list[int]]:
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for b, load in enumerate(loads):
            if load + lengths[i] <= capacity:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return bins


def _decreasing(indices: Sequence[int], lengths: Sequence[int]) -> list[int]:
    return sorted(indices, key=lambda i: (lengths[i], i), reverse=True)


class FirstFitDecreasingPacker(SequencePacker):
    """Sort by (length, index) descending; place each in the first bin with room."""

    def _pack(self, lengths: list[int]) -> list[list[int]]:
        return _first_fit(_decreasing(range(len(lengths)), lengths), lengths, self.bin_capacity)


class ModifiedFirstFitDecreasingPacker(SequencePacker):
    """Johnson-Garey modified first-fit decreasing.

    Items are classed by capacity ``C``: large (> C/2), medium (C/3, C/2], small (C/6, C/3],
    tiny (<= C/6).  One bin per large item (largest first); a forward pass gives each large bin
    the largest medium item that fits; a backward pass gives each bin without a medium item
    the smallest small item plus the largest small item that still fits, when the two smallest
    small items fit together; then each bin in turn takes the largest remaining item that fits
    until none does; leftovers go first-fit-decreasing into new bins.
    """

    def _pack(self, lengths: list[int]) -> list[list[int]]:
        cap = self.bin_capacity
        # Comparisons in integers: x > C/2  <=>  2x > C, etc.
        large = [i for i, x in enumerate(lengths) if 2 * x > cap]
        medium = [i for i, x in enumerate(lengths) if 3 * x > cap >= 2 * x]
        small = [i for i, x in enumerate(lengths) if 6 * x > cap >= 3 * x]
        tiny = [i for i, x in enumerate(lengths) if cap >= 6 * x]

        bins = [[i] for i in _decreasing(large, lengths)]
        loads = [lengths[b[0]] for b in bins]

        def take_first_fit(b: int, pool: list[int]) -> bool:
            """Move the first item of ``pool`` that fits into bin ``b``; whether one did."""
            for pos, i in enumerate(pool):
                if loads[b] + lengths[i] <= cap:
                    bins[b].append(i)
                    loads[b] += lengths[i]
                    del pool[pos]
                    return True
            return False

        medium_pool = _decreasing(medium, lengths)  # largest first
        has_medium = [take_first_fit(b, medium_pool) for b in range(len(bins))]

        small_pool = _decreasing(small, lengths)  # largest first; smallest is last
        for b in reversed(range(len(bins))):
            if has_medium[b] or len(small_pool) < 2:
                continue
            if loads[b] + lengths[small_pool[-1]] + lengths[small_pool[-2]] > cap:
                continue
            smallest = small_pool.pop()
            bins[b].append(smallest)
            loads[b] += lengths[smallest]
            take_first_fit(b, small_pool)

        remaining = _decreasing(medium_pool + small_pool + tiny, lengths)
        for b in range(len(bins)):
            while remaining and take_first_fit(b, remaining):
                pass
        return bins + _first_fit(remaining, lengths, cap)


_PACKERS: dict[str, type[SequencePacker]] = {
    "concatenative": ConcatenativePacker,
    "first_fit_decreasing": FirstFitDecreasingPacker,
    "modified_first_fit_decreasing": ModifiedFirstFitDecreasingPacker,
}

PACKER_NAMES: tuple[str, ...] = tuple(_PACKERS)


def get_packer(
    algorithm: str, bin_capacity: int, min_bin_count: int = 0, bin_count_multiple: int = 1
) -> SequencePacker:
    """Build the :class:`SequencePacker` named ``algorithm`` (one of :data:`PACKER_NAMES`).

    ValueError for an unknown name or an out-of-range parameter."""
    cls = _PACKERS.get(algorithm)
    if cls is None:
        raise ValueError(f"unknown packing algorithm {algorithm!r}; known: {sorted(_PACKERS)}")
    return cls(bin_capacity, min_bin_count, bin_count_multiple)
