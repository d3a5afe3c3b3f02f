"""Design rules 3-6 between trainers, launchers and the data plane (checklist L 77, 78, 81, 83).

Checked by AST / source inspection, not by review:

* Rule 3 / item 77 - legacy trainer modules never import ``nemo_dp.data_plane``, never name a
  data-plane trainer or ``TQPolicy``, and (docstrings and comments stripped) never mention
  ``data_plane`` at all, so they can neither branch on it nor read its config.
* Item 78 - no trainer (legacy or data-plane) has a feature gate: no ``if`` / conditional
  expression / ``while`` test mentions ``data_plane`` or ``dp_client``.
* Rule 4 - data-plane trainers import no adapter, no ``transfer_queue``, none of the column
  helpers that take a client, never build a client and never touch ``.dp_client``.
* Rule 5 / item 81 - every launcher that runs a trainer calls ``select_sync_trainer(`` and
  ``make_policy_factory(``, names no trainer function or policy class itself, and has no
  ``if`` on ``data_plane``.
* Item 83 - each legacy trainer and its data-plane twin bind the same call signature.
* The factory registry points ``data_plane=tq`` GRPO at ``grpo_train_sync`` and the policy
  factory at ``TQPolicy``, whose worker class carries the worker mixin.

Rule 6 (no bulk per-token tensor reaches the driver) needs running workers and is asserted in
``tests/integration/test_grpo_data_plane.py`` by inspecting what the driver receives.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ALGOS = REPO / "nemo_dp" / "algorithms"
LAUNCHERS = REPO / "launchers"

#: (legacy module, data-plane module, legacy function, data-plane function).
TRAINER_PAIRS: tuple[tuple[str, str, str, str], ...] = (
    ("grpo", "grpo_sync", "grpo_train", "grpo_train_sync"),
    ("sft", "sft_sync", "sft_train", "sft_train_sync"),
    ("ppo", "ppo_sync", "ppo_train", "ppo_train_sync"),
)
LEGACY = [p for p in (ALGOS / f"{m}.py" for m, _, _, _ in TRAINER_PAIRS) if p.exists()]
SYNC = [p for p in (ALGOS / f"{m}.py" for _, m, _, _ in TRAINER_PAIRS) if p.exists()]
TRAINER_NAMES = {n for _, _, a, b in TRAINER_PAIRS for n in (a, b)}
DP_TRAINER_WORDS = ("grpo_sync", "sft_sync", "ppo_sync", "train_sync", "TQPolicy", "TQValue")
#: Launchers that run trainers (bench.py joins once it has a trainer benchmark).
TRAINER_LAUNCHERS = [
    p for p in sorted(LAUNCHERS.glob("*.py")) if "select_sync_trainer" in p.read_text() or p.name == "launch.py"
]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _strip_docstrings(tree: ast.Module) -> ast.Module:
    """The module without docstrings (comments are already gone after parsing)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]
    return tree


def _imports(tree: ast.Module) -> list[str]:
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
            out.extend(f"{node.module}.{a.name}" for a in node.names)
    return out


def _gate_tests(tree: ast.Module) -> list[str]:
    tests = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            tests.append(ast.unparse(node.test))
        elif isinstance(node, ast.comprehension):
            tests.extend(ast.unparse(t) for t in node.ifs)
        elif isinstance(node, ast.Match):
            tests.append(ast.unparse(node.subject))
    return tests


def _ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


# --- rule 3 / item 77 ----------------------------------------------------------------------


@pytest.mark.parametrize("path", LEGACY, ids=_ids(LEGACY))
def test_legacy_trainer_never_imports_or_mentions_the_data_plane(path: Path) -> None:
    tree = _tree(path)
    bad_imports = [m for m in _imports(tree) if m.startswith("nemo_dp.data_plane") or "transfer_queue" in m]
    assert bad_imports == [], f"{path.name} imports the data plane: {bad_imports}"
    source = path.read_text()
    named = [w for w in DP_TRAINER_WORDS if w in source]
    assert named == [], f"{path.name} mentions the data-plane trainer / policy: {named}"
    code = ast.unparse(_strip_docstrings(tree))
    assert "data_plane" not in code, f"{path.name} code (docstrings/comments stripped) mentions data_plane"
    assert "dp_client" not in code, f"{path.name} code mentions dp_client"


@pytest.mark.timeout(120)
def test_legacy_trainers_do_not_load_the_data_plane_transitively() -> None:
    """Rule 3 at run time: importing the legacy trainers (and everything they import, e.g. the
    training checkpoint helpers) in a fresh interpreter loads no ``nemo_dp.data_plane`` module."""
    import subprocess
    import sys

    modules = ", ".join(f"nemo_dp.algorithms.{m}" for m, _, _, _ in TRAINER_PAIRS if (ALGOS / f"{m}.py").exists())
    code = (
        f"import sys, importlib\n"
        f"for m in '{modules}'.split(', '): importlib.import_module(m)\n"
        f"print(sorted(m for m in sys.modules if m.startswith('nemo_dp.data_plane')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", f"legacy trainers load data-plane modules: {out.stdout.strip()}"


# --- item 78 -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", LEGACY + SYNC, ids=_ids(LEGACY + SYNC))
def test_no_trainer_has_a_data_plane_feature_gate(path: Path) -> None:
    gates = [t for t in _gate_tests(_tree(path)) if "data_plane" in t or "dp_client" in t]
    assert gates == [], f"{path.name} branches on the data plane: {gates}"


# --- rule 4 --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", SYNC, ids=_ids(SYNC))
def test_data_plane_trainer_reaches_the_store_only_through_the_policy(path: Path) -> None:
    tree = _tree(path)
    forbidden = ("nemo_dp.data_plane.adapters", "transfer_queue", "nemo_dp.data_plane.column_io", "ray")
    bad = [m for m in _imports(tree) if any(m == f or m.startswith(f + ".") for f in forbidden)]
    bad += [m for m in _imports(tree) if m.endswith(".build_data_plane_client")]
    assert bad == [], f"{path.name} imports store internals: {bad}"
    attrs = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "dp_client"]
    names = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in ("dp_client", "build_data_plane_client")]
    assert attrs == [] and names == [], f"{path.name} touches the client directly"


