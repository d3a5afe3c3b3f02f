"""Atomic training checkpoints (model, optimizer, RNG, loader cursor, counters).

A checkpoint is a directory ``<root>/step_<N>`` holding ``manifest.json`` and ``state.pt``.
It is committed through the data plane's atomic protocol (temp sibling + rename), so a crash
mid-save never damages the previous checkpoint and a half-written one is never loaded.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from nemo_dp.utils.checkpoint_io import read_manifest, write_checkpoint_atomically, write_manifest

CHECKPOINT_FORMAT = "nemo_dp.training_checkpoint"
CHECKPOINT_FORMAT_VERSION = 1
STATE_FILE = "state.pt"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dir_for_step(root: str | os.PathLike[str], step: int) -> Path:
    """The directory name used for ``step`` under ``root``.

    Args:
        root: Checkpoint root directory.
        step: Training step (>= 0).

    Returns:
        ``root / f"step_{step:08d}"``.

    Raises:
        ValueError: If ``step`` is negative.
    """
    if step < 0:
        raise ValueError(f"checkpoint_dir_for_step: step must be >= 0, got {step}")
    return Path(root) / f"step_{step:08d}"


def save_training_checkpoint(checkpoint_dir: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    """Atomically write ``state`` (any torch-serialisable dict) to ``checkpoint_dir``.

    Args:
        checkpoint_dir: Final directory (usually from :func:`checkpoint_dir_for_step`).
        state: Model/optimizer state dicts, RNG snapshot, loader state, counters...

    Returns:
        The absolute checkpoint path.

    Raises:
        TypeError: If ``state`` is not a dict (nothing written).
        Exception: Whatever serialisation raised; the previous checkpoint is then intact.
    """
    if not isinstance(state, dict):
        raise TypeError(f"save_training_checkpoint: state must be a dict, got {type(state).__name__}")

    def write(tmp: Path) -> None:
        torch.save(state, tmp / STATE_FILE)
        write_manifest(
            tmp,
            {
                "format": CHECKPOINT_FORMAT,
                "format_version": CHECKPOINT_FORMAT_VERSION,
                "keys": sorted(str(k) for k in state),
            },
        )

    return write_checkpoint_atomically(checkpoint_dir, write)


def load_training_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_training_checkpoint`.

    Args:
        checkpoint_dir: The checkpoint directory.

    Returns:
        The saved state dict.

    Raises:
        FileNotFoundError: If the directory, its manifest or its state file is missing.
        ValueError: If the manifest names another format or version.
    """
    read_manifest(
        checkpoint_dir,
        expected_format=CHECKPOINT_FORMAT,
        supported_versions=(CHECKPOINT_FORMAT_VERSION,),
    )
    path = Path(checkpoint_dir) / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"load_training_checkpoint: {path} is missing")
    # Our own files: they hold Python RNG tuples and NumPy arrays, which the weights-only
    # unpickler refuses.
    return torch.load(path, map_location="cpu", weights_only=False)


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The committed ``step_<N>`` directory with the largest N under ``root``.

    Temp (``*.tmp-*``) and displaced (``*.old-*``) siblings and directories without a manifest
    are ignored.

    Args:
        root: Checkpoint root directory (may not exist).

    Returns:
        The path, or None when there is no committed checkpoint.
    """
    base = Path(root)
    if not base.is_dir():
        return None
    best: tuple[int, Path] | None = None
    for child in base.iterdir():
        m = _STEP_DIR.match(child.name)
        if m is None or not (child / "manifest.json").is_file() or not (child / STATE_FILE).is_file():
            continue
        step = int(m.group(1))
        if best is None or step > best[0]:
            best = (step, child)
    return None if best is None else best[1]
