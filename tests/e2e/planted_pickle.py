"""A pickle that runs code when loaded: planted in checkpoints to show that a load never unpickles."""

from __future__ import annotations

import pickle
from pathlib import Path


class Payload:
    """A pickle whose loading creates ``marker`` (what a malicious checkpoint file would run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def plant_pickle(root: Path, rel: str, marker: Path) -> Path:
    """Write a ``Payload`` pickle to ``root / rel`` (parents created).

    Args:
        root: The checkpoint directory.
        rel: The file's path under it.
        marker: The file that loading the pickle would create.

    Returns:
        The planted file.
    """
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(Payload(marker)))
    return path
