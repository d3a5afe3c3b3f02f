"""Read one key from a config node of any form: ``DictConfig``, plain mapping or dataclass."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

__all__ = ["REQUIRED", "cfg_get"]

#: The default of :func:`cfg_get` meaning "no default: an absent key is an error".
REQUIRED: Any = object()


def cfg_get(node: Any, key: str, default: Any = REQUIRED, *, where: str = "", strict: bool = False) -> Any:
    """``node[key]`` for mappings and ``DictConfig``, ``node.key`` for other objects (``None``: no keys).

    ``where`` names the node in messages; ``strict`` accepts only ``None``, mappings and dataclass instances.

    Raises:
        ValueError: The key of a ``DictConfig`` is the unset mandatory value ``???``.
        KeyError: The key is absent and no default was given (names the node and the key).
        TypeError: ``strict`` and ``node`` is of another type.
    """
    if isinstance(node, DictConfig) and key in node.keys() and OmegaConf.is_missing(node, key):
        raise ValueError(f"{where + '.' if where else ''}{key} is a mandatory value that was not set (???)")
    is_mapping = isinstance(node, Mapping) or (hasattr(node, "keys") and hasattr(node, "__getitem__"))
    if strict and node is not None and not isinstance(node, Mapping):
        if not dataclasses.is_dataclass(node) or isinstance(node, type):
            raise TypeError(
                f"{where or 'config'}: expected a mapping, DictConfig or config dataclass, got {type(node).__name__}"
            )
    if is_mapping and key in node:
        return node[key]
    if not is_mapping and node is not None and hasattr(node, key):
        return getattr(node, key)
    if default is REQUIRED:
        raise KeyError(f"{where or 'config'} has no key {key!r}")
    return default
