"""Test-tier markers by directory and the grouping of tests onto parallel workers.

Tier markers: tests/unit -> unit, tests/integration -> integration, tests/e2e -> e2e, so that
`-m unit` selects the fast tier without per-file boilerplate. Worker groups: `make test` runs
the suite on parallel workers (`pytest -n 2 --dist loadgroup`); each file is one group, except
that files sharing an expensive session fixture share a group (and so one worker).
"""

from __future__ import annotations

import pathlib

import pytest

_TIERS = ("unit", "integration", "e2e")


#: Session fixtures that run something expensive once per test process: every file that uses
#: one of them runs in the same process under ``pytest -n`` (``--dist loadgroup``), so that it
#: still runs once. Checked in this order; a file takes the first group any of its tests needs.
_SHARED_SESSION_GROUPS: tuple[tuple[str, frozenset[str]], ...] = (
    ("e2e-parity-session", frozenset({"parity_session", "warm_start_checkpoint"})),
    ("e2e-shared-runs", frozenset({"sft_checkpointed_run", "grpo_warm_start_run"})),
)


def _xdist_group(file_items: list[pytest.Item], file_key: str) -> str:
    """The worker group of one file's tests: a shared-session group, else the file itself.

    Whole files stay on one worker, so module-scoped fixtures (a module's own cluster or
    parity run) are built once.
    """
    used = {name for item in file_items for name in getattr(item, "fixturenames", ())}
    for group, fixtures in _SHARED_SESSION_GROUPS:
        if used & fixtures:
            return group
    return file_key


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        parts = pathlib.Path(str(item.fspath)).parts
        for tier in _TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
        by_file.setdefault(str(item.fspath), []).append(item)
    for file_key, file_items in by_file.items():
        group = _xdist_group(file_items, file_key)
        for item in file_items:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread_in_the_test_process() -> None:
    """Tests run on 2 shared cores; intra-op threads in the pytest process only add contention.

    Worker processes (Ray actors, launcher subprocesses) set their own thread counts from config.
    """
    import torch

    torch.set_num_threads(1)
