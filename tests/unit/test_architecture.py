"""Architecture invariants of the data-plane package: real clients only, a synchronous interface.

The import rules live in ``pyproject.toml`` (``test_import_contracts.py``) and what imports load
at run time in ``test_runtime_imports.py``.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from nemo_dp.data_plane import factory
from nemo_dp.data_plane.interfaces import DataPlaneClient, LocalDataPlaneConfig

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "nemo_dp"
FACTORY = PKG / "data_plane" / "factory.py"


def _client_subclasses() -> dict[str, str]:
    """Classes under nemo_dp/ whose bases name DataPlaneClient (or the adapters' shared base
    client) -> defining file."""
    found: dict[str, str] = {}
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).split(".")[-1] for b in node.bases}
                if bases & {"DataPlaneClient", "BaseDataPlaneClient"}:
                    found[node.name] = str(path.relative_to(REPO))
    return found


def test_only_real_adapters_and_the_wrapper_implement_the_client() -> None:
    # Each adapter is one module or a package of modules (the client in one of them).
    allowed = {
        "LocalDataPlaneClient": ("nemo_dp/data_plane/adapters/local.py", "nemo_dp/data_plane/adapters/local/"),
        "TQDataPlaneClient": (
            "nemo_dp/data_plane/adapters/transfer_queue.py",
            "nemo_dp/data_plane/adapters/transfer_queue/",
        ),
        "RayStoreClient": ("nemo_dp/data_plane/adapters/ray_store.py", "nemo_dp/data_plane/adapters/ray_store/"),
        "MetricsDataPlaneClient": ("nemo_dp/data_plane/observability.py",),
        "BaseDataPlaneClient": ("nemo_dp/data_plane/adapters/_base.py",),
    }
    found = _client_subclasses()
    assert set(found) == set(allowed), f"DataPlaneClient implementations: {found}"
    for name, where in found.items():
        assert where in allowed[name] or where.startswith(allowed[name][1:]), (name, where)


def test_build_data_plane_client_returns_only_adapters_or_wrapper() -> None:
    """Whatever table the factory builds from, what comes out is a concrete adapter client."""
    from nemo_dp.data_plane.observability import MetricsDataPlaneClient

    for cfg in (
        LocalDataPlaneConfig(),
        {"enabled": True, "impl": "local", "observability": {"enabled": True, "log_events": False}},
    ):
        client = factory.build_data_plane_client(cfg)
        try:
            inner = client.inner if isinstance(client, MetricsDataPlaneClient) else client
            cls = type(inner)
            assert cls.__module__.startswith("nemo_dp.data_plane.adapters."), cls.__module__
            assert cls.__name__ in ("LocalDataPlaneClient", "TQDataPlaneClient"), cls.__name__
            assert not cls.__abstractmethods__
        finally:
            client.close()
    source = FACTORY.read_text().lower()
    for word in ("noop", "no_op", "nullclient", "dummyclient"):
        assert word not in source, word


def test_every_build_path_returns_a_real_client_or_raises() -> None:
    from nemo_dp.data_plane.adapters.local import LocalDataPlaneClient
    from nemo_dp.data_plane.observability import MetricsDataPlaneClient

    for cfg in (None, {"enabled": False}, {"enabled": True, "impl": "noop"}, {"enabled": True}):
        with pytest.raises(ValueError):
            factory.build_data_plane_client(cfg)
    plain = factory.build_data_plane_client(LocalDataPlaneConfig())
    wrapped = factory.build_data_plane_client(
        {"enabled": True, "impl": "local", "observability": {"enabled": True, "log_events": False}}
    )
    try:
        assert type(plain) is LocalDataPlaneClient
        assert type(wrapped) is MetricsDataPlaneClient
        assert type(wrapped.inner) is LocalDataPlaneClient
    finally:
        plain.close()
        wrapped.close()


def test_every_implementation_keeps_the_interface_synchronous() -> None:
    """Each class of the test above implements every abstract operation, none as a coroutine."""
    from nemo_dp.data_plane.adapters.local import LocalDataPlaneClient
    from nemo_dp.data_plane.adapters.ray_store import RayStoreClient
    from nemo_dp.data_plane.adapters.transfer_queue import TQDataPlaneClient
    from nemo_dp.data_plane.observability import MetricsDataPlaneClient

    operations = DataPlaneClient.__abstractmethods__
    assert operations
    for cls in (DataPlaneClient, LocalDataPlaneClient, TQDataPlaneClient, RayStoreClient, MetricsDataPlaneClient):
        assert cls is DataPlaneClient or not cls.__abstractmethods__, (cls.__name__, cls.__abstractmethods__)
        for name in operations:
            method = getattr(cls, name)
            assert not inspect.iscoroutinefunction(method), (cls.__name__, name)
            assert not inspect.isasyncgenfunction(method), (cls.__name__, name)


def test_the_contract_suite_exercises_every_interface_operation() -> None:
    """The suite every adapter runs (tests/contract_suite.py) calls each abstract operation."""
    suite = ast.parse((REPO / "tests" / "contract_suite.py").read_text())
    called = {n.func.attr for n in ast.walk(suite) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert sorted(DataPlaneClient.__abstractmethods__ - called) == []
