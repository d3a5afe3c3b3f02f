"""Keys a composed configuration holds that its schema does not declare (``+a.b=1``, which ``to_object`` drops)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator

from omegaconf import DictConfig, OmegaConf

__all__ = ["unknown_keys", "check_known_keys", "closest"]


def closest(word: str, candidates: list[str] | tuple[str, ...]) -> str | None:
    """The legal name nearest to ``word`` (a likely typo), or ``None`` when none is close."""
    match = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return match[0] if match else None


def unknown_keys(node: DictConfig, prefix: str = "") -> Iterator[tuple[str, list[str]]]:
    """``(full key, its parent's declared keys)`` of every undeclared key under ``node`` (full key ``prefix``)."""
    schema = OmegaConf.get_type(node)
    declared = [f.name for f in dataclasses.fields(schema)] if dataclasses.is_dataclass(schema) else None
    for key in node.keys():
        full = f"{prefix}{key}"
        if declared is not None and key not in declared:
            yield full, declared
            continue
        child = node._get_node(key)  # the node itself: no interpolation is resolved here
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            yield from unknown_keys(child, f"{full}.")


def check_known_keys(node: DictConfig) -> None:
    """Refuse (``ValueError`` naming the closest declared key) an undeclared key of the root ``node`` (no ``hydra``)."""
    for full, declared in unknown_keys(node):
        parent, _, name = full.rpartition(".")
        where = parent or "the root config"
        guess = closest(str(name), declared)
        fix = (
            f"did you mean {parent + '.' if parent else ''}{guess}?"
            if guess is not None
            else f"its keys are {sorted(declared)}"
        )
        raise ValueError(
            f"{full}: not a key of {where} ({fix}); a leading '+' cannot add keys to a schema "
            "node, so the value would be ignored"
        )
