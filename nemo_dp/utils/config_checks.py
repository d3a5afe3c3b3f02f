"""Range checks of the config schemas, each error naming the full config key."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import field, fields
from typing import Any, NoReturn

__all__ = [
    "fail",
    "at_least",
    "at_least_each",
    "positive",
    "one_of",
    "at_least_field",
    "positive_field",
    "one_of_field",
    "Checked",
]


def fail(key: str, message: str) -> NoReturn:
    """Raise ``ValueError("<key>: <message>")``."""
    raise ValueError(f"{key}: {message}")


def at_least(key: str, value: float, lower: float) -> None:
    """Refuse ``value < lower`` (or a NaN)."""
    if not value >= lower:
        fail(key, f"must be >= {lower}, got {value!r}")


def at_least_each(prefix: str, node: Any, **lower: float) -> None:
    """:func:`at_least` on ``node.<name> >= bound`` for each ``name=bound``, in order (errors name ``prefix.name``)."""
    for name, bound in lower.items():
        at_least(f"{prefix}.{name}", getattr(node, name), bound)


def positive(key: str, value: float) -> None:
    """Refuse ``value <= 0`` (or a NaN)."""
    if not value > 0:
        fail(key, f"must be > 0, got {value!r}")


def one_of(key: str, value: Any, legal: Sequence[Any]) -> None:
    """Refuse a ``value`` not in ``legal``, listing the legal values."""
    if value not in legal:
        fail(key, f"got {value!r}; legal values: {list(legal)}")


def _checked_field(default: Any, rule: Callable[[str, Any], None]) -> Any:
    return field(default=default, metadata={"rule": rule})


def at_least_field(default: float, lower: float) -> Any:
    """A :class:`Checked` field that must be ``>= lower``."""
    return _checked_field(default, lambda key, value: at_least(key, value, lower))


def positive_field(default: float) -> Any:
    """A :class:`Checked` field that must be ``> 0``."""
    return _checked_field(default, positive)


def one_of_field(default: Any, legal: Sequence[Any]) -> Any:
    """A :class:`Checked` field whose value must be one of ``legal``."""
    return _checked_field(default, lambda key, value: one_of(key, value, legal))


class Checked:
    """Base of a schema dataclass ``class X(Checked, key="policy.model")``: checks its fields' declared bounds
    in declaration order (errors name ``<key>.<field>``), then :meth:`check`."""

    _key = ""

    def __init_subclass__(cls, key: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._key = key

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            rule = f.metadata.get("rule")
            if rule is not None:
                rule(f"{self._key}.{f.name}", getattr(self, f.name))
        self.check()

    def check(self) -> None:
        """Rules beyond the field bounds (run after them); none by default."""
