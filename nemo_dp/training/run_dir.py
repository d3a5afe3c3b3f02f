"""One run per run directory (:func:`claim_run_dir` decides, :meth:`RunDirDecision.commit` writes), and a
resumed run whose metrics continue the interrupted run's (:func:`continue_history`)."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_dp.training.checkpoint_discovery import find_phase_roots, list_step_dirs
from nemo_dp.training.resume import ResumePlan
from nemo_dp.utils.json_files import json_lines, load_json, write_json, write_json_lines
from nemo_dp.utils.metrics import bad_metrics_json

__all__ = [
    "RUN_MARKER",
    "OVERWRITE_KEY",
    "RunDirError",
    "RunDirContents",
    "RunDirDecision",
    "HistoryReport",
    "new_run_id",
    "read_run_marker",
    "scan_run_dir",
    "claim_run_dir",
    "continue_history",
]

RUN_MARKER = "run.json"
RUN_MARKER_FORMAT = "nemo_dp.run"
RUN_MARKER_VERSION = 1
#: The config key that lets a run replace another run's artefacts in its directory.
OVERWRITE_KEY = "checkpointing.overwrite"
_SUMMARY = "summary.json"


class RunDirError(ValueError):
    """The run directory holds another run's artefacts (or is otherwise unusable)."""


def new_run_id() -> str:
    """A fresh run id: UTC time plus 8 random hex digits (``"20261201-195612-3f9a1c2e"``)."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def read_run_marker(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A run directory's ``run.json`` marker, or ``None`` when there is none.

    Raises:
        RunDirError: The marker exists but is not a valid run marker (names the file).
    """
    path = Path(run_dir) / RUN_MARKER
    if not path.is_file():
        return None
    raw = load_json(path, lambda exc: RunDirError(f"{path}: run marker is not valid JSON ({exc})"))
    if not isinstance(raw, dict) or raw.get("format") != RUN_MARKER_FORMAT or not isinstance(raw.get("run_id"), str):
        raise RunDirError(f"{path}: not a run marker (format {RUN_MARKER_FORMAT!r} with a str 'run_id')")
    return raw


@dataclass
class RunDirContents:
    """The artefacts of earlier runs in a run directory: ``{phase: [step, ...]}`` checkpoints, non-empty
    metrics files (its own and its phases' sub-directories'), ``summary.json`` and ``run.json``."""

    run_dir: Path
    checkpoints: dict[str, list[int]] = field(default_factory=dict)
    metrics: list[Path] = field(default_factory=list)
    summary: Path | None = None
    marker: dict[str, Any] | None = None

    @property
    def is_empty(self) -> bool:
        return not (self.checkpoints or self.metrics or self.summary or self.marker)

    def describe(self) -> str:
        """What was found, e.g. ``"run 2026...-ab12 with checkpoints grpo: steps [10, 20]; metrics.jsonl"``."""
        parts = []
        if self.checkpoints:
            parts.append("checkpoints " + ", ".join(f"{p}: steps {s}" for p, s in sorted(self.checkpoints.items())))
        parts.extend(str(p.relative_to(self.run_dir)) for p in self.metrics)
        if self.summary is not None:
            parts.append(_SUMMARY)
        who = f"run {self.marker['run_id']}" if self.marker else "an earlier run"
        return f"{who} with " + "; ".join(parts) if parts else who


def scan_run_dir(
    run_dir: str | os.PathLike[str], *, checkpoint_dir: str = "checkpoints", metrics_file: str = "metrics.jsonl"
) -> RunDirContents:
    """What earlier runs left in ``run_dir`` (Hydra's own ``.hydra/`` and log are not counted)."""
    root = Path(run_dir)
    contents = RunDirContents(run_dir=root)
    if not root.is_dir():
        return contents
    ckpt_root = root / checkpoint_dir
    contents.checkpoints = {
        phase: [s for s, _ in list_step_dirs(path)] for phase, path in find_phase_roots(ckpt_root).items()
    }
    candidates = [root / metrics_file] + sorted(
        c / metrics_file for c in root.iterdir() if c.is_dir() and c != ckpt_root and not c.name.startswith(".")
    )
    contents.metrics = [p for p in candidates if p.is_file() and p.stat().st_size > 0]
    contents.summary = root / _SUMMARY if (root / _SUMMARY).is_file() else None
    contents.marker = read_run_marker(root)
    return contents


