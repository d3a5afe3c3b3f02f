"""Structural rules of the models layer, each checked on the source (docstrings and comments
stripped) and each shown to fire on a violating snippet:

* ``TinyCausalLM`` / ``CharTokenizer`` are named only by the tiny family's own modules, its
  builder and the two import-location shims; workers, generation and the value model see
  models only through the protocols.
* ``nemo_dp.models`` never imports ``nemo_dp.algorithms`` / ``nemo_dp.training`` /
  ``launchers`` (layers import downward only).
* ``transformers`` is imported only inside ``nemo_dp/models/hf/``.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

MODELS = Path(__file__).resolve().parents[2] / "nemo_dp" / "models"
TINY_ALLOWED = {"tiny/model.py", "tiny/tokenizer.py", "tiny/builder.py", "tiny/__init__.py", "model.py"}
UPPER_LAYERS = ("nemo_dp.algorithms", "nemo_dp.training", "launchers")


def _code_names(source: str) -> set[str]:
    """Identifiers in ``source`` outside strings and comments."""
    names = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME:
            names.add(tok.string)
    return names


def _imports(source: str) -> list[str]:
    mods = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            mods.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods.append(node.module)
    return mods


def tiny_violations(files: dict[str, str]) -> list[str]:
    return sorted(rel for rel, src in files.items()
                  if rel not in TINY_ALLOWED and _code_names(src) & {"TinyCausalLM", "CharTokenizer"})


def layer_violations(files: dict[str, str]) -> list[str]:
    return sorted(f"{rel}: {m}" for rel, src in files.items() for m in _imports(src)
                  if m.startswith(UPPER_LAYERS) or (m.startswith("transformers") and not rel.startswith("hf/")))


def _models_sources() -> dict[str, str]:
    return {str(p.relative_to(MODELS)): p.read_text(encoding="utf-8") for p in MODELS.rglob("*.py")}


def test_tiny_classes_are_named_only_by_their_family() -> None:
    assert tiny_violations(_models_sources()) == []


def test_models_import_downward_only_and_transformers_only_in_hf() -> None:
    assert layer_violations(_models_sources()) == []


def test_the_rule_checks_see_a_violation() -> None:
    bad = {
        "policy/worker.py": "from nemo_dp.models.tiny.model import TinyCausalLM\nm = TinyCausalLM(cfg)\n",
        "generation.py": '"""Mentions TinyCausalLM only in a docstring."""\n# and CharTokenizer in a comment\n',
        "value/worker.py": "from nemo_dp.algorithms.ppo_losses import align_values\n",
        "protocol.py": "def f():\n    import transformers\n",
    }
    assert tiny_violations(bad) == ["policy/worker.py"]
    assert layer_violations(bad) == ["protocol.py: transformers", "value/worker.py: nemo_dp.algorithms.ppo_losses"]
