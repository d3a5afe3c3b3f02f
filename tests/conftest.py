"""Test-tier markers by directory: tests/unit -> unit, tests/integration -> integration,
tests/e2e -> e2e, so that `-m unit` selects the fast tier without per-file boilerplate."""

from __future__ import annotations

import pathlib

import pytest

_TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = pathlib.Path(str(item.fspath)).parts
        for tier in _TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
