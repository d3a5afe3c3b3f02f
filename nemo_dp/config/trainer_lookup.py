"""Which trainer serves a config: the (algorithm, data plane) lookup over the algorithm table, importing nothing."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from nemo_dp.config.algorithm_registry import ALGORITHMS
from nemo_dp.data_plane import registry
from nemo_dp.data_plane.factory import data_plane_kind
from nemo_dp.utils.config_access import cfg_get
from nemo_dp.utils.imports import TargetNotFoundError, resolve_target

__all__ = [
    "DEFAULT_ALGORITHM",
    "TRAINER_REGISTRY",
    "TrainerNotAvailableError",
    "TrainerSelection",
    "master_data_plane",
    "validate_trainer_selection",
]

#: The algorithm of a config without an ``algorithm`` node (such a config is a GRPO config).
DEFAULT_ALGORITHM = "grpo"

_ABSENT = object()

# (algorithm, kind) -> "module:function", rebuilt only when ALGORITHMS changes (tests may patch entries).
_TRAINER_TABLE: dict[tuple[str, str], str] = {}
_TRAINER_TABLE_KEY: tuple[Any, ...] | None = None


def _trainer_table() -> dict[tuple[str, str], str]:
    global _TRAINER_TABLE_KEY
    key = tuple(id(spec) for spec in ALGORITHMS.values())
    if key != _TRAINER_TABLE_KEY:
        _TRAINER_TABLE.clear()
        _TRAINER_TABLE.update(
            {(name, kind): target for name, spec in ALGORITHMS.items() for kind, target in spec.trainers.items()}
        )
        _TRAINER_TABLE_KEY = key
    return _TRAINER_TABLE


def __getattr__(name: str) -> Any:
    # ``TRAINER_REGISTRY`` is the dict the lookup reads, following algorithms registered after import.
    if name == "TRAINER_REGISTRY":
        return _trainer_table()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TrainerNotAvailableError(TargetNotFoundError):
    """A legal (algorithm, data plane) pair whose trainer module or function does not exist."""


@dataclass(frozen=True)
class TrainerSelection:
    """The resolved trainer choice for one config: ``target`` is its ``"module:function"``; ``mode``
    is ``"synchronous"`` or the mode switched on (``"asynchronous"``)."""

    algorithm: str
    data_plane: str
    target: str
    label: str
    mode: str = "synchronous"

    @property
    def progress_line(self) -> str:
        """The single line ``select_sync_trainer`` prints."""
        if not registry.backend(self.data_plane).enabled:
            return f"Running {self.mode} {self.label} training (legacy)"
        return f"Running {self.mode} {self.label} training (data plane: {self.data_plane})"


def _get(node: Any, key: str, where: str) -> Any:
    return cfg_get(node, key, _ABSENT, where=where, strict=True)


def _algorithm_name(master_config: Any) -> str:
    algorithm = _get(master_config, "algorithm", "")
    if algorithm is _ABSENT or algorithm is None:
        return DEFAULT_ALGORITHM
    if not isinstance(algorithm, str):
        algorithm = _get(algorithm, "name", "algorithm")
        if algorithm is _ABSENT:
            raise ValueError("algorithm.name is missing from the config")
    if not isinstance(algorithm, str) or not algorithm:
        raise ValueError(f"algorithm.name must be a non-empty string, got {algorithm!r}")
    return algorithm


def master_data_plane(master_config: Any) -> Any:
    """The ``data_plane`` node of a root config (``None`` when absent)."""
    dp = _get(master_config, "data_plane", "")
    return None if dp is _ABSENT else dp


def _choices(kinds: Iterable[str]) -> str:
    return ", ".join(f"{k} (data_plane={registry.backend(k).option})" for k in kinds)


def validate_trainer_selection(master_config: Any, *, label: str | None = None) -> TrainerSelection:
    """Resolve (algorithm, data plane) to a registered trainer without importing it (as ``select_sync_trainer`` does).

    ``master_config``'s ``algorithm`` may be a name, a node with ``name``, or absent (``"grpo"``).

    Raises:
        ValueError: Unknown algorithm, unknown ``data_plane.impl``, or an illegal pair (listing the legal ones).
        TrainerNotAvailableError: A mode's selector function does not exist.
    """
    algorithm = _algorithm_name(master_config)
    kind = data_plane_kind(master_data_plane(master_config))
    legal = [k for k in registry.BACKENDS if (algorithm, k) in _trainer_table()]
    if not legal:
        known = sorted({alg for alg, _ in _trainer_table()})
        raise ValueError(f"unknown algorithm {algorithm!r} (algorithm.name); known algorithms: {known}")
    spec = ALGORITHMS.get(algorithm)
    if label is None:
        label = spec.display_label if spec is not None else algorithm.upper()
    # A mode switched on decides the trainer (its error naming its switch) before the default table.
    mode_name, target = "synchronous", None
    for mode in spec.modes if spec is not None else ():
        selector = resolve_target(
            mode.selector, f"the {mode.name} mode selector of {algorithm!r}", error=TrainerNotAvailableError
        )
        if not selector(master_config):
            continue
        target = mode.trainers.get(kind)
        if target is None:
            raise ValueError(
                f"{mode.switch_key}=true cannot run with data_plane={kind!r}. Legal data planes "
                f"for {mode.name} {algorithm!r}: {_choices(mode.trainers)}; or set {mode.switch_key}=false."
            )
        mode_name = mode.name
        break
    if target is None:
        target = _trainer_table().get((algorithm, kind))
    if target is None:
        backend = registry.backend(kind)
        local_only = spec is not None and spec.requires_cross_process and backend.enabled and not backend.cross_process
        reason = ": a process-local store cannot carry rollout data between processes" if local_only else ""
        raise ValueError(
            f"algorithm={algorithm!r} cannot run with data_plane={kind!r}{reason}. "
            f"Legal data planes for algorithm {algorithm!r}: {_choices(legal)}."
        )
    return TrainerSelection(algorithm, kind, target, label, mode_name)
