"""The launcher's output directory, checked before Hydra creates it.

:func:`output_dir_problem` probes the directory the command line names without creating it, so
the launcher refuses an unwritable path with one message instead of Hydra's traceback.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf

from nemo_dp.config import PreflightError, check_writable

__all__ = ["output_dir_key_and_path", "output_dir_problem"]

_MULTIRUN_FLAGS = ("-m", "--multirun")


def output_dir_key_and_path(overrides: Sequence[str], conf_dir: str | os.PathLike[str]) -> tuple[str, str]:
    """``("hydra.run.dir" | "hydra.sweep.dir", unresolved value)`` of this command line.

    ``overrides`` is ``sys.argv[1:]``; ``conf_dir/config.yaml`` holds the default.
    """
    key = "hydra.sweep.dir" if any(a in _MULTIRUN_FLAGS for a in overrides) else "hydra.run.dir"
    for item in overrides:
        name, sep, value = item.partition("=")
        if sep and name.lstrip("+") == key:
            return key, value
    hydra_node = OmegaConf.to_container(OmegaConf.load(Path(conf_dir) / "config.yaml").hydra, resolve=False)
    group = "run" if key == "hydra.run.dir" else "sweep"
    return key, str(hydra_node[group]["dir"])  # type: ignore[index]


def _static_prefix(value: str) -> Path:
    """The leading components of ``value`` before the first one holding an interpolation."""
    parts = []
    for part in Path(value).parts:
        if "${" in part:
            break
        parts.append(part)
    return Path(*parts) if parts else Path(".")


def output_dir_problem(overrides: Sequence[str], conf_dir: str | os.PathLike[str]) -> str | None:
    """Why this command line's output directory cannot be created or written (one message naming
    the key), or ``None`` when it is usable; arguments as for :func:`output_dir_key_and_path`."""
    key, value = output_dir_key_and_path(overrides, conf_dir)
    try:
        check_writable(key, _static_prefix(value))
    except PreflightError as exc:
        return str(exc)
    return None
