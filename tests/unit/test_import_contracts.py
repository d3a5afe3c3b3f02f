"""The architecture's import rules, as import-linter contracts in ``pyproject.toml``.

``[tool.importlinter]`` declares the layers and the rules about who may import what; grimp's
graph covers module-level, function-level, ``TYPE_CHECKING`` and relative imports.  The first
test checks the repository against every contract; the second copies the package into a
temporary directory, plants one violation per contract and requires each contract to fail on
exactly the planted import, so no contract can pass vacuously.  What an import actually loads
at run time is checked in ``test_runtime_imports.py``.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter whose sys.path starts with the tree to check: builds grimp's graph
# and checks each contract of the given config with import-linter's own contract classes.
_CHECKER = r"""
import json, sys
from copy import deepcopy

import grimp
from importlinter.api import read_configuration
from importlinter.application.output import console
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.layers import LayersContract
from importlinter.contracts.protected import ProtectedContract

types = {c.type_name: c for c in (ForbiddenContract, LayersContract, ProtectedContract)}
config = read_configuration(sys.argv[1])
session = config["session_options"]
external = str(session.get("include_external_packages", False)).lower() == "true"
graph = grimp.build_graph(*session["root_packages"], include_external_packages=external, cache_dir=None)
out = {}
for options in config["contracts_options"]:
    contract = types[options["type"]](
        name=options["name"], session_options=session, contract_options=options
    )
    check = contract.check(deepcopy(graph), verbose=False)
    with console.capture() as captured:
        if not check.kept:
            contract.render_broken_contract(check)
    out[options["id"]] = {"kept": check.kept, "report": captured.get()}
print(json.dumps(out))
"""


def _check_contracts(root: Path) -> dict[str, dict]:
    """Each contract's result on the tree under ``root`` (``nemo_dp/``, ``launchers/``)."""
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "400"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHECKER, str(REPO / "pyproject.toml")],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_repository_keeps_every_import_contract() -> None:
    results = _check_contracts(REPO)
    broken = {cid: r["report"] for cid, r in results.items() if not r["kept"]}
    assert broken == {}, "\n".join(f"{cid}:\n{text}" for cid, text in broken.items())


