"""Seeding and RNG-state capture, so that a resumed run reproduces an uninterrupted one."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

_KEYS: tuple[str, ...] = ("python", "numpy", "torch")


def capture_rng_state() -> dict[str, Any]:
    """Snapshot every global RNG state used in training: ``{"python", "numpy", "torch"}``."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore a :func:`capture_rng_state` snapshot (``KeyError``, nothing restored, if a key is missing)."""
    for key in _KEYS:
        if key not in state:
            raise KeyError(f"restore_rng_state: snapshot lacks {key!r} (has {sorted(state)})")
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
