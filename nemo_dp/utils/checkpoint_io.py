"""Atomic checkpoint directories and versioned manifests, shared by every checkpoint writer.

Contract tests patch ``_verify_written`` and ``os.replace`` (looked up at call time).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import uuid
from collections.abc import Callable, Collection, Mapping
from os import PathLike
from pathlib import Path
from typing import Any

from nemo_dp.utils.json_files import load_json

__all__ = [
    "MANIFEST_NAME",
    "check_json_value",
    "validate_json_metadata",
    "write_checkpoint_atomically",
    "write_manifest",
    "read_manifest",
    "resolve_checkpoint_dir",
]

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
_TMP_INFIX = ".tmp-"
_OLD_INFIX = ".old-"


def check_json_value(value: Any, where: str, *, finite: bool = True) -> None:
    """Check that ``value`` (at ``where``, named in errors) is str-keyed mappings, lists, tuples and scalars.

    Raises:
        TypeError: A non-str key or a value of another type.
        ValueError: ``finite`` and a non-finite float.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if finite and not math.isfinite(value):
            raise ValueError(f"{where}: non-finite float {value!r} is not valid JSON")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_json_value(item, f"{where}[{i}]", finite=finite)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: key {key!r} is a {type(key).__name__}, JSON needs str")
            check_json_value(item, f"{where}[{key!r}]", finite=finite)
        return
    raise TypeError(f"{where}: value of type {type(value).__name__} is not JSON-serialisable")


def validate_json_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check user checkpoint metadata (``None`` = ``{}``) like :func:`check_json_value`; return a JSON copy.

    Raises:
        TypeError, ValueError: As :func:`check_json_value`; ``TypeError`` also for a non-mapping.
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"checkpoint metadata must be a mapping of JSON values, got {type(metadata).__name__}")
    check_json_value(metadata, "checkpoint metadata")
    return json.loads(json.dumps(metadata))


def _absolute(checkpoint_dir: str | PathLike[str]) -> Path:
    if not isinstance(checkpoint_dir, (str, PathLike)):
        raise TypeError(f"checkpoint_dir must be a str or PathLike, got {type(checkpoint_dir).__name__}")
    path = Path(os.path.abspath(os.fspath(checkpoint_dir)))
    if path.name in ("", ".", ".."):
        raise ValueError(f"checkpoint_dir {str(checkpoint_dir)!r} does not name a directory")
    return path


def _verify_written(tmp_dir: Path) -> None:
    """Refuse to commit a checkpoint whose writer produced no manifest."""
    manifest = tmp_dir / MANIFEST_NAME
    if not manifest.is_file():
        raise RuntimeError(f"checkpoint writer did not create {MANIFEST_NAME} in {str(tmp_dir)!r}; not committing")


def _fsync_path(path: Path, *, directory: bool) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # pragma: no cover - some filesystems refuse opening directories
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - fsync unsupported (e.g. some network filesystems)
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            _fsync_path(Path(dirpath) / name, directory=False)
        _fsync_path(Path(dirpath), directory=True)


def write_checkpoint_atomically(checkpoint_dir: str | PathLike[str], write_fn: Callable[[Path], None]) -> Path:
    """Write a checkpoint directory (parents created) through a temp sibling and two renames; return its path.

    ``write_fn`` fills ``<dir>.tmp-<random>``, ``manifest.json`` included; after fsync an existing
    ``<dir>`` is renamed to ``<dir>.old-<random>``, the temp dir renamed into place (the old one
    restored if that fails) and the old one removed, so a crash leaves the previous checkpoint loadable.

    Raises:
        NotADirectoryError: ``checkpoint_dir`` exists and is not a directory (nothing written).
        RuntimeError: ``write_fn`` wrote no ``manifest.json`` (nothing committed).
        Exception: Whatever ``write_fn`` or the file system raised (temp dir removed, previous one intact).
    """
    final = _absolute(checkpoint_dir)
    if final.exists() and not final.is_dir():
        raise NotADirectoryError(f"checkpoint_dir {str(final)!r} exists and is not a directory")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f"{final.name}{_TMP_INFIX}{uuid.uuid4().hex}"
    tmp.mkdir()
    old: Path | None = None
    try:
        write_fn(tmp)
        _verify_written(tmp)
        _fsync_tree(tmp)
        if final.exists():
            old = final.parent / f"{final.name}{_OLD_INFIX}{uuid.uuid4().hex}"
            os.replace(final, old)
        try:
            os.replace(tmp, final)
        except BaseException:
            if old is not None:
                os.replace(old, final)
                old = None
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_path(final.parent, directory=True)
    if old is not None:
        try:
            shutil.rmtree(old)
        except OSError as exc:  # the new checkpoint is committed; a leftover is only clutter
            logger.warning("could not remove previous checkpoint %s: %s", old, exc)
    return final