#: Per contract id: (file to create, or to extend when it exists; code; text the broken
#: contract's report must contain).  Each kind of import a rule must see appears once.
VIOLATIONS: dict[str, list[tuple[str, str, str]]] = {
    "layers": [
        ("nemo_dp/models/_up_module_level.py", "from nemo_dp.algorithms import context\n",
         "nemo_dp.models._up_module_level -> nemo_dp.algorithms.context"),
        ("nemo_dp/data_plane/_up_in_function.py", "def f():\n    import nemo_dp.training.run\n",
         "nemo_dp.data_plane._up_in_function -> nemo_dp.training.run"),
        ("nemo_dp/algorithms/_up_type_checking.py",
         "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nemo_dp.bench import report\n",
         "nemo_dp.algorithms._up_type_checking -> nemo_dp.bench.report"),
        ("nemo_dp/utils/_up_relative.py", "from ..distributed import packers\n",
         "nemo_dp.utils._up_relative -> nemo_dp.distributed.packers"),
        ("nemo_dp/unranked/__init__.py", "", "nemo_dp.unranked"),  # a package without a layer
    ],
    "launchers-on-top": [
        ("nemo_dp/training/_imports_launcher.py", "from launchers import launch\n",
         "nemo_dp.training._imports_launcher -> launchers.launch"),
    ],
    "root-imports-nothing": [
        ("nemo_dp/__init__.py", "from nemo_dp.utils import metrics\n", "nemo_dp -> nemo_dp.utils.metrics"),
    ],
    "tq-only-in-adapter": [
        ("nemo_dp/models/_imports_tq.py", "def f():\n    import transfer_queue\n",
         "nemo_dp.models._imports_tq -> transfer_queue"),
    ],
    "data-plane-core-is-light": [
        ("nemo_dp/data_plane/_imports_ray.py", "def f():\n    import ray\n",
         "nemo_dp.data_plane._imports_ray -> ray"),
    ],
    "legacy-trainers-without-data-plane": [
        ("nemo_dp/algorithms/sft.py", "from nemo_dp.data_plane import interfaces as _dp\n",
         "nemo_dp.algorithms.sft -> nemo_dp.data_plane.interfaces"),
    ],
    "data-plane-trainers-without-adapters": [
        ("nemo_dp/algorithms/ppo_sync.py", "from nemo_dp.data_plane.adapters.local import client as _c\n",
         "nemo_dp.algorithms.ppo_sync -> nemo_dp.data_plane.adapters.local.client"),
    ],
    "launchers-without-trainers": [
        ("launchers/evaluate.py", "from nemo_dp.algorithms import grpo_sync as _t\n",
         "launchers.evaluate -> nemo_dp.algorithms.grpo_sync"),
    ],
    "transformers-only-in-hf": [
        ("nemo_dp/data/_imports_transformers.py", "import transformers\n",
         "nemo_dp.data._imports_transformers -> transformers"),
    ],
    "tq-env-stands-alone": [
        ("nemo_dp/data_plane/adapters/transfer_queue_env.py", "from . import _validation\n",
         "nemo_dp.data_plane.adapters.transfer_queue_env -> nemo_dp.data_plane.adapters._validation"),
    ],
}


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Contract results on a copy of the tree with every violation of VIOLATIONS planted."""
    root = tmp_path_factory.mktemp("planted")
    for package in ("nemo_dp", "launchers"):
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for cases in VIOLATIONS.values():
        for rel, code, _ in cases:
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            before = path.read_text() if path.exists() else ""
            path.write_text(before + ("\n" if before else "") + code)
    return _check_contracts(root)


def test_every_contract_has_a_planted_violation(planted: dict[str, dict]) -> None:
    assert set(planted) == set(VIOLATIONS), "add a VIOLATIONS entry for each new contract"


@pytest.mark.parametrize("contract_id", sorted(VIOLATIONS))
def test_each_contract_fails_on_its_violation(planted: dict[str, dict], contract_id: str) -> None:
    result = planted[contract_id]
    assert not result["kept"], f"{contract_id} passed with its violation planted"
    for _, _, expected in VIOLATIONS[contract_id]:
        assert expected in result["report"], f"{contract_id} did not report {expected!r}:\n{result['report']}"


def test_every_data_plane_trainer_module_is_under_its_contract() -> None:
    """A new ``*_sync`` / ``*_async`` / ``async_*`` trainer module cannot slip past the rule."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    sources = next(c["source_modules"] for c in contracts if c["id"] == "data-plane-trainers-without-adapters")
    algorithms = REPO / "nemo_dp" / "algorithms"
    found = {p.stem for pattern in ("*_sync.py", "*_async.py", "async_*.py") for p in algorithms.glob(pattern)}
    assert found and {f"nemo_dp.algorithms.{m}" for m in found} <= set(sources)


def _literal_dynamic_imports(tree: ast.AST) -> list[int]:
    """Lines that call ``import_module`` / ``__import__`` with a literal module name."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            arg = node.args[0]
            if name in ("import_module", "__import__") and isinstance(arg, ast.Constant):
                lines.append(node.lineno)
    return lines


def test_no_import_hides_in_a_literal_string() -> None:
    """grimp cannot see ``import_module("nemo_dp.x")``: a fixed module is imported with ``import``."""
    files = sorted((REPO / "nemo_dp").rglob("*.py")) + sorted((REPO / "launchers").glob("*.py"))
    found = [f"{p.relative_to(REPO)}:{line}" for p in files for line in _literal_dynamic_imports(ast.parse(p.read_text()))]
    assert found == []
    bad = ast.parse("import importlib\ndef f():\n    importlib.import_module('nemo_dp.models')\n    __import__('ray')\n")
    assert _literal_dynamic_imports(bad) == [3, 4]
