"""Hints printed when Hydra cannot compose a run: which recipe an ``algorithm=<x>`` needs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

__all__ = ["override_value", "recipe_algorithm", "recipe_hint", "recipe_hint_on_failure"]


def recipe_algorithm(recipe_path: str | os.PathLike[str]) -> str | None:
    """The ``algorithm`` a ``recipes/*.yaml`` file selects (``override /algorithm: <name>``), or ``None``."""
    from omegaconf import OmegaConf

    node = OmegaConf.load(recipe_path)
    for entry in node.get("defaults", []) or []:
        if hasattr(entry, "items"):
            for key, value in entry.items():
                if str(key).replace("override", "").strip() in ("/algorithm", "algorithm"):
                    return str(value)
    return None


def override_value(overrides: Sequence[str], key: str) -> str | None:
    """The value of the first ``key=value`` (or ``+key=value``) override, or ``None``."""
    for item in overrides:
        name, sep, value = item.partition("=")
        if sep and name.lstrip("+") == key:
            return value
    return None


def recipe_hint(overrides: list[str], *, recipes_dir: str | os.PathLike[str], default_recipe: str) -> str | None:
    """A hint for ``algorithm=<x>`` given (in ``sys.argv[1:]``) without a recipe that the default recipe
    cannot serve; ``None`` when a recipe is chosen or the algorithm is the default recipe's."""
    from nemo_dp.config import CONF_DIR
    from nemo_dp.config.hints import group_options

    algorithm = override_value(overrides, "algorithm")
    if algorithm is None or any(o.lstrip("+~").startswith("recipe") for o in overrides):
        return None
    if algorithm not in (group_options(CONF_DIR, "algorithm") or ()):
        return None  # not an option at all: composition_hints names the closest one
    root = Path(recipes_dir)
    default_algo = recipe_algorithm(root / f"{default_recipe}.yaml")
    if default_algo is None or default_algo == algorithm:
        return None
    matching = sorted(p.stem for p in root.glob("*.yaml") if recipe_algorithm(p) == algorithm)
    choices = [f"recipe={name}" for name in matching] + ["~recipe (the plain group defaults)"]
    return (
        f"hint: algorithm={algorithm} cannot be merged into the default recipe "
        f"{default_recipe!r} (a {default_algo} recipe); add one of: {', '.join(choices)}"
    )


@contextmanager
def recipe_hint_on_failure(
    overrides: list[str], *, recipes_dir: str | os.PathLike[str], default_recipe: str
) -> Iterator[None]:
    """Print :func:`recipe_hint` (same arguments) when the block exits with an error (Hydra's exit status 1)."""
    try:
        yield
    except (SystemExit, Exception) as exc:
        if not isinstance(exc, SystemExit) or exc.code not in (0, None):
            _print_hint(overrides, recipes_dir, default_recipe)
        raise


def _print_hint(overrides: list[str], recipes_dir: str | os.PathLike[str], default_recipe: str) -> None:
    from nemo_dp.config import CONF_DIR
    from nemo_dp.config.hints import composition_hints

    try:
        hint = recipe_hint(overrides, recipes_dir=recipes_dir, default_recipe=default_recipe)
        hints = ([hint] if hint is not None else []) + composition_hints(overrides, conf_dir=CONF_DIR)
    except Exception:  # a hint must never replace the error it explains
        return
    for line in hints:
        print(line, file=sys.stderr, flush=True)
