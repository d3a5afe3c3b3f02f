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


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread_in_the_test_process() -> None:
    """Tests run on 2 shared cores; intra-op threads in the pytest process only add contention.

    Worker processes (Ray actors, launcher subprocesses) set their own thread counts from config.
    """
    import torch

    torch.set_num_threads(1)
