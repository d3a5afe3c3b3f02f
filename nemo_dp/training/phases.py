"""Phase planning of a run: an optional SFT warm start, then the main algorithm, and where each
phase resumes from.

A run is a list of phases trained one after another on the same policy.  Planning is separate
from running so the launcher, the bench and the tests derive the same phases (and the same
resume decisions) from one config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_dp.config import warm_start_config
from nemo_dp.training.checkpointer import load_start_state

__all__ = ["Phase", "main_phase", "warm_start_phase", "plan_phases", "load_start_states", "first_phase_to_run"]


@dataclass
class Phase:
    """One training phase of a run.

    Attributes:
        name: Short name (checkpoint sub-root and resume sub-directory).
        label: Human label for log lines and the progress bar.
        cfg: The root config the phase's trainer receives.
        out_subdir: Output sub-directory ('' = the run directory itself).
    """

    name: str
    label: str
    cfg: Any
    out_subdir: str


def main_phase(cfg: Any) -> Phase:
    """The phase of the config's own algorithm.

    Args:
        cfg: The composed root config.

    Returns:
        The phase, writing into the run directory itself.
    """
    name = str(cfg.algorithm.name)
    return Phase(name, name.upper(), cfg, "")


def warm_start_phase(cfg: Any) -> Phase:
    """The SFT warm-start phase of an RL config (whether or not it is enabled).

    Args:
        cfg: A composed root config whose algorithm has a ``warm_start`` node.

    Returns:
        The phase (config from ``warm_start_config``), writing into ``warm_start/``.

    Raises:
        ValueError: The algorithm has no warm start.
    """
    return Phase("warm_start", "SFT warm start", warm_start_config(cfg), "warm_start")


def plan_phases(cfg: Any) -> list[Phase]:
    """The phases a config asks for: an optional SFT warm start, then the main algorithm.

    Args:
        cfg: The composed root config.

    Returns:
        The phases in execution order.
    """
    phases: list[Phase] = []
    if "warm_start" in cfg.algorithm and bool(cfg.algorithm.warm_start.enabled):
        phases.append(warm_start_phase(cfg))
    phases.append(main_phase(cfg))
    return phases


def load_start_states(phases: list[Phase], resume_from: str | Path | None) -> list[dict[str, Any] | None]:
    """Each phase's start state under ``resume_from/<phase name>`` (``None`` = fresh start).

    Args:
        phases: The planned phases.
        resume_from: ``checkpointing.resume_from`` (``None`` = no resume).

    Returns:
        One loaded checkpoint state (or ``None``) per phase.
    """
    root = None if resume_from is None else Path(resume_from)
    return [load_start_state(None if root is None else root / p.name) for p in phases]


def first_phase_to_run(start_states: list[dict[str, Any] | None]) -> int:
    """Index of the first phase to run: the last one with a checkpoint, else the first.

    A later phase's checkpoint already contains everything the earlier phases produced.

    Args:
        start_states: ``load_start_states`` output.

    Returns:
        The index.
    """
    return max((i for i, s in enumerate(start_states) if s is not None), default=0)