@dataclass
class RunDirDecision:
    """What :func:`claim_run_dir` decided (``mode``: ``fresh``, ``resume_in_place`` or ``overwrite``, with
    a log line ``message``); :meth:`commit` performs its writes. ``resume_step``/``resume_phase`` are
    set for ``resume_in_place`` only; ``later_phases``' checkpoints are superseded too."""

    run_dir: Path
    mode: str
    run_id: str
    contents: RunDirContents
    message: str
    resume_step: int | None = None
    resume_phase: str | None = None
    resumed_from: Path | None = None
    checkpoint_dir: str = "checkpoints"
    later_phases: tuple[str, ...] = ()

    def commit(self) -> list[str]:
        """Do the decided writes and write ``run.json``; return log lines of what was removed or moved."""
        action = {"overwrite": self._remove_previous, "resume_in_place": self._supersede_newer}.get(self.mode)
        lines = action() if action is not None else []
        self._write_marker()
        return lines

    def _remove_previous(self) -> list[str]:
        removed: list[str] = []
        ckpt_root = self.run_dir / self.checkpoint_dir
        if self.contents.checkpoints and ckpt_root.is_dir():
            shutil.rmtree(ckpt_root)
            removed.append(str(ckpt_root))
        for path in [*self.contents.metrics, self.contents.summary]:
            if path is not None and path.is_file():
                path.unlink()
                removed.append(str(path))
        if not removed:
            return []
        return [f"{OVERWRITE_KEY}=true: removed {self.contents.describe()} ({len(removed)} paths: {removed})"]

    def _supersede_newer(self) -> list[str]:
        """Move checkpoints the resumed run will redo out of the checkpoints root."""
        ckpt_root = self.run_dir / self.checkpoint_dir
        moves: list[tuple[Path, Path]] = []
        dest_root = self.run_dir / f"superseded-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
        for phase, steps in self.contents.checkpoints.items():
            if phase == self.resume_phase:
                redo = [s for s in steps if self.resume_step is not None and s > self.resume_step]
            elif phase in self.later_phases:
                redo = list(steps)
            else:
                continue
            for step, path in list_step_dirs(ckpt_root / phase):
                if step in redo:
                    moves.append((path, dest_root / phase / path.name))
        for src, dst in moves:
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
        if not moves:
            return []
        names = [f"{s.parent.name}/{s.name}" for s, _ in moves]
        return [
            f"resume in place from step {self.resume_step}: moved {len(moves)} newer checkpoint(s) "
            f"{names} to {dest_root} (they would mix with the resumed run's)"
        ]

    def _write_marker(self) -> None:
        previous = (self.contents.marker if self.mode == "resume_in_place" else None) or {}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        marker: dict[str, Any] = {
            "format": RUN_MARKER_FORMAT,
            "format_version": RUN_MARKER_VERSION,
            "run_id": self.run_id,
            "created_at": previous.get("created_at", now),
            "resumes": list(previous.get("resumes", [])),
        }
        if self.resumed_from is not None:
            in_place = self.mode == "resume_in_place"
            marker["resumes"].append({"at": now, "checkpoint": str(self.resumed_from), "in_place": in_place})
        write_json(self.run_dir / RUN_MARKER, marker, indent=1)


def _same(a: Path | None, b: Path) -> bool:
    return a is not None and os.path.realpath(a) == os.path.realpath(b)


