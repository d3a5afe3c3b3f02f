"""``TQ_*`` environment knobs for TransferQueue, derived from the ``data_plane`` config.

TransferQueue reads them once at import, so they are exported before ``ray.init`` and before it is
imported.  Standard library only.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_LOG = logging.getLogger(__name__)

#: Top-level module name of the TransferQueue library.
ENGINE_MODULE = "transfer_queue"


@dataclass(frozen=True)
class EngineKnob:
    """An environment variable TransferQueue reads at import, from ``data_plane.<config_path>`` (``integer``: count)."""

    env_var: str
    config_path: str
    integer: bool


#: TransferQueue 0.1.11 parses every one with ``int(...)``, even the timeouts.
ENGINE_KNOBS: tuple[EngineKnob, ...] = (
    EngineKnob("TQ_NUM_THREADS", "num_threads", integer=True),
    EngineKnob("TQ_SIMPLE_STORAGE_SEND_RECV_TIMEOUT", "timeouts.storage_s", integer=False),
    EngineKnob("TQ_SIMPLE_STORAGE_MAX_ATTEMPTS", "timeouts.storage_max_attempts", integer=True),
    EngineKnob("TQ_SIMPLE_STORAGE_PROBE_TIMEOUT", "timeouts.storage_probe_s", integer=False),
    EngineKnob("TQ_DATA_UPDATE_RESPONSE_TIMEOUT", "timeouts.controller_s", integer=False),
)


def engine_already_imported() -> bool:
    return ENGINE_MODULE in sys.modules


def _lookup(node: Any, key: str, full_key: str) -> Any:
    """``key`` of a mapping or object (``ValueError`` naming ``full_key`` when absent)."""
    if isinstance(node, Mapping):
        if key not in node:
            raise ValueError(f"{full_key} is missing from the data_plane config")
        return node[key]
    if not hasattr(node, key):
        raise ValueError(f"{full_key} is missing from the data_plane config ({type(node).__name__})")
    return getattr(node, key)


def _resolve(cfg: Any, dotted: str) -> Any:
    node = cfg
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        node = _lookup(node, part, "data_plane." + ".".join(parts[: i + 1]))
    return node


def _format_knob(knob: EngineKnob, value: Any) -> str:
    """A config value as the decimal string the library parses (``ValueError`` unless a positive whole number)."""
    key = f"data_plane.{knob.config_path}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number for {knob.env_var}, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{key} must be a positive finite number for {knob.env_var}, got {value!r}")
    if value != int(value):
        # "2.5" would crash the library's import in every process, its actors included
        kind = "count" if knob.integer else "whole number of seconds"
        raise ValueError(f"{key}={value!r} must be a {kind}: TransferQueue parses {knob.env_var} with int()")
    # int() first: str(15.0) == "15.0" and str(1e16) == "1e+16", neither parses with int().
    return str(int(value))


def wanted_engine_env(cfg: Any) -> dict[str, str]:
    """``{env_var: decimal string}`` of every knob (table order) for ``cfg``, a ``DataPlaneConfig`` or mapping.

    Raises:
        ValueError: A source key is missing or its value cannot be exported.
    """
    return {knob.env_var: _format_knob(knob, _resolve(cfg, knob.config_path)) for knob in ENGINE_KNOBS}


def configure_engine_env(cfg: Any) -> dict[str, str]:
    """Export the wanted ``TQ_*`` knobs that are absent; return every knob's effective value.

    An exported value wins (a warning is logged when it differs from the config).  Call this before
    ``ray.init`` and pass the result to ``runtime_env={"env_vars": ...}``.

    Raises:
        ValueError: The config cannot be turned into knob values, or an exported knob is not an integer.
        RuntimeError: A wanted knob is absent and ``transfer_queue`` is already imported (nothing set).
    """
    wanted = wanted_engine_env(cfg)
    for name in wanted:
        exported = os.environ.get(name)
        if exported is None:
            continue
        try:
            int(exported)
        except ValueError:
            raise ValueError(
                f"{name}={exported!r} is exported in the environment but is not an integer; "
                "TransferQueue parses it with int() at import"
            ) from None
    missing = [name for name in wanted if name not in os.environ]
    if missing and engine_already_imported():
        raise RuntimeError(
            f"TransferQueue environment knobs {missing} are not set, but 'transfer_queue' is "
            "already imported in this process. The library reads its TQ_* knobs once at import, "
            "so setting them now would silently leave it misconfigured. Call "
            "maybe_configure_data_plane_env(cfg) before anything imports transfer_queue (and "
            "before ray.init), or export the variables in the launcher's environment."
        )
    effective: dict[str, str] = {}
    for name, value in wanted.items():
        exported = os.environ.get(name)
        if exported is None:
            os.environ[name] = value
            effective[name] = value
            continue
        if int(exported) != int(value):
            _LOG.warning(
                "%s=%r is exported in the environment and differs from the data_plane config "
                "(%r); keeping the exported value.",
                name,
                exported,
                value,
            )
        effective[name] = exported
    return effective
