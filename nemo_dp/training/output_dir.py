"""The launcher's output directory, checked (without creating it) before Hydra creates it."""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf

from nemo_dp.config import PreflightError, check_writable
from nemo_dp.training.recipe_hints import override_value

__all__ = ["output_dir_key_and_path", "output_dir_problem"]

_MULTIRUN_FLAGS = ("-m", "--multirun")


def output_dir_key_and_path(overrides: Sequence[str], conf_dir: str | os.PathLike[str]) -> tuple[str, str]:
    """``("hydra.run.dir" | "hydra.sweep.dir", unresolved value)`` of ``sys.argv[1:]`` (default in ``conf_dir``)."""
    key = "hydra.sweep.dir" if any(a in _MULTIRUN_FLAGS for a in overrides) else "hydra.run.dir"
    value = override_value(overrides, key)
    if value is not None:
        return key, value
    hydra_node = OmegaConf.to_container(OmegaConf.load(Path(conf_dir) / "config.yaml").hydra, resolve=False)
    group = "run" if key == "hydra.run.dir" else "sweep"
    return key, str(hydra_node[group]["dir"])  # type: ignore[index]


def output_dir_problem(overrides: Sequence[str], conf_dir: str | os.PathLike[str]) -> str | None:
    """Why the output directory of :func:`output_dir_key_and_path` cannot be written, or ``None``."""
    key, value = output_dir_key_and_path(overrides, conf_dir)
    # The leading components before the first one holding an interpolation.
    parts = list(itertools.takewhile(lambda part: "${" not in part, Path(value).parts))
    try:
        check_writable(key, Path(*parts) if parts else Path("."))
    except PreflightError as exc:
        return str(exc)
    return None
