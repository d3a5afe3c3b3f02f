"""Argument-validation helpers shared by the data-plane adapters, so they report the same findings.

Standard library only: importing it cannot pull a backend in.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

__all__ = ["check_claim_request", "check_name", "check_names", "check_positive_int", "duplicates", "listed"]

_MAX_LISTED_IDS = 20


def listed(ids: Sequence[str]) -> str:
    """``ids`` sorted, for a message: the first 20 and how many more."""
    ids = sorted(ids)
    shown = ", ".join(repr(i) for i in ids[:_MAX_LISTED_IDS])
    more = len(ids) - _MAX_LISTED_IDS
    return f"[{shown}{f', ... ({more} more)' if more > 0 else ''}]"


def check_name(value: Any, what: str) -> str:
    """``value`` if it is a non-empty str.

    Raises:
        TypeError: Not a str (names ``what`` and the value).
        ValueError: The empty string.
    """
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__} ({value!r})")
    if not value:
        raise ValueError(f"{what} must be a non-empty str")
    return value


def check_names(values: Any, what: str) -> list[str]:
    """A sequence of names (not a bare str); each a non-empty str.

    Raises:
        TypeError: Not a sequence, a bare str, or an entry that is not a str.
        ValueError: An empty-string entry.
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{what} must be a sequence of str, got {type(values).__name__}")
    out = list(values)
    # fast path in C for the common case (large id lists); the loop below names the culprit
    if set(map(type, out)) <= {str} and "" not in out:
        return out
    return [check_name(v, f"{what} entry") for v in out]


def check_positive_int(value: Any, what: str) -> int:
    """``value`` if it is an int >= 1 (bools refused).

    Raises:
        TypeError: Not an int.
        ValueError: Below 1.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__} ({value!r})")
    if value < 1:
        raise ValueError(f"{what} must be >= 1, got {value}")
    return value


def check_claim_request(
    partition_id: str,
    declared: Collection[str],
    required_fields: Any,
    batch_size: Any,
    timeout_s: Any,
) -> list[str]:
    """The arguments of ``claim_meta`` that every adapter checks the same way.

    Args:
        partition_id: The partition (for messages).
        declared: The partition's declared fields.
        required_fields: The fields a claimed row must have.
        batch_size: Rows to claim.
        timeout_s: How long a blocking claim may wait.

    Returns:
        ``required_fields`` as a list.

    Raises:
        TypeError: Non-str names, non-int ``batch_size``, non-number ``timeout_s``.
        ValueError: No required field, an undeclared one (named with the declared fields),
            ``batch_size < 1`` or ``timeout_s <= 0``.
    """
    required = check_names(required_fields, "required_fields")
    if not required:
        raise ValueError("claim_meta: required_fields must name at least one field")
    if undeclared := [f for f in required if f not in declared]:
        raise ValueError(
            f"claim_meta: required_fields {undeclared} are not declared fields of partition "
            f"{partition_id!r} (declared: {list(declared)})"
        )
    check_positive_int(batch_size, "batch_size")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(f"timeout_s must be a number, got {type(timeout_s).__name__}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    return required


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

