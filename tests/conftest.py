"""Test-tier markers by directory and the grouping of tests onto parallel workers.

Tier markers: tests/unit -> unit, tests/integration -> integration, tests/e2e -> e2e, so that
`-m unit` selects the fast tier without per-file boilerplate.

Worker groups: `make test` runs the suite on two pytest-xdist workers (`-n 2 --dist
loadfile`), and this module's scheduler keeps each test file on one worker (its module
fixtures, e.g. a file's own cluster or parity run, are built once) and sends the files that
share an expensive session fixture to the same worker (``SHARED_SESSION_FILES``), so that
fixture runs once too. Files are handed out in collection order (the slow e2e tier first, the
many short unit files last, which evens out the end of the run).
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import pytest

#: When its first driver connects, a Ray node starts one idle Python worker per CPU. The
#: project's actors mostly start in workers of their own (each asks for its own runtime
#: environment), so in the suite's ~60 Ray starts those two workers per start mostly idle through
#: the run, and their start-up (about 0.35 s of CPU each) takes CPU from the tests on 2 shared
#: cores. Every process the suite starts inherits this, the launcher runs and their Ray included.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")

_TIERS = ("unit", "integration", "e2e")

#: Session fixtures that run something expensive once per test process, by the worker group of
#: the files that use them.
SHARED_SESSION_FIXTURES: dict[str, frozenset[str]] = {
    "e2e-parity-session": frozenset({"parity_session", "warm_start_checkpoint"}),
    "e2e-shared-runs": frozenset({"sft_checkpointed_run", "grpo_warm_start_run"}),
}

#: Test file (path from the repository root) -> the worker group it shares. The scheduler runs
#: in the controlling process, which collects no tests, so the table is written out here;
#: ``pytest_collection_modifyitems`` fails the run if a file uses one of the fixtures above
#: without being listed under that fixture's group.
SHARED_SESSION_FILES: dict[str, str] = {
    "tests/e2e/test_grpo_async_parity.py": "e2e-parity-session",
    "tests/e2e/test_grpo_parity.py": "e2e-parity-session",
    "tests/e2e/test_ppo_parity.py": "e2e-parity-session",
    "tests/e2e/test_ray_store_parity.py": "e2e-parity-session",
    "tests/e2e/test_evaluate.py": "e2e-shared-runs",
    "tests/e2e/test_launch.py": "e2e-shared-runs",
    "tests/e2e/test_reliability.py": "e2e-shared-runs",
    "tests/e2e/test_reliability_prestart.py": "e2e-shared-runs",
}


def worker_group(nodeid: str) -> str:
    """The worker group of a test: its file's shared-session group, else the file itself.

    Args:
        nodeid: The test's pytest node id (``path::name[params]``).

    Returns:
        The group name; tests with the same group run on the same worker.
    """
    path = nodeid.split("::", 1)[0]
    return SHARED_SESSION_FILES.get(path, path)


def _check_shared_session_files(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fail the collection if a file uses a shared session fixture outside that fixture's group."""
    problems = []
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        for group, fixtures in SHARED_SESSION_FIXTURES.items():
            used = fixtures.intersection(getattr(item, "fixturenames", ()))
            if used and SHARED_SESSION_FILES.get(path) != group:
                problems.append(f"{path} uses {sorted(used)}: list it as {group!r} in SHARED_SESSION_FILES")
    if problems:
        raise pytest.UsageError("tests/conftest.py: " + "; ".join(sorted(set(problems))))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = pathlib.Path(str(item.fspath)).parts
        for tier in _TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
    _check_shared_session_files(config, items)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadfile``: one work unit per ``worker_group``, in collection order."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedSessionScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with ``worker_group`` as the scope of a test."""

        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    config.option.loadscopereorder = False  # collection order: slow tiers first
    return SharedSessionScheduling(config, log)


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread_in_the_test_process() -> None:
    """Tests run on 2 shared cores; intra-op threads in the pytest process only add contention.

    Worker processes (Ray actors, launcher subprocesses) set their own thread counts from config.
    """
    import torch

    torch.set_num_threads(1)
