"""Argument-validation helpers shared by the data-plane adapters.

Why this module exists: the process-local and the TransferQueue adapters validate caller
arguments the same way where the contract fixes the behaviour; keeping those helpers here
means both report the same findings.  Standard library only (never Ray or transfer_queue), so
importing it costs nothing and cannot pull a backend in.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["duplicates"]


def duplicates(values: Sequence[str]) -> list[str]:
    """The values that occur more than once.

    Args:
        values: Names or ids.

    Returns:
        The repeated values, sorted, each once (empty when all are distinct).
    """
    # fast path in C for the common case (large id lists without repeats)
    if len(set(values)) == len(values):
        return []
    seen: set[str] = set()
    dups: set[str] = set()
    for v in values:
        if v in seen:
            dups.add(v)
        seen.add(v)
    return sorted(dups)
