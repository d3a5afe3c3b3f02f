"""Structured-config schemas of the experiment trackers under ``logger`` (off by default, writing in the run
directory, online only when asked)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Optional

from nemo_dp.utils.config_checks import one_of

__all__ = ["WANDB_MODES", "TensorBoardConfig", "WandbConfig", "MlflowConfig"]

WANDB_MODES: tuple[str, ...] = ("offline", "online", "disabled")


def _relative_dir(key: str, value: str) -> None:
    if not value:
        raise ValueError(f"{key}: must be a non-empty directory name")
    if PurePath(value).is_absolute() or ".." in PurePath(value).parts:
        raise ValueError(f"{key}: must be a path inside the run directory, got {value!r}")


@dataclass
class TensorBoardConfig:
    """``logger.tensorboard``: an event file per phase under ``<run_dir>/<log_dir>``."""

    enabled: bool = False
    log_dir: str = "tensorboard"

    def __post_init__(self) -> None:
        _relative_dir("logger.tensorboard.log_dir", self.log_dir)


@dataclass
class WandbConfig:
    """``logger.wandb``: a Weights & Biases run, offline by default (``wandb sync`` uploads later); ``name``
    ``None`` is the run directory's name, and ``dir`` is relative to it."""

    enabled: bool = False
    project: str = "nemo_dp"
    entity: Optional[str] = None
    name: Optional[str] = None
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    mode: str = "offline"
    dir: str = "."

    def __post_init__(self) -> None:
        if not self.project:
            raise ValueError("logger.wandb.project: must be a non-empty project name")
        one_of("logger.wandb.mode", self.mode, WANDB_MODES)
        if self.dir != ".":
            _relative_dir("logger.wandb.dir", self.dir)


@dataclass
class MlflowConfig:
    """``logger.mlflow``: an MLflow run (``tracking_uri`` ``None``: ``file:<run_dir>/mlruns``; ``run_name``
    ``None``: the run directory's name; ``experiment`` created when missing)."""

    enabled: bool = False
    tracking_uri: Optional[str] = None
    experiment: str = "nemo_dp"
    run_name: Optional[str] = None

    def __post_init__(self) -> None:
        if not self.experiment:
            raise ValueError("logger.mlflow.experiment: must be a non-empty experiment name")
        if self.tracking_uri is not None and not self.tracking_uri:
            raise ValueError("logger.mlflow.tracking_uri: must be null or a non-empty URI")
