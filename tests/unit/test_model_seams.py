"""The tiny model family is named only by its own modules: workers, generation and the value
model see models only through the protocols (checked on the source, docstrings and comments
stripped, and shown to fire on a violating snippet).

That ``nemo_dp.models`` imports no higher layer and that only ``nemo_dp.models.hf`` imports
``transformers`` are import contracts (``test_import_contracts.py``).
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

MODELS = Path(__file__).resolve().parents[2] / "nemo_dp" / "models"
TINY_ALLOWED = {"tiny/model.py", "tiny/tokenizer.py", "tiny/builder.py", "tiny/__init__.py"}


def _code_names(source: str) -> set[str]:
    """Identifiers in ``source`` outside strings and comments."""
    names = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME:
            names.add(tok.string)
    return names


def tiny_violations(files: dict[str, str]) -> list[str]:
    return sorted(rel for rel, src in files.items()
                  if rel not in TINY_ALLOWED and _code_names(src) & {"TinyCausalLM", "CharTokenizer"})


def _models_sources() -> dict[str, str]:
    return {str(p.relative_to(MODELS)): p.read_text(encoding="utf-8") for p in MODELS.rglob("*.py")}


def test_tiny_classes_are_named_only_by_their_family() -> None:
    assert tiny_violations(_models_sources()) == []


def test_the_rule_checks_see_a_violation() -> None:
    bad = {
        "policy/worker.py": "from nemo_dp.models.tiny.model import TinyCausalLM\nm = TinyCausalLM(cfg)\n",
        "generation.py": '"""Mentions TinyCausalLM only in a docstring."""\n# and CharTokenizer in a comment\n',
    }
    assert tiny_violations(bad) == ["policy/worker.py"]
