"""Finding checkpoints on disk: step directories, phase roots, checkpoints roots, run directories, and
the one checkpoint a user's path names (``resume_from``, ``init_from``, ``checkpoint=``)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nemo_dp.utils.checkpoint import STATE_FILE, STATE_JSON, STEP_DIR
from nemo_dp.utils.checkpoint_io import MANIFEST_NAME

__all__ = [
    "RUN_CONFIG_FILE",
    "ResumeError",
    "step_of",
    "list_step_dirs",
    "latest_checkpoint",
    "newest_checkpoint",
    "find_phase_roots",
    "temp_step_dirs",
    "run_dir_of",
    "find_run_dir",
    "missing_files",
    "Located",
    "classify_checkpoint_dir",
    "locate_checkpoint",
    "newest_usable_step",
]

#: The resolved config that every run writes into its run directory.
RUN_CONFIG_FILE = "resolved_config.yaml"
#: What a killed checkpoint write leaves: the temp sibling ``step_<N>.tmp-<hex>``.
_TEMP_STEP_DIR = re.compile(r"^step_\d+\.tmp-[0-9a-f]+$")


class ResumeError(ValueError):
    """``checkpointing.resume_from`` / ``policy.init_from`` holds no usable checkpoint."""


def step_of(path: str | os.PathLike[str]) -> int | None:
    """``N`` of a path whose last component is ``step_<N>``, else ``None`` (also for ``*.tmp-*``/``*.old-*``)."""
    m = STEP_DIR.match(Path(path).name)
    return None if m is None else int(m.group(1))


def list_step_dirs(phase_root: str | os.PathLike[str], *, committed: bool = False) -> list[tuple[int, Path]]:
    """``[(N, path), ...]`` of the ``step_<N>`` directories under a phase root (may not exist), oldest first;
    with ``committed`` only those holding ``manifest.json``."""
    return sorted(
        (step, child)
        for child in _subdirs(phase_root)
        if (step := step_of(child)) is not None and (not committed or (child / MANIFEST_NAME).is_file())
    )


def _subdirs(path: str | os.PathLike[str]) -> list[Path]:
    """The sub-directories of ``path`` by name; ``[]`` when it is not a directory."""
    root = Path(path)
    return sorted(c for c in root.iterdir() if c.is_dir()) if root.is_dir() else []


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The newest committed step directory with a state file under a phase root (may not exist), or ``None``."""
    for _, path in reversed(list_step_dirs(root, committed=True)):
        if (path / STATE_JSON).is_file() or (path / STATE_FILE).is_file():
            return path
    return None


def newest_checkpoint(checkpoints_root: str | os.PathLike[str] | None, phase_names: Sequence[str] = ()) -> Path | None:
    """:func:`latest_checkpoint` of the latest of ``phase_names`` (run order; empty: every sub-directory, by
    name) that has one, or ``None``; ``checkpoints_root`` may be ``None`` or not exist."""
    if checkpoints_root is None:
        return None
    root = Path(checkpoints_root)
    names = list(phase_names) or [p.name for p in _subdirs(root)]
    for name in reversed(names):
        found = latest_checkpoint(root / name)
        if found is not None:
            return found
    return None


def find_phase_roots(checkpoints_root: str | os.PathLike[str], *, committed: bool = False) -> dict[str, Path]:
    """``{phase name: phase root}`` of the sub-directories holding a step directory (``committed`` as in
    :func:`list_step_dirs`; the root may not exist)."""
    return {c.name: c for c in _subdirs(checkpoints_root) if list_step_dirs(c, committed=committed)}


def temp_step_dirs(checkpoints_root: str | os.PathLike[str]) -> list[Path]:
    """The ``step_<N>.tmp-<hex>`` directories killed checkpoint writes left in the phase roots, sorted
    (symbolic links are not followed or listed; the root may not exist)."""
    return [
        child
        for phase_root in _subdirs(checkpoints_root)
        if not phase_root.is_symlink()
        for child in _subdirs(phase_root)
        if _TEMP_STEP_DIR.match(child.name) and not child.is_symlink()
    ]


def run_dir_of(checkpoints_root: Path, checkpoint_dir_name: str) -> Path | None:
    """``<run>`` when ``checkpoints_root`` is ``<run>/<checkpoint_dir_name>``, else ``None``."""
    parts = Path(checkpoint_dir_name).parts
    if not parts or Path(checkpoint_dir_name).is_absolute() or checkpoints_root.parts[-len(parts) :] != parts:
        return None
    return Path(*checkpoints_root.parts[: -len(parts)])


def find_run_dir(start: Path) -> Path | None:
    """The nearest of ``start`` and its parents holding :data:`RUN_CONFIG_FILE`, or ``None``."""
    return next((c for c in (start, *start.parents) if (c / RUN_CONFIG_FILE).is_file()), None)


