"""Resolution of ``checkpointing.resume_from`` and ``policy.init_from`` to exactly one checkpoint, on the
driver before Ray starts; a checkpoint whose ``checkpoint_meta.json`` differs from this run is refused."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nemo_dp.training.checkpoint_discovery import (
    ResumeError,
    locate_checkpoint,
    missing_files,
    newest_usable_step,
    step_of,
)
from nemo_dp.utils.checkpoint import REQUIRED_FILES
from nemo_dp.utils.json_files import load_json
from nemo_dp.utils.manifest import has_manifest, verify_manifest

__all__ = [
    "CHECKPOINT_META_NAME",
    "CHECKPOINT_META_FORMAT",
    "CHECKPOINT_META_VERSION",
    "WARM_START_PHASE",
    "ResumeError",
    "CheckpointMismatchError",
    "CheckpointMeta",
    "ResumePlan",
    "InitFromPlan",
    "model_shape_of",
    "run_settings",
    "write_checkpoint_meta",
    "read_checkpoint_meta",
    "check_checkpoint_meta",
    "refuse_pickles",
    "check_checkpoint_dir",
    "resolve_resume",
    "resolve_init_from",
]

CHECKPOINT_META_NAME = "checkpoint_meta.json"
CHECKPOINT_META_FORMAT = "nemo_dp.checkpoint_meta"
CHECKPOINT_META_VERSION = 1
#: Phase name of an RL run's SFT warm start (its checkpoints are SFT checkpoints).
WARM_START_PHASE = "warm_start"
_RESUME_KEY = "checkpointing.resume_from"
_PICKLE_SUFFIXES = (".pkl", ".pickle")
_INIT_KEY = "policy.init_from"


class CheckpointMismatchError(ResumeError):
    """A checkpoint of another algorithm, phase, model or backend (``differing``: ``{key: (its, ours)}``)."""

    def __init__(self, message: str, differing: Mapping[str, tuple[Any, Any]]) -> None:
        super().__init__(message)
        self.differing = dict(differing)


@dataclass(frozen=True)
class CheckpointMeta:
    """What a checkpoint belongs to (``checkpoint_meta.json``): ``algorithm.name`` of the phase that wrote
    it (``sft`` for a warm start), model shape, data-plane backend, run and step, and the settings a
    resume must keep (:func:`run_settings`; empty in checkpoints written before they were recorded)."""

    algorithm: str
    phase: str
    model_shape: dict[str, int]
    data_plane: str
    run_id: str
    step: int
    format_version: int = CHECKPOINT_META_VERSION
    settings: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
            return {"format": CHECKPOINT_META_FORMAT, **asdict(self)}


def model_shape_of(model_cfg: Mapping[str, Any] | Any, **extra: int) -> dict[str, int]:
    """``{key: int}`` of every int (not bool) entry of a ``policy.model`` node (DictConfig, dataclass or
    mapping), plus ``extra`` keys (``vocab_size=...``), sorted by key."""
    items = dict(model_cfg.items()) if hasattr(model_cfg, "items") else dict(vars(model_cfg))
    shape = {str(k): int(v) for k, v in items.items() if isinstance(v, int) and not isinstance(v, bool)}
    shape.update({k: int(v) for k, v in extra.items()})
    return dict(sorted(shape.items()))


#: The config keys a resume must keep (absent keys skipped).
_KEPT_KEYS: tuple[str, ...] = ("policy.dp_size", "algorithm.async_rollout.enabled")


def _architecture(policy_cfg: Any) -> str | None:
    """``config.json``'s architectures of a policy node, or its kind."""
    kind = _select(policy_cfg, "kind")
    path = _select(policy_cfg, "model_name_or_path")
    config_json = None if path is None else Path(str(path)) / "config.json"
    if config_json is not None and config_json.is_file():
        try:
            raw = json.loads(config_json.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None  # the model builder reports a broken config.json, naming the key
        names = raw.get("architectures") if isinstance(raw, dict) else None
        if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
            return ",".join(names)
        if isinstance(raw, dict) and isinstance(raw.get("model_type"), str):
            return str(raw["model_type"])
        return None
    return None if kind is None else str(kind)


def _select(node: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if node is None:
            return None
        try:
            node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
        except Exception:  # a struct node without the key
            return None
    return node


def run_settings(phase_cfg: Any) -> dict[str, Any]:
    """``{key: JSON scalar}`` of a phase config's settings that a resume must keep: ``policy.dp_size`` (RNG
    streams, optimizer shards), ``algorithm.async_rollout.enabled`` (trainer state) and ``architecture``."""
    out: dict[str, Any] = {}
    for key in _KEPT_KEYS:
        value = _select(phase_cfg, key)
        if isinstance(value, (bool, int, float, str)):
            out[key] = value
    arch = _architecture(_select(phase_cfg, "policy"))
    if arch is not None:
        out["architecture"] = arch
    return out


def write_checkpoint_meta(checkpoint_dir: str | os.PathLike[str], meta: CheckpointMeta) -> Path:
    """Write ``checkpoint_meta.json`` into a checkpoint directory (before its atomic commit); return its path."""
    path = Path(checkpoint_dir) / CHECKPOINT_META_NAME
    path.write_text(json.dumps(meta.to_json(), indent=1, sort_keys=True), encoding="utf-8")
    return path


def read_checkpoint_meta(checkpoint_dir: str | os.PathLike[str]) -> CheckpointMeta | None:
    """A step directory's metadata, or ``None`` when it has no metadata file.

    Raises:
        ResumeError: The file exists but is not valid metadata (names the file and field).
    """
    path = Path(checkpoint_dir) / CHECKPOINT_META_NAME
    if not path.is_file():
        return None
    raw = load_json(path, lambda exc: ResumeError(f"{path}: checkpoint metadata is not valid JSON ({exc})"))
    if not isinstance(raw, dict) or raw.get("format") != CHECKPOINT_META_FORMAT:
        raise ResumeError(f"{path}: not a checkpoint metadata file (format {CHECKPOINT_META_FORMAT!r})")
    if raw.get("format_version") != CHECKPOINT_META_VERSION:
        raise ResumeError(
            f"{path}: unsupported format_version {raw.get('format_version')!r}; supported: [{CHECKPOINT_META_VERSION}]"
        )
    types = {"algorithm": str, "phase": str, "data_plane": str, "run_id": str, "step": int, "model_shape": dict}
    for key, typ in types.items():
        if not isinstance(raw.get(key), typ) or isinstance(raw.get(key), bool):
            raise ResumeError(f"{path}: field {key!r} must be a {typ.__name__}, got {raw.get(key)!r}")
    shape = raw["model_shape"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in shape.values()):
        raise ResumeError(f"{path}: field 'model_shape' must map names to ints, got {shape!r}")
    settings = raw.get("settings", {})
    if not isinstance(settings, dict) or not all(
        isinstance(v, (str, int, float, bool)) or v is None for v in settings.values()
    ):
        raise ResumeError(f"{path}: field 'settings' must map config keys to JSON scalars, got {settings!r}")
    return CheckpointMeta(
        **{key: raw[key] for key in types}, format_version=raw["format_version"], settings=dict(settings)
    )


def _config_key(meta_key: str) -> str:
    if meta_key.startswith("model_shape."):
        return f"policy.model.{meta_key.split('.', 1)[1]}"
    return {
        "algorithm": "algorithm",
        "data_plane": "data_plane",
        "phase": "the phase root's directory name",
        "architecture": "policy / policy.model_name_or_path: the model's config.json architectures",
    }.get(meta_key, meta_key)


def _shape_diff(ckpt: Mapping[str, int], run: Mapping[str, int]) -> dict[str, tuple[Any, Any]]:
    return {
        f"model_shape.{k}": (ckpt.get(k), run.get(k)) for k in sorted(set(ckpt) | set(run)) if ckpt.get(k) != run.get(k)
    }


def _mismatch(where: Path, key: str, differing: Mapping[str, tuple[Any, Any]], hint: str) -> CheckpointMismatchError:
    parts = [f"{k}: checkpoint {c!r}, this run {r!r} ({_config_key(k)})" for k, (c, r) in differing.items()]
    return CheckpointMismatchError(
        f"{key}: checkpoint {where} does not belong to this run; differing keys: "
        f"{sorted(differing)} -- " + "; ".join(parts) + f". {hint}",
        differing,
    )


def check_checkpoint_meta(
    meta: CheckpointMeta,
    *,
    where: str | os.PathLike[str],
    algorithm: str,
    phase: str,
    data_plane: str,
    model_shape: Mapping[str, int],
    settings: Mapping[str, Any] | None = None,
) -> None:
    """Refuse a checkpoint written for another algorithm, phase, backend, model or settings.

    A ``settings`` key (:func:`run_settings`) is compared only when both sides record it.

    Raises:
        CheckpointMismatchError: Naming every differing key, both values and the config key to change.
    """
    ours = {"algorithm": algorithm, "phase": phase, "data_plane": data_plane}
    differing = {key: (getattr(meta, key), value) for key, value in ours.items() if getattr(meta, key) != value}
    differing.update(_shape_diff(meta.model_shape, model_shape))
    for key, run_value in (settings or {}).items():
        if key in meta.settings and meta.settings[key] != run_value:
            differing[key] = (meta.settings[key], run_value)
    if differing:
        hint = "Resume with the settings the checkpoint was written with, or start a fresh run"
        if "algorithm" in differing or "phase" in differing:
            hint += f" (to start from its weights only, set {_INIT_KEY}={where})"
        raise _mismatch(Path(where), _RESUME_KEY, differing, hint + ".")


def _pickle_reason(path: Path) -> str | None:
    """Why ``path`` looks like a pickle (its name, its protocol header, or a zip archive holding
    one, as ``torch.save`` writes), else ``None``; only the zip's directory is read."""
    if path.suffix.lower() in _PICKLE_SUFFIXES:
        return f"its name ends in {path.suffix!r}"
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
    except OSError:
        return None
    if len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return f"it starts with a pickle protocol {head[1]} header"
    if head == b"PK":
        try:
            with zipfile.ZipFile(path) as archive:
                inner = [n for n in archive.namelist() if n.lower().endswith(_PICKLE_SUFFIXES)]
        except (OSError, zipfile.BadZipFile):
            return None
        if inner:
            return f"it is a zip archive holding the pickle {inner[0]!r}, as torch.save writes"
    return None


def refuse_pickles(step_dir: str | os.PathLike[str], key: str) -> None:
    """Refuse a checkpoint that holds a pickle anywhere (unpickling can run code), loading none of its files.

    Raises:
        ResumeError: Naming the first such file.
    """
    root = Path(step_dir)
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in sorted(filenames):
            path = Path(dirpath) / name
            reason = _pickle_reason(path)
            if reason is not None:
                raise ResumeError(
                    f"{key}: checkpoint file {path} is a pickle ({reason}); nemo_dp checkpoints "
                    "never hold one (older data-plane checkpoints held TransferQueue's own "
                    "controller_state.pkl and su_*.pkl, or the local and ray backends' tensors.pt) "
                    "and loading it could run code, so the checkpoint is refused and none of its "
                    "files was loaded"
                )


def check_checkpoint_dir(
    step_dir: str | os.PathLike[str], *, key: str, required_files: Sequence[str], verify_integrity: bool = True
) -> None:
    """The checks every loader of a step directory runs before reading it (resume, init, eval).

    ``verify_integrity`` verifies its manifest (sizes, SHA-256) if any.

    Raises:
        ResumeError: A required file is missing, or the checkpoint holds a pickle.
        nemo_dp.utils.manifest.CheckpointCorruptError: A file is missing, truncated or altered.
    """
    step_dir = Path(step_dir)
    missing = missing_files(step_dir, required_files)
    if missing:
        raise ResumeError(f"{key}: step directory {step_dir} is missing {missing}; it is not a complete checkpoint")
    if verify_integrity and has_manifest(step_dir):
        verify_manifest(step_dir)
    refuse_pickles(step_dir, key)


@dataclass(frozen=True)
class ResumePlan:
    """The one checkpoint (step directory) a run resumes from, and how the given ``source`` was read.

    ``run_dir`` is ``None`` when the checkpoints root is not ``<run>/<checkpoint_dir>``; ``meta`` is
    ``None`` for a checkpoint written before metadata existed; ``notes`` extend the log line.
    """

    source: Path
    source_kind: str
    checkpoints_root: Path
    run_dir: Path | None
    phase: str
    phase_index: int
    checkpoint: Path
    step: int
    meta: CheckpointMeta | None
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """The log line (``resume: checkpointing.resume_from=...``)."""
        who = f", written by run {self.meta.run_id}" if self.meta is not None else ""
        notes = "".join(f"; {n}" for n in self.notes)
        return (
            f"resume: {_RESUME_KEY}={self.source} ({self.source_kind}) -> phase {self.phase!r} "
            f"step {self.step} at {self.checkpoint}{who}{notes}"
        )

    def start_checkpoint(self, phase_name: str) -> Path | None:
        """:attr:`checkpoint` for the resumed phase, else ``None``."""
        return self.checkpoint if phase_name == self.phase else None


def resolve_resume(
    resume_from: str | os.PathLike[str],
    *,
    phase_names: Sequence[str],
    algorithm: str,
    data_plane: str,
    model_shape: Mapping[str, int],
    phase_algorithms: Mapping[str, str] | None = None,
    checkpoint_dir_name: str = "checkpoints",
    required_files: Sequence[str] = REQUIRED_FILES,
    verify_integrity: bool = True,
    phase_settings: Mapping[str, Mapping[str, Any]] | None = None,
) -> ResumePlan:
    """Resolve ``checkpointing.resume_from`` to one usable checkpoint of this run, or refuse.

    The latest phase (in run order) that has checkpoints is resumed, from its newest step
    directory; a newest step directory that is incomplete is refused rather than skipped.

    ``resume_from`` is a run directory, its checkpoints root, a phase root or a step directory;
    ``phase_names`` are in run order; ``phase_algorithms`` default to ``sft`` for ``warm_start``, else
    ``algorithm``.

    Raises:
        ValueError: ``phase_names`` is empty.
        ResumeError: Nothing usable for this run's phases was found (the message says what was).
        CheckpointMismatchError: The checkpoint's metadata differs from this run.
        nemo_dp.utils.manifest.CheckpointCorruptError: A checkpoint file is damaged (by path).
    """
    if not phase_names:
        raise ValueError("resolve_resume: phase_names must not be empty")
    algos = (
        dict(phase_algorithms)
        if phase_algorithms is not None
        else {p: ("sft" if p == WARM_START_PHASE else algorithm) for p in phase_names}
    )
    key = _RESUME_KEY
    loc = locate_checkpoint(resume_from, key, checkpoint_dir_name)
    notes: list[str] = []
    if loc.step_dir is not None:
        step_dir = loc.step_dir
        meta, phase = _checked_meta(step_dir, key, required_files, verify_integrity)
        step = step_of(step_dir)
        if phase not in phase_names:
            raise _foreign_phase(key, step_dir, [phase], phase_names, algorithm)
    else:
        ours = [p for p in phase_names if p in loc.phase_roots]
        if not ours:
            raise _foreign_phase(key, loc.checkpoints_root, sorted(loc.phase_roots), phase_names, algorithm)
        phase = ours[-1]
        ignored = sorted(set(loc.phase_roots) - set(phase_names))
        if ignored:
            notes.append(f"ignored checkpoints of other phases {ignored}")
        step, step_dir = newest_usable_step(loc.phase_roots[phase], key, required_files)
        meta, _ = _checked_meta(step_dir, key, required_files, verify_integrity)
    if meta is None:
        notes.append(
            f"no {CHECKPOINT_META_NAME} (written before checkpoint metadata existed): algorithm, "
            "model shape and data plane not checked"
        )
    else:
        check_checkpoint_meta(
            meta,
            where=step_dir,
            algorithm=algos[phase],
            phase=phase,
            data_plane=data_plane,
            model_shape=model_shape,
            settings=(phase_settings or {}).get(phase),
        )
    index = list(phase_names).index(phase)
    if index > 0:
        notes.append(f"skipping finished phase(s) {list(phase_names[:index])}")
    return ResumePlan(
        source=Path(os.path.abspath(os.fspath(resume_from))),
        source_kind=loc.kind,
        checkpoints_root=loc.checkpoints_root,
        run_dir=loc.run_dir,
        phase=phase,
        phase_index=index,
        checkpoint=step_dir,
        step=step,
        meta=meta,
        notes=tuple(notes),
    )


def _checked_meta(
    step_dir: Path, key: str, required: Sequence[str], verify_integrity: bool
) -> tuple[CheckpointMeta | None, str]:
    """:func:`check_checkpoint_dir`, then the metadata and the phase (the parent's name without it)."""
    check_checkpoint_dir(step_dir, key=key, required_files=required, verify_integrity=verify_integrity)
    meta = read_checkpoint_meta(step_dir)
    return meta, meta.phase if meta is not None else step_dir.parent.name


def _foreign_phase(
    key: str, where: Path, found: Sequence[str], phase_names: Sequence[str], algorithm: str
) -> ResumeError:
    hint = ""
    if algorithm in ("grpo", "ppo"):
        hint = (
            f"; to start this {algorithm.upper()} run from those weights set {_INIT_KEY}={where} and leave {key} unset"
        )
    return ResumeError(
        f"{key}: {where} holds checkpoints of phase(s) {list(found)} only; this "
        f"{algorithm} run's phases are {list(phase_names)} - nothing of this run to resume{hint}"
    )


@dataclass(frozen=True)
class InitFromPlan:
    """Where the initial policy weights of a fresh run come from (``policy.init_from``).

    ``weights`` is their location inside the step directory ``checkpoint`` (``checkpoint`` itself
    when the format keeps them in its state file); ``meta`` is ``None`` for an older checkpoint.
    """

    source: Path
    checkpoint: Path
    phase: str
    step: int
    weights: Path
    meta: CheckpointMeta | None

    def describe(self) -> str:
        """The log line (``init_from: policy.init_from=...``)."""
        algo = f" ({self.meta.algorithm}, run {self.meta.run_id})" if self.meta is not None else ""
        return (
            f"init_from: {_INIT_KEY}={self.source} -> policy weights of phase {self.phase!r}"
            f"{algo} step {self.step} at {self.weights}"
        )


def resolve_init_from(
    init_from: str | os.PathLike[str],
    *,
    model_shape: Mapping[str, int],
    checkpoint_dir_name: str = "checkpoints",
    required_files: Sequence[str] = REQUIRED_FILES,
    weights_subdir: str | None = None,
    verify_integrity: bool = True,
) -> InitFromPlan:
    """Resolve ``policy.init_from`` (any form ``resume_from`` takes) to the policy weights of one checkpoint.

    Several phases resolve to the one that is not ``warm_start``; more than one such is refused.

    ``model_shape`` must equal the checkpoint's; ``weights_subdir`` is the step directory's
    sub-directory holding the policy weights (``None``: they live in the state file).

    Raises:
        ResumeError: No usable checkpoint, an ambiguous choice of phase, or no weights there.
        CheckpointMismatchError: The model shape differs (naming the keys).
        nemo_dp.utils.manifest.CheckpointCorruptError: A checkpoint file is damaged (by path).
    """
    key = _INIT_KEY
    loc = locate_checkpoint(init_from, key, checkpoint_dir_name)
    if loc.step_dir is not None:
        step_dir = loc.step_dir
        step = step_of(step_dir)
    else:
        finals = [p for p in loc.phase_roots if p != WARM_START_PHASE]
        if len(finals) > 1:
            raise ResumeError(
                f"{key}: {loc.checkpoints_root} holds checkpoints of several phases {sorted(finals)}; "
                f"pass one phase root, e.g. {key}={loc.phase_roots[sorted(finals)[0]]}"
            )
        phase_name = finals[0] if finals else WARM_START_PHASE
        step, step_dir = newest_usable_step(loc.phase_roots[phase_name], key, required_files)
    meta, phase = _checked_meta(step_dir, key, required_files, verify_integrity)
    if meta is not None:
        differing = _shape_diff(meta.model_shape, model_shape)
        if differing:
            raise _mismatch(
                step_dir, key, differing, "policy.model must match the checkpoint whose weights are loaded."
            )
    weights = step_dir if weights_subdir is None else step_dir / weights_subdir
    if not weights.is_dir():
        raise ResumeError(f"{key}: checkpoint {step_dir} has no policy weights directory {weights_subdir!r}")
    return InitFromPlan(
        source=Path(os.path.abspath(os.fspath(init_from))),
        checkpoint=step_dir,
        phase=phase,
        step=step,
        weights=weights,
        meta=meta,
    )
