"""Architecture invariants of the data-plane package: import hygiene, real clients, the interface.

Import hygiene is checked twice: at runtime in fresh interpreters (what actually lands in
``sys.modules``) and statically over the AST of every file under ``nemo_dp/`` (what any code
path could import).
"""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nemo_dp.data_plane import factory
from nemo_dp.data_plane.interfaces import DataPlaneClient, LocalDataPlaneConfig

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "nemo_dp"
DATA_PLANE = PKG / "data_plane"
TQ_ADAPTER = DATA_PLANE / "adapters" / "transfer_queue.py"
TQ_ADAPTER_PKG = DATA_PLANE / "adapters" / "transfer_queue"
TQ_ENV = DATA_PLANE / "adapters" / "transfer_queue_env.py"


def _tq_adapter_files() -> list[Path]:
    """The TransferQueue adapter's files: one module, or a package of modules once split."""
    files = [TQ_ADAPTER] if TQ_ADAPTER.is_file() else sorted(TQ_ADAPTER_PKG.rglob("*.py"))
    assert files, f"no TransferQueue adapter at {TQ_ADAPTER} or under {TQ_ADAPTER_PKG}"
    return files
FACTORY = DATA_PLANE / "factory.py"

ELEVEN = {
    "register_partition",
    "claim_meta",
    "get_data",
    "check_consumption_status",
    "put_samples",
    "get_samples",
    "list_sample_ids",
    "clear_samples",
    "save_checkpoint",
    "load_checkpoint",
    "close",
}
# Modules that must exist now; any other module under data_plane/ is picked up from disk.
REQUIRED_MODULES = [
    "nemo_dp",
    "nemo_dp.data_plane",
    "nemo_dp.data_plane.interfaces",
    "nemo_dp.data_plane.schema",
    "nemo_dp.data_plane.factory",
    "nemo_dp.data_plane.observability",
    "nemo_dp.data_plane.adapters",
    "nemo_dp.data_plane.adapters.transfer_queue_env",
]


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _data_plane_modules() -> list[str]:
    """Every importable module under nemo_dp/data_plane except the TransferQueue adapter's."""
    adapter = set(_tq_adapter_files())
    found = {_module_name(p) for p in DATA_PLANE.rglob("*.py") if p not in adapter}
    return sorted(set(REQUIRED_MODULES) | found)


def _run_fresh(code: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- 54: runtime import hygiene ------------------------------------------------------------


@pytest.mark.timeout(300)
def test_imports_leave_ray_and_transfer_queue_out() -> None:
    modules = _data_plane_modules()
    result = _run_fresh(
        f"""
        import importlib, json, sys
        out = {{}}
        for name in {modules!r}:
            importlib.import_module(name)
            out[name] = sorted(m for m in ("ray", "transfer_queue") if m in sys.modules)
        import nemo_dp.data_plane as dp
        for public in dp.__all__:
            getattr(dp, public)
        out["<public surface>"] = sorted(m for m in ("ray", "transfer_queue") if m in sys.modules)
        print(json.dumps(out))
        """
    )
    assert set(modules) <= set(result)
    offenders = {name: mods for name, mods in result.items() if mods}
    assert offenders == {}


@pytest.mark.timeout(120)
def test_transfer_queue_env_loads_only_the_standard_library() -> None:
    result = _run_fresh(
        """
        import json, sys
        before = set(sys.modules)
        import nemo_dp.data_plane.adapters.transfer_queue_env  # noqa: F401
        new = set(sys.modules) - before
        top = {m.split(".")[0] for m in new}
        foreign = sorted(t for t in top if t not in sys.stdlib_module_names and t != "nemo_dp"
                         and not t.startswith("_"))
        print(json.dumps({"foreign": foreign}))
        """
    )
    assert result == {"foreign": []}


# --- 80: static import rules ----------------------------------------------------------------------


def _imported_top_levels(tree: ast.AST) -> list[tuple[str, ast.AST]]:
    """(top-level package, node) for every absolute import and import_module("...") call."""
    out: list[tuple[str, ast.AST]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name.split(".")[0], node) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                out.append((node.module.split(".")[0], node))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    out.append((arg.value.split(".")[0], node))
    return out


def _all_package_files() -> list[Path]:
    files = sorted(PKG.rglob("*.py"))
    assert FACTORY in files and TQ_ENV in files
    return files


def test_only_the_tq_adapter_imports_transfer_queue() -> None:
    offenders = []
    adapter = set(_tq_adapter_files())
    for path in _all_package_files():
        if path in adapter:
            continue
        for top, node in _imported_top_levels(ast.parse(path.read_text(), str(path))):
            if top == "transfer_queue":
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []


def _module_level_nodes(tree: ast.Module) -> list[ast.AST]:
    """Nodes executed at import: everything outside function bodies (classes included)."""
    out: list[ast.AST] = []
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def test_tq_adapter_imports_transfer_queue_lazily() -> None:
    eager = []
    for path in _tq_adapter_files():
        tree = ast.parse(path.read_text(), str(path))
        module_level = {id(n) for n in _module_level_nodes(tree)}
        eager += [
            f"{path.relative_to(REPO)}:{node.lineno}"
            for top, node in _imported_top_levels(tree)
            if top in ("transfer_queue", "ray") and id(node) in module_level
        ]
    assert eager == [], f"module-level transfer_queue/ray imports at {eager}"


def test_transfer_queue_env_imports_only_stdlib() -> None:
    tree = ast.parse(TQ_ENV.read_text(), str(TQ_ENV))
    tops = {top for top, _ in _imported_top_levels(tree)}
    non_stdlib = sorted(t for t in tops if t not in sys.stdlib_module_names and t != "__future__")
    assert non_stdlib == []
    for node in ast.walk(tree):
        assert not (isinstance(node, ast.ImportFrom) and node.level > 0), "relative import"


# --- 79: no no-op client -------------------------------------------------------------------


def _client_subclasses() -> dict[str, str]:
    """Classes under nemo_dp/ whose bases name DataPlaneClient -> defining file."""
    found: dict[str, str] = {}
    for path in _all_package_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).split(".")[-1] for b in node.bases}
                if "DataPlaneClient" in bases:
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


# --- 82: the abstract interface -------------------------------------------------------------------


def test_client_declares_exactly_the_eleven_sync_abstract_methods() -> None:
    assert DataPlaneClient.__abstractmethods__ == frozenset(ELEVEN)
    for name in ELEVEN:
        method = getattr(DataPlaneClient, name)
        assert not inspect.iscoroutinefunction(method), name
        assert not inspect.isasyncgenfunction(method), name


def test_no_implementation_makes_an_interface_method_async() -> None:
    offenders = []
    for path in _all_package_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AsyncFunctionDef) and item.name in ELEVEN:
                        offenders.append(f"{path.relative_to(REPO)}:{node.name}.{item.name}")
    assert offenders == []