def write_manifest(directory: str | PathLike[str], manifest: Mapping[str, Any]) -> Path:
    """Write ``manifest.json``, with at least ``"format"`` (str) and ``"format_version"`` (int); return its path.

    Raises:
        ValueError: ``format``/``format_version`` missing or of the wrong type.
        TypeError: The manifest is not JSON-serialisable.
    """
    fmt = manifest.get("format") if isinstance(manifest, Mapping) else None
    version = manifest.get("format_version") if isinstance(manifest, Mapping) else None
    if not isinstance(fmt, str) or not fmt:
        raise ValueError(f"manifest needs a non-empty str 'format', got {fmt!r}")
    if not _is_int_version(version):
        raise ValueError(f"manifest needs an int 'format_version', got {version!r}")
    path = Path(os.fspath(directory)) / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=1, sort_keys=False), encoding="utf-8")
    return path


def resolve_checkpoint_dir(checkpoint_dir: str | PathLike[str]) -> Path:
    """The absolute path of an existing checkpoint directory (``FileNotFoundError`` naming any ``<dir>.old-*``
    an interrupted commit left)."""
    path = _absolute(checkpoint_dir)
    if path.is_dir():
        return path
    if path.exists():
        raise FileNotFoundError(f"checkpoint path {str(path)!r} is not a directory")
    survivors: list[str] = []
    if path.parent.is_dir():
        prefix = f"{path.name}{_OLD_INFIX}"
        survivors = sorted(str(p) for p in path.parent.iterdir() if p.name.startswith(prefix) and p.is_dir())
    if survivors:
        raise FileNotFoundError(
            f"checkpoint directory {str(path)!r} does not exist, but a previous checkpoint "
            f"survives as {', '.join(repr(s) for s in survivors)} (a save was interrupted "
            f"between its two renames); rename it back to {str(path)!r} to load it"
        )
    raise FileNotFoundError(f"checkpoint directory {str(path)!r} does not exist")


def _is_int_version(version: Any) -> bool:
    return isinstance(version, int) and not isinstance(version, bool)


def read_manifest(
    checkpoint_dir: str | PathLike[str], *, expected_format: str, supported_versions: Collection[int]
) -> dict[str, Any]:
    """Read ``<checkpoint_dir>/manifest.json``, checking ``"format"`` and ``"format_version"``.

    Raises:
        FileNotFoundError: Directory or manifest missing (see ``resolve_checkpoint_dir``).
        ValueError: The manifest is no JSON object, or of another format or version.
    """
    path = resolve_checkpoint_dir(checkpoint_dir) / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint manifest {str(path)!r} does not exist")
    manifest = load_json(path, lambda exc: ValueError(f"checkpoint manifest {str(path)!r} is corrupt: {exc}"))
    if not isinstance(manifest, dict):
        raise ValueError(
            f"checkpoint manifest {str(path)!r} is corrupt: expected a JSON object, got {type(manifest).__name__}"
        )
    fmt = manifest.get("format")
    version = manifest.get("format_version")
    if fmt != expected_format:
        raise ValueError(
            f"checkpoint manifest {str(path)!r} has format {fmt!r} (format_version {version!r}), "
            f"expected format {expected_format!r}"
        )
    if not (_is_int_version(version) and version in supported_versions):
        raise ValueError(
            f"checkpoint manifest {str(path)!r} has unsupported format_version {version!r} "
            f"for format {fmt!r}; supported: {sorted(supported_versions)}"
        )
    return manifest
