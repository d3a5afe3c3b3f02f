"""Typed errors for dataset problems, so callers can map them to a config key and a file line."""

from __future__ import annotations

__all__ = ["DatasetError", "UnknownCharacterError"]


class DatasetError(ValueError):
    """A dataset cannot be used as configured.

    The message reads ``"<key>: <path>:<line>: field '<field>' <problem>[; <fix>]"`` with the
    unknown parts left out; a table without lines gives ``"<path>: row <row>: ..."`` (``row``
    0-based; ``line`` 1-based).
    """

    def __init__(
        self, problem: str, *, key: str | None = None, path: str | None = None, line: int | None = None,
        field: str | None = None, fix: str | None = None, row: int | None = None,
    ) -> None:
        self.problem, self.key, self.path, self.line = problem, key, path, line
        self.field, self.fix, self.row = field, fix, row
        super().__init__(self._render())

    def _render(self) -> str:
        where = self.path if self.path is None or self.line is None else f"{self.path}:{self.line}"
        row = f"row {self.row}" if self.row is not None and self.line is None else None
        problem = self.problem if self.field is None else f"field {self.field!r} {self.problem}"
        text = ": ".join(p for p in (self.key, where, row, problem) if p is not None)
        return f"{text}; {self.fix}" if self.fix else text


class UnknownCharacterError(ValueError):
    """Text holds a character outside a fixed vocabulary (``position``: its index in ``text``)."""

    def __init__(self, char: str, position: int, text: str) -> None:
        self.char, self.position, self.text = char, position, text
        super().__init__(f"unknown character {char!r} at position {position} in {text!r}")
