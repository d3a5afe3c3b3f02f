"""Rules between trainers, launchers, the run layer and the data plane, checked on the source.

Which module may import which is in ``pyproject.toml`` (``test_import_contracts.py``): legacy
trainers never import ``nemo_dp.data_plane``, data-plane trainers import no adapter, launchers
import no trainer module.  This file checks what imports cannot show:

* Legacy trainer modules never name a data-plane trainer or ``TQPolicy`` and (docstrings and
  comments stripped) never mention ``data_plane`` at all, so they can neither branch on it nor
  read its config.
* No trainer (legacy or data-plane) has a feature gate: no ``if`` / conditional expression /
  ``while`` test mentions ``data_plane`` or ``dp_client``.
* Data-plane trainers never build a client and never touch ``.dp_client``.
* The run layer (``nemo_dp/training/run.py``) is where trainer and policy are picked: it calls
  ``select_sync_trainer(`` and ``make_policy_factory(``; every launcher (all of
  ``launchers/*.py``) names no trainer function or policy class and has no ``if`` on
  ``data_plane``; the launchers that train go through the run layer.
* Every trainer takes exactly one ``ctx: TrainContext``.
* Every (algorithm, data plane) pair of the config groups either selects an importable trainer
  taking a ``TrainContext`` or fails naming both keys; ``data_plane=tq`` builds a policy class
  whose workers carry the worker mixin.

That no bulk per-token tensor reaches the driver needs running workers and is asserted in
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
LEGACY = [ALGOS / f"{m}.py" for m, _, _, _ in TRAINER_PAIRS]
SYNC = [ALGOS / f"{m}.py" for _, m, _, _ in TRAINER_PAIRS]
TRAINER_NAMES = {n for _, _, a, b in TRAINER_PAIRS for n in (a, b)}
DP_TRAINER_WORDS = ("grpo_sync", "sft_sync", "ppo_sync", "train_sync", "TQPolicy", "TQValue")
#: Every launcher, unfiltered.
ALL_LAUNCHERS = sorted(LAUNCHERS.glob("*.py"))
#: The launchers that train, and the package each goes through.
TRAINING_LAUNCHERS: dict[str, str] = {"launch.py": "nemo_dp.training", "bench.py": "nemo_dp.bench"}
RUN_LAYER = REPO / "nemo_dp" / "training" / "run.py"
BENCH_STEPS = REPO / "nemo_dp" / "bench" / "steps.py"


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


# --- legacy trainers ---------------------------------------------------------------


@pytest.mark.parametrize("path", LEGACY, ids=_ids(LEGACY))
def test_legacy_trainer_never_mentions_the_data_plane(path: Path) -> None:
    tree = _tree(path)
    source = path.read_text()
    named = [w for w in DP_TRAINER_WORDS if w in source]
    assert named == [], f"{path.name} mentions the data-plane trainer / policy: {named}"
    code = ast.unparse(_strip_docstrings(tree))
    assert "data_plane" not in code, f"{path.name} code (docstrings/comments stripped) mentions data_plane"
    assert "dp_client" not in code, f"{path.name} code mentions dp_client"


# --- no feature gates -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", LEGACY + SYNC, ids=_ids(LEGACY + SYNC))
def test_no_trainer_has_a_data_plane_feature_gate(path: Path) -> None:
    gates = [t for t in _gate_tests(_tree(path)) if "data_plane" in t or "dp_client" in t]
    assert gates == [], f"{path.name} branches on the data plane: {gates}"


# --- data-plane trainers -------------------------------------------------------------------


@pytest.mark.parametrize("path", SYNC, ids=_ids(SYNC))
def test_data_plane_trainer_never_builds_or_touches_a_client(path: Path) -> None:
    tree = _tree(path)
    bad = [m for m in _imports(tree) if m.endswith(".build_data_plane_client")]
    assert bad == [], f"{path.name} imports the client builder: {bad}"
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
    assert sum("data_plane" in t or "dp_client" in t for t in _gate_tests(bad)) == 2
    assert any(isinstance(n, ast.Attribute) and n.attr == "dp_client" for n in ast.walk(bad))
    doc_only = ast.parse('"""Mentions data_plane only here."""\nx = 1\n')
    assert "data_plane" not in ast.unparse(_strip_docstrings(doc_only))


# --- the run layer and the launchers ---------------------------------------------------------


def _calls(tree: ast.Module) -> set[str]:
    return {
        n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
    }


def test_the_run_layer_selects_trainer_and_policy_through_the_factory() -> None:
    calls = _calls(_tree(RUN_LAYER))
    assert {"select_sync_trainer", "make_policy_factory"} <= calls, sorted(calls)


def test_the_launchers_that_train_go_through_the_run_layer() -> None:
    assert {p.name for p in ALL_LAUNCHERS} >= set(TRAINING_LAUNCHERS)
    for name, package in TRAINING_LAUNCHERS.items():
        imported = _imports(_tree(LAUNCHERS / name))
        assert any(m == package or m.startswith(package + ".") for m in imported), (name, imported)
    # The bench's step runners train through run_phase, not their own orchestration.
    assert "run_phase" in _calls(_tree(BENCH_STEPS))


@pytest.mark.parametrize("path", ALL_LAUNCHERS, ids=_ids(ALL_LAUNCHERS))
def test_no_launcher_names_a_trainer_or_branches_on_the_data_plane(path: Path) -> None:
    tree = _tree(path)
    referenced = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    referenced |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    referenced |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    direct = sorted(referenced & (TRAINER_NAMES | {"TQPolicy", "TQValue"}))
    assert direct == [], f"{path.name} references trainers / policy classes directly: {direct}"
    gates = [t for t in _gate_tests(tree) if "data_plane" in t]
    assert gates == [], f"{path.name} branches on data_plane itself: {gates}"


def test_the_launcher_checks_see_a_violation() -> None:
    """A launcher that picks its own trainer is caught (guards the launcher checks)."""
    bad = ast.parse(
        "from nemo_dp.algorithms.grpo_sync import grpo_train_sync\n"
        "def main(cfg):\n"
        "    if cfg.data_plane.enabled:\n"
        "        grpo_train_sync(cfg)\n"
    )
    assert [t for t in _gate_tests(bad) if "data_plane" in t] == ["cfg.data_plane.enabled"]
    assert "run_phase" not in _calls(bad) and "grpo_train_sync" in _calls(bad)


# --- one trainer shape ---------------------------------------------------------------------


@pytest.mark.parametrize("module,fn", [(m, f) for a, b, fa, fb in TRAINER_PAIRS for m, f in ((a, fa), (b, fb))])
def test_every_trainer_takes_one_train_context(module: str, fn: str) -> None:
    from nemo_dp.algorithms.context import TrainContext

    trainer = getattr(importlib.import_module(f"nemo_dp.algorithms.{module}"), fn)
    params = list(inspect.signature(trainer, eval_str=True).parameters.values())
    assert [(p.name, p.kind, p.annotation) for p in params] == [
        ("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, TrainContext)
    ]


# --- selection behaviour -------------------------------------------------------------------

ALGORITHMS = sorted(p.stem for p in (REPO / "conf" / "algorithm").glob("*.yaml"))
DATA_PLANES = sorted(p.stem for p in (REPO / "conf" / "data_plane").glob("*.yaml"))


def _compose(algorithm: str, data_plane: str) -> object:
    from tests.compose import compose_run

    return compose_run(["~recipe", f"algorithm={algorithm}", f"data_plane={data_plane}"])


@pytest.mark.parametrize("data_plane", DATA_PLANES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_pair_selects_a_context_trainer_or_fails_naming_both(algorithm: str, data_plane: str) -> None:
    from nemo_dp.algorithms.context import TrainContext
    from nemo_dp.data_plane.factory import select_sync_trainer

    cfg = _compose(algorithm, data_plane)
    try:
        trainer = select_sync_trainer(cfg)
    except ValueError as exc:
        text = str(exc)
        assert repr(algorithm) in text and "data_plane" in text, text
        return
    assert callable(trainer) and trainer.__module__.startswith("nemo_dp.algorithms.")
    params = list(inspect.signature(trainer, eval_str=True).parameters.values())
    assert [p.annotation for p in params] == [TrainContext], (algorithm, data_plane, trainer)


def test_the_pair_table_is_not_all_failures() -> None:
    """Every algorithm runs on some data plane, and the tq policy carries the worker mixin."""
    from nemo_dp.data_plane.factory import make_policy_factory, select_sync_trainer
    from nemo_dp.data_plane.worker_mixin import TQWorkerMixin

    for algorithm in ALGORITHMS:
        legal = []
        for data_plane in DATA_PLANES:
            try:
                select_sync_trainer(_compose(algorithm, data_plane))
                legal.append(data_plane)
            except ValueError:
                pass
        assert "disabled" in legal and "tq" in legal, (algorithm, legal)
    assert make_policy_factory(_compose("grpo", "disabled").data_plane) is None
    assert make_policy_factory(_compose("grpo", "tq").data_plane) is not None
    from nemo_dp.models.policy.tq_policy import TQPolicy

    assert issubclass(TQPolicy.worker_class, TQWorkerMixin)
    params = inspect.signature(TQPolicy.__init__).parameters
    assert params["dp_cfg"].kind is inspect.Parameter.KEYWORD_ONLY