def missing_files(step_dir: Path, required: Sequence[str]) -> list[str]:
    """The files of ``required`` that a step directory lacks, in the order of ``required``."""
    return [name for name in required if not (step_dir / name).is_file()]


def _listing(path: Path, limit: int = 6) -> str:
    names = sorted(c.name + ("/" if c.is_dir() else "") for c in path.iterdir())
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"{names[:limit]}{more}"


@dataclass
class Located:
    """What a user's path is (``kind``: ``step directory``, ``phase root``, ``checkpoints root`` or ``run
    directory``); ``run_dir`` is ``None`` unless the root is ``<run>/<checkpoint_dir_name>``."""

    kind: str
    checkpoints_root: Path
    run_dir: Path | None
    phase_roots: dict[str, Path] = field(default_factory=dict)
    step_dir: Path | None = None


def classify_checkpoint_dir(
    path: Path, *, checkpoint_dir_name: str = "checkpoints", committed: bool = False
) -> Located | None:
    """Whether an existing directory is a step directory, a phase root or a checkpoints root (checked in
    that order), else ``None``; the run-directory form is left to the caller."""
    if step_of(path) is not None:
        root, phase_root = path.parent.parent, path.parent
        run_dir = run_dir_of(root, checkpoint_dir_name)
        return Located("step directory", root, run_dir, {phase_root.name: phase_root}, path)
    if list_step_dirs(path, committed=committed):
        root = path.parent
        return Located("phase root", root, run_dir_of(root, checkpoint_dir_name), {path.name: path})
    phases = find_phase_roots(path, committed=committed)
    if phases:
        return Located("checkpoints root", path, run_dir_of(path, checkpoint_dir_name), phases)
    return None


def locate_checkpoint(path_str: str | os.PathLike[str], key: str, checkpoint_dir_name: str) -> Located:
    """Classify a resume / init path (made absolute, links kept) as one of :class:`Located`'s kinds.

    Raises:
        ResumeError: It does not exist, is a file, or holds no step directory (saying what it found).
    """
    path = Path(os.path.abspath(os.fspath(path_str)))
    if not path.exists():
        raise ResumeError(f"{key}: {str(path)!r} does not exist")
    if path.is_file():
        parent = f"; pass its step directory {str(path.parent)!r}" if step_of(path.parent) is not None else ""
        raise ResumeError(f"{key}: {str(path)!r} is a file, not a checkpoint directory{parent}")
    located = classify_checkpoint_dir(path, checkpoint_dir_name=checkpoint_dir_name)
    if located is not None:
        return located
    nested = path / checkpoint_dir_name
    looks_like_run = (path / ".hydra").is_dir() or any(
        (path / n).exists() for n in ("metrics.jsonl", "summary.json", RUN_CONFIG_FILE)
    )
    if nested.is_dir():
        phases = find_phase_roots(nested)
        if phases:
            return Located("run directory", nested, path, phases)
        what = "is empty" if not any(nested.iterdir()) else f"holds no step_<N> directory ({_listing(nested)})"
        raise ResumeError(
            f"{key}: {str(path)!r} is a run directory whose checkpoints root {str(nested)!r} {what}: "
            "the run stopped before its first save (see checkpointing.save_period) - nothing to "
            "resume from"
        )
    if looks_like_run:
        raise ResumeError(
            f"{key}: {str(path)!r} is a run directory with no checkpoints "
            f"({checkpoint_dir_name}/ is missing: checkpointing.enabled was false, or the run wrote "
            "them under another checkpointing.checkpoint_dir) - nothing to resume from"
        )
    if not any(path.iterdir()):
        raise ResumeError(f"{key}: {str(path)!r} is an empty directory - nothing to resume from")
    raise ResumeError(
        f"{key}: {str(path)!r} holds no checkpoint (found {_listing(path)}); expected a run "
        f"directory, its {checkpoint_dir_name}/ root, a phase root <root>/<phase> or a step "
        "directory <root>/<phase>/step_<N>"
    )


def newest_usable_step(phase_root: Path, key: str, required: Sequence[str]) -> tuple[int, Path]:
    """``(N, step dir)`` of a phase root's newest step (it must have one), refused when incomplete.

    Raises:
        ResumeError: The newest step directory lacks a required file (naming an older complete one).
    """
    steps = list_step_dirs(phase_root)
    step, newest = steps[-1]
    missing = missing_files(newest, required)
    if missing:
        older = [p for _, p in steps[:-1] if not missing_files(p, required)]
        alt = (
            f"; to resume from the older complete checkpoint pass {key}={older[-1]}"
            if older
            else "; no older complete checkpoint exists"
        )
        raise ResumeError(
            f"{key}: newest checkpoint {newest} is missing {missing} (a damaged or partly copied "
            f"checkpoint; refusing to fall back silently){alt}"
        )
    return step, newest
