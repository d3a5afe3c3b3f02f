"""Structured-config schemas of the experiment trackers under ``logger`` (TensorBoard, W&B, MLflow).

Every tracker is off by default, writes inside the run directory and needs the network only when
asked (``logger.wandb.mode=online``, a remote ``logger.mlflow.tracking_uri``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Optional

__all__ = ["WANDB_MODES", "TensorBoardConfig", "WandbConfig", "MlflowConfig"]

#: ``logger.wandb.mode`` values (``offline`` writes run files only, ``disabled`` makes every
#: call a no-op inside wandb itself).
WANDB_MODES: tuple[str, ...] = ("offline", "online", "disabled")


def _relative_dir(key: str, value: str) -> None:
    if not value:
        raise ValueError(f"{key}: must be a non-empty directory name")
    if PurePath(value).is_absolute() or ".." in PurePath(value).parts:
        raise ValueError(f"{key}: must be a path inside the run directory, got {value!r}")


@dataclass
class TensorBoardConfig:
    """``logger.tensorboard``: an event file per phase under ``<run_dir>/<log_dir>``.

    ``log_dir`` is relative to the run directory.
    """

    enabled: bool = False
    log_dir: str = "tensorboard"

    def __post_init__(self) -> None:
        _relative_dir("logger.tensorboard.log_dir", self.log_dir)


@dataclass
class WandbConfig:
    """``logger.wandb``: a Weights & Biases run, offline unless ``mode`` says otherwise.

    Attributes:
        entity: W&B entity (team or user); ``None`` uses wandb's default.
        name: Run name; ``None`` uses the run directory's name.
        group: Run group (for example one sweep); ``None`` for none.
        mode: One of :data:`WANDB_MODES`; ``offline`` (default) needs no network and leaves
            ``run-*.wandb`` files that ``wandb sync`` can upload later.
        dir: Directory relative to the run directory that receives wandb's files.
    """

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
        if self.mode not in WANDB_MODES:
            raise ValueError(f"logger.wandb.mode: got {self.mode!r}; legal values: {list(WANDB_MODES)}")
        if self.dir != ".":
            _relative_dir("logger.wandb.dir", self.dir)


@dataclass
class MlflowConfig:
    """``logger.mlflow``: an MLflow run, in a local file store inside the run directory by default.

    Attributes:
        tracking_uri: ``None`` means ``file:<run_dir>/mlruns``.
        experiment: Created when missing.
        run_name: ``None`` uses the run directory's name.
    """

    enabled: bool = False
    tracking_uri: Optional[str] = None
    experiment: str = "nemo_dp"
    run_name: Optional[str] = None

    def __post_init__(self) -> None:
        if not self.experiment:
            raise ValueError("logger.mlflow.experiment: must be a non-empty experiment name")
        if self.tracking_uri is not None and not self.tracking_uri:
            raise ValueError("logger.mlflow.tracking_uri: must be null or a non-empty URI")
