"""Code loaded only when used: ``"module:attr"`` names of registries, and lazy package exports."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["TargetNotFoundError", "lazy_exports", "resolve_target"]


class TargetNotFoundError(ImportError):
    """A ``"module:attr"`` whose module or attribute does not exist."""


def resolve_target(target: str, what: str = "target", *, error: type[TargetNotFoundError] = TargetNotFoundError) -> Any:
    """Import ``"package.module:attribute"`` (``what`` it is, for messages) and return the attribute.

    Raises:
        ValueError: ``target`` is not of the form ``"module:attr"``.
        TargetNotFoundError: (or ``error``) The module or the attribute does not exist.  An error
            raised while importing a module that does exist propagates unchanged.
    """
    module_name, sep, attr = target.partition(":") if isinstance(target, str) else ("", "", "")
    if not sep or not module_name or not attr or ":" in attr:
        raise ValueError(f"{what}: {target!r} must have the form 'module:attr'")
    try:
        found = importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        found = False
    if not found:
        raise error(f"{what} ({target}) is not available: module {module_name!r} does not exist")
    module = importlib.import_module(module_name)
    if not hasattr(module, attr):
        raise error(f"{what} ({target}) is not available: {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module-level ``__getattr__`` importing (and caching) each name of ``exports`` on first use."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