def claim_run_dir(
    run_dir: str | os.PathLike[str],
    *,
    checkpoint_dir: str = "checkpoints",
    metrics_file: str = "metrics.jsonl",
    resume: ResumePlan | None = None,
    phase_names: Sequence[str] = (),
    overwrite: bool = False,
) -> RunDirDecision:
    """Decide whether this run may use ``run_dir`` (writes nothing; :meth:`RunDirDecision.commit` does).

    Raises:
        RunDirError: The directory holds another run's checkpoints, metrics or summary and the
            run neither resumes from it nor sets ``checkpointing.overwrite=true``.
    """
    root = Path(os.path.abspath(os.fspath(run_dir)))
    contents = scan_run_dir(root, checkpoint_dir=checkpoint_dir, metrics_file=metrics_file)
    resumed_from = resume.checkpoint if resume is not None else None
    base = dict(run_dir=root, contents=contents, checkpoint_dir=checkpoint_dir, resumed_from=resumed_from)
    if resume is not None and _same(resume.run_dir, root):
        marker_id = contents.marker["run_id"] if contents.marker else None
        meta_id = resume.meta.run_id if resume.meta is not None else None
        later = tuple(phase_names[resume.phase_index + 1 :]) if phase_names else ()
        run_id = marker_id or meta_id or new_run_id()
        return RunDirDecision(
            mode="resume_in_place",
            run_id=run_id,
            message=(
                f"run directory {root}: resuming run {run_id} in place from phase {resume.phase!r} step {resume.step}"
            ),
            resume_step=resume.step,
            resume_phase=resume.phase,
            later_phases=later,
            **base,
        )
    if contents.is_empty:
        run_id = new_run_id()
        what = f" (resuming from {resume.checkpoint})" if resume is not None else ""
        message = f"run directory {root}: new run {run_id}{what}"
        return RunDirDecision(mode="fresh", run_id=run_id, message=message, **base)
    if overwrite:
        run_id = new_run_id()
        message = f"run directory {root}: new run {run_id} replaces {contents.describe()} ({OVERWRITE_KEY}=true)"
        return RunDirDecision(mode="overwrite", run_id=run_id, message=message, **base)
    resume_hint = (
        f" (this run resumes from {resume.checkpoint}, which is not in this directory)" if resume is not None else ""
    )
    raise RunDirError(
        f"hydra.run.dir: {root} already holds {contents.describe()}{resume_hint}; a second run "
        f"there would mix with it. Choose another hydra.run.dir, resume that run with "
        f"checkpointing.resume_from={root}, or set {OVERWRITE_KEY}=true to replace it"
    )


@dataclass
class HistoryReport:
    """What :func:`continue_history` did to one phase's metrics file ``path`` (copied from ``source``):
    records ``kept`` (steps <= the resumed step) and ``dropped`` (later steps, or a torn last line)."""

    path: Path
    kept: int
    dropped: int
    source: Path

    def describe(self) -> str:
        origin = "" if self.source == self.path else f" copied from {self.source}"
        return (
            f"metrics {self.path}: kept {self.kept} records{origin}, dropped {self.dropped} "
            "(steps the resumed run redoes)"
        )


def _read_records(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Records of a metrics file; a torn last line (no newline, a killed writer) is dropped."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    torn = 0
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        try:
            json.loads(lines[-1])
        except json.JSONDecodeError:
            lines.pop()
            torn = 1
    records = []
    for lineno, rec in json_lines(lines, lambda n, exc: bad_metrics_json(path, n, exc)):
        step = rec.get("step") if isinstance(rec, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(f"{path}:{lineno}: metrics record needs an int 'step'")
        records.append(rec)
    return records, torn


def continue_history(
    *,
    source_run_dir: str | os.PathLike[str],
    run_dir: str | os.PathLike[str],
    phase_subdirs: Sequence[str],
    resume_phase_index: int,
    resume_step: int,
    metrics_file: str = "metrics.jsonl",
) -> list[HistoryReport]:
    """Make this run's metrics files continue the interrupted run's, with no overlapping step.

    Earlier phases (``phase_subdirs``, run order) keep all records, the resumed one steps <= ``resume_step``,
    later ones none; files are rewritten in place, or copied into a different ``run_dir`` (not there yet).

    Raises:
        ValueError: A metrics line is not a JSON object with an int ``step`` (names file:line).
        RunDirError: A destination file already exists in a different run directory.
    """
    src_root, dst_root = Path(source_run_dir), Path(run_dir)
    in_place = _same(src_root, dst_root)
    reports: list[HistoryReport] = []
    for index, sub in enumerate(phase_subdirs):
        src = src_root / sub / metrics_file
        dst = dst_root / sub / metrics_file
        if not src.is_file():
            continue
        if not in_place and dst.exists():
            raise RunDirError(f"{dst}: exists already; cannot copy the resumed run's history into it")
        records, torn = _read_records(src)
        if index < resume_phase_index:
            kept = records
        elif index == resume_phase_index:
            kept = [r for r in records if r["step"] <= resume_step]
        else:
            kept = []
        dropped = len(records) - len(kept) + torn
        if in_place and dropped == 0:
            continue
        if in_place and not kept:
            src.unlink()
        else:
            write_json_lines(dst, kept)
        reports.append(HistoryReport(path=dst, kept=len(kept), dropped=dropped, source=src))
    return reports