def test_the_rule_checks_see_a_violation() -> None:
    """The checks above flag real violations (guards against a vacuous AST walk)."""
    bad = ast.parse(
        "from nemo_dp.data_plane.adapters.transfer_queue import TQDataPlaneClient\n"
        "def f(cfg, policy):\n"
        "    if cfg.data_plane.enabled:\n"
        "        policy.dp_client.clear_samples(None, 'train')\n"
        "    return 1 if policy.dp_client is not None else 0\n"
    )
    assert any("nemo_dp.data_plane.adapters" in m for m in _imports(bad))
    assert sum("data_plane" in t or "dp_client" in t for t in _gate_tests(bad)) == 2
    assert any(isinstance(n, ast.Attribute) and n.attr == "dp_client" for n in ast.walk(bad))
    doc_only = ast.parse('"""Mentions data_plane only here."""\nx = 1\n')
    assert "data_plane" not in ast.unparse(_strip_docstrings(doc_only))


# --- rule 5 / item 81 ----------------------------------------------------------------------


@pytest.mark.parametrize("path", TRAINER_LAUNCHERS, ids=_ids(TRAINER_LAUNCHERS))
def test_launchers_select_through_the_factory_only(path: Path) -> None:
    tree = _tree(path)
    calls = {
        n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
    }
    assert {"select_sync_trainer", "make_policy_factory"} <= calls, f"{path.name} calls {sorted(calls)}"
    referenced = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    referenced |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    referenced |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    direct = sorted(referenced & (TRAINER_NAMES | {"TQPolicy", "TQValue"}))
    assert direct == [], f"{path.name} references trainers / policy classes directly: {direct}"
    modules = [m for m in _imports(tree) if m.startswith("nemo_dp.algorithms.") and m.split(".")[2] in {
        p for pair in TRAINER_PAIRS for p in pair[:2]}]
    assert modules == [], f"{path.name} imports trainer modules: {modules}"
    gates = [t for t in _gate_tests(tree) if "data_plane" in t]
    assert gates == [], f"{path.name} branches on data_plane itself: {gates}"


# --- item 83 -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "legacy_mod,sync_mod,legacy_fn,sync_fn",
    [p for p in TRAINER_PAIRS if (ALGOS / f"{p[1]}.py").exists()],
    ids=lambda v: str(v),
)
def test_both_trainers_bind_the_same_signature(legacy_mod: str, sync_mod: str, legacy_fn: str, sync_fn: str) -> None:
    legacy = getattr(importlib.import_module(f"nemo_dp.algorithms.{legacy_mod}"), legacy_fn)
    sync = getattr(importlib.import_module(f"nemo_dp.algorithms.{sync_mod}"), sync_fn)
    a, b = inspect.signature(legacy), inspect.signature(sync)
    assert [(p.name, p.kind, p.default) for p in a.parameters.values()] == [
        (p.name, p.kind, p.default) for p in b.parameters.values()
    ]
    assert {k: str(p.annotation) for k, p in a.parameters.items()} == {
        k: str(p.annotation) for k, p in b.parameters.items()
    }


# --- the registry --------------------------------------------------------------------------


def test_factory_pairs_grpo_tq_with_the_sync_trainer_and_tq_policy() -> None:
    from nemo_dp.data_plane import factory
    from nemo_dp.data_plane.worker_mixin import TQWorkerMixin

    assert factory.TRAINER_REGISTRY[("grpo", "transfer_queue")] == "nemo_dp.algorithms.grpo_sync:grpo_train_sync"
    assert factory.TRAINER_REGISTRY[("grpo", "disabled")] == "nemo_dp.algorithms.grpo:grpo_train"
    trainer = factory._import_target(factory.TRAINER_REGISTRY[("grpo", "transfer_queue")], "trainer")
    from nemo_dp.algorithms.grpo_sync import TRAINER_TARGET, grpo_train_sync

    assert trainer is grpo_train_sync and TRAINER_TARGET == factory.TRAINER_REGISTRY[("grpo", "transfer_queue")]
    policy_cls = factory._import_target(factory.POLICY_CLASS_PATH, "policy")
    from nemo_dp.models.policy.policy import Policy

    assert policy_cls.__name__ == "TQPolicy" and issubclass(policy_cls, Policy)
    assert issubclass(policy_cls.worker_class, TQWorkerMixin)
    params = inspect.signature(policy_cls.__init__).parameters
    assert params["dp_cfg"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["partition_id"].default == "train"
