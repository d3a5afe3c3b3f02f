"""Layers point one way: no module of ``nemo_dp`` (or a launcher) imports a higher layer.

Every ``.py`` under ``nemo_dp/`` and ``launchers/`` is parsed; every import is collected -
module-level, inside functions and classes, under ``if TYPE_CHECKING``, relative imports
resolved, and ``importlib.import_module("...")`` / ``__import__("...")`` with a literal name -
because a function-level import is as much a dependency as a top-level one.  Each package has a
rank (the design's order ``utils / distributed <- data_plane <- models <- algorithms <-
training <- launchers``, refined with the packages the design does not name); an import from
rank r to a rank above r fails the test, naming file:line and both packages.

``PENDING`` lists upward edges that exist today and are being removed by other work; an entry
that no longer occurs fails the test too, so the list can only shrink.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "nemo_dp"
LAUNCHERS = REPO / "launchers"

#: Lowest first.  A package may import itself and any package listed before it.
LAYER_ORDER: tuple[str, ...] = (
    "<root>",  # nemo_dp/__init__.py imports nothing of the package
    "utils",
    "distributed",
    "data",
    "environments",
    "data_plane",
    "config",
    "models",
    "algorithms",
    "training",
    "bench",
    "launchers",
)
RANK = {name: i for i, name in enumerate(LAYER_ORDER)}

#: Upward edges still present, as (importing file relative to the repo, imported package).
PENDING: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Edge:
    """One import of a nemo_dp package (or a launcher) by a file."""

    path: str
    line: int
    source: str
    target: str


def _package_of(path: Path) -> str:
    if path.is_relative_to(LAUNCHERS):
        return "launchers"
    parts = path.relative_to(PKG).parts
    return "<root>" if len(parts) == 1 else parts[0]


def _module_parts(path: Path) -> list[str]:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return parts


def _imported_modules(tree: ast.AST, path: Path) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import in ``tree``, wherever it appears."""
    out: list[tuple[str, int]] = []
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                here = _module_parts(path)
                anchor = here if is_package else here[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            out.append((base, node.lineno))
            out.extend((f"{base}.{alias.name}", node.lineno) for alias in node.names)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    out.append((arg.value, node.lineno))
    return out


def _target_package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "launchers":
        return "launchers"
    if parts[0] != "nemo_dp":
        return None
    if len(parts) == 1:
        return "<root>"
    return parts[1] if parts[1] in RANK else None  # nemo_dp.__version__ and the like


def collect_edges(files: list[Path], parse: dict[Path, str] | None = None) -> list[Edge]:
    """Every cross-package import edge of ``files``.

    Args:
        files: Python files under ``nemo_dp/`` or ``launchers/``.
        parse: Optional source text per file (instead of reading it from disk).

    Returns:
        The edges (an edge within one package is not listed).
    """
    edges: dict[Edge, None] = {}  # one edge per (file, line, target), in order
    for path in files:
        text = parse[path] if parse is not None and path in parse else path.read_text()
        source = _package_of(path)
        for module, line in _imported_modules(ast.parse(text, str(path)), path):
            target = _target_package(module)
            if target is not None and target != source:
                edges[Edge(str(path.relative_to(REPO)), line, source, target)] = None
    return list(edges)


def upward(edges: list[Edge]) -> list[Edge]:
    """The edges that point from a lower layer to a higher one."""
    return [e for e in edges if RANK[e.target] > RANK[e.source]]


def _all_files() -> list[Path]:
    return sorted(PKG.rglob("*.py")) + sorted(LAUNCHERS.glob("*.py"))


def test_every_package_has_a_rank() -> None:
    packages = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert packages and packages <= set(RANK), sorted(packages - set(RANK))


def test_no_import_points_up_the_layers() -> None:
    files = _all_files()
    assert len(files) > 50  # the walk sees the whole package
    bad = [e for e in upward(collect_edges(files)) if (e.path, e.target) not in PENDING]
    assert bad == [], "upward imports:\n" + "\n".join(
        f"{e.path}:{e.line}: {e.source} imports {e.target}" for e in bad
    )


def test_pending_upward_edges_still_exist() -> None:
    """A pending edge that has been removed must leave the list (the list only shrinks)."""
    seen = {(e.path, e.target) for e in upward(collect_edges(_all_files()))}
    gone = sorted(PENDING - seen)
    assert gone == [], f"remove from PENDING, these upward imports are gone: {gone}"


def test_each_pair_of_layers_has_one_direction() -> None:
    edges = [e for e in collect_edges(_all_files()) if (e.path, e.target) not in PENDING]
    pairs = {(e.source, e.target) for e in edges}
    both = sorted((a, b) for a, b in pairs if (b, a) in pairs and a < b)
    assert both == [], f"layers importing each other: {both}"


@pytest.mark.parametrize(
    "where, code, target",
    [
        ("nemo_dp/models/fake.py", "from nemo_dp.algorithms.loss_functions import NLLLoss\n", "algorithms"),
        ("nemo_dp/data_plane/fake.py", "def f():\n    import nemo_dp.training.run\n", "training"),
        ("nemo_dp/utils/fake.py", "import importlib\ndef f():\n    importlib.import_module('nemo_dp.models.model')\n", "models"),
        ("nemo_dp/algorithms/fake.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nemo_dp.training import RunLogger\n", "training"),
        ("nemo_dp/training/fake.py", "from launchers import launch\n", "launchers"),
        ("nemo_dp/models/sub/fake.py", "from ...algorithms import grpo\n", "algorithms"),
    ],
)
def test_the_walk_sees_a_violation(where: str, code: str, target: str) -> None:
    """Each kind of import the rule covers is caught (guards against a vacuous walk)."""
    path = REPO / where
    found = upward(collect_edges([path], parse={path: code}))
    assert [(e.path, e.target) for e in found] == [(where, target)]


def test_downward_and_internal_imports_pass() -> None:
    path = REPO / "nemo_dp" / "training" / "fake.py"
    code = "from nemo_dp.algorithms.context import TrainContext\nfrom . import run\nimport nemo_dp\n"
    edges = collect_edges([path], parse={path: code})
    assert {(e.source, e.target) for e in edges} == {("training", "algorithms"), ("training", "<root>")}
    assert upward(edges) == []
