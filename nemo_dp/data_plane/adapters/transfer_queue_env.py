"""``TQ_*`` environment knobs for TransferQueue, derived from the ``data_plane`` config.

TransferQueue reads its knobs when it is imported, in every process (its own actors see them
through Ray's ``runtime_env``), so they are computed and exported before ``ray.init`` and before
``transfer_queue`` is imported: by the factory on the driver and by the adapter at construction.
Standard library only, so it never imports Ray, torch or the library itself.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ENGINE_MODULE",
    "EngineKnob",
    "ENGINE_KNOBS",
    "engine_already_imported",
    "wanted_engine_env",
    "configure_engine_env",
]

_LOG = logging.getLogger(__name__)

#: Top-level module name of the TransferQueue library.
ENGINE_MODULE = "transfer_queue"


@dataclass(frozen=True)
class EngineKnob:
    """One environment variable read by TransferQueue at import, and where its value comes from.

    Attributes:
        config_path: Dotted path of the source key below ``data_plane``.
        integer: Whether the config value must be a whole number (counts).
    """

    env_var: str
    config_path: str
    integer: bool


#: The knob table.  TransferQueue 0.1.11 parses every one of these with
#: ``int(...)``, so the exported strings must be whole numbers even for the timeouts.
ENGINE_KNOBS: tuple[EngineKnob, ...] = (
    EngineKnob("TQ_NUM_THREADS", "num_threads", integer=True),
    EngineKnob("TQ_SIMPLE_STORAGE_SEND_RECV_TIMEOUT", "timeouts.storage_s", integer=False),
    EngineKnob("TQ_SIMPLE_STORAGE_MAX_ATTEMPTS", "timeouts.storage_max_attempts", integer=True),
    EngineKnob("TQ_SIMPLE_STORAGE_PROBE_TIMEOUT", "timeouts.storage_probe_s", integer=False),
    EngineKnob("TQ_DATA_UPDATE_RESPONSE_TIMEOUT", "timeouts.controller_s", integer=False),
)


def engine_already_imported() -> bool:
    """Whether ``transfer_queue`` is in ``sys.modules`` (its knobs are then fixed)."""
    return ENGINE_MODULE in sys.modules


def _lookup(node: Any, key: str, full_key: str) -> Any:
    """Read ``key`` from a mapping (incl. ``DictConfig``) or an object attribute.

    Raises:
        ValueError: The key is absent (the message names ``full_key``).
    """
    if isinstance(node, Mapping):
        if key not in node:
            raise ValueError(f"{full_key} is missing from the data_plane config")
        return node[key]
    if not hasattr(node, key):
        raise ValueError(
            f"{full_key} is missing from the data_plane config ({type(node).__name__})"
        )
    return getattr(node, key)


def _resolve(cfg: Any, dotted: str) -> Any:
    node = cfg
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        node = _lookup(node, part, "data_plane." + ".".join(parts[: i + 1]))
    return node


def _format_knob(knob: EngineKnob, value: Any) -> str:
    """Render a config value as the decimal string the library can parse.

    Raises:
        ValueError: The value is not a positive finite number, or not a whole number.
    """
    key = f"data_plane.{knob.config_path}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number for {knob.env_var}, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{key} must be a positive finite number for {knob.env_var}, got {value!r}"
        )
    if value != int(value):
        # TransferQueue does int(os.environ[...]) at import: "2.5" would crash the library in
        # every process, including its own actors, so reject it here where the key is known.
        kind = "count" if knob.integer else "whole number of seconds"
        raise ValueError(
            f"{key}={value!r} must be a {kind}: TransferQueue parses {knob.env_var} with int()"
        )
    # int() first: str(15.0) == "15.0" and str(1e16) == "1e+16", neither parses with int().
    return str(int(value))


def wanted_engine_env(cfg: Any) -> dict[str, str]:
    """``{env_var: decimal string}`` for every ``ENGINE_KNOBS`` knob (table order) a TransferQueue config asks for.

    ``cfg`` is a ``DataPlaneConfig``, or a ``DictConfig`` / plain mapping with its keys.

    Raises:
        ValueError: A source key is missing or its value cannot be exported (the message names
            the ``data_plane.*`` key).
    """
    return {
        knob.env_var: _format_knob(knob, _resolve(cfg, knob.config_path)) for knob in ENGINE_KNOBS
    }


def _same_value(exported: str, wanted: str) -> bool:
    return int(exported) == int(wanted)


def configure_engine_env(cfg: Any) -> dict[str, str]:
    """Export the wanted ``TQ_*`` knobs that are absent; never overwrite an exported value.

    A value already present in ``os.environ`` wins (a launcher may export it on purpose); a
    warning is logged when it differs from the config.  Call this before ``ray.init`` and pass
    the returned dict to ``runtime_env={"env_vars": ...}`` so the library's actors agree.
    Returns the effective value of every knob (exported or newly set), as decimal strings.

    Raises:
        ValueError: The config cannot be turned into knob values, or an exported knob is not an
            integer (the library would fail to import).  Nothing is set.
        RuntimeError: A wanted knob is absent and ``transfer_queue`` is already imported, so
            setting it now would have no effect in this process.  Nothing is set.
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
        if not _same_value(exported, value):
            _LOG.warning(
                "%s=%r is exported in the environment and differs from the data_plane config "
                "(%r); keeping the exported value.",
                name,
                exported,
                value,
            )
        effective[name] = exported
    return effective
