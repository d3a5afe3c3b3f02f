"""Atomic checkpoint directories and versioned manifests, shared by every checkpoint writer.

``write_checkpoint_atomically`` fills a temp sibling, then renames it into place, so a crash
mid-save leaves the previous checkpoint loadable and ``*.tmp-*`` leftovers are never read.
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


# --- metadata ---


def check_json_value(value: Any, where: str, *, finite: bool = True) -> None:
    """Check that ``value`` is JSON-like: str-keyed mappings, lists, tuples and scalars.

    ``where`` names its position in the message; ``finite`` refuses non-finite floats.

    Raises:
        TypeError: A non-str key or a value of another type (named by ``where``).
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
    """Check user checkpoint metadata (``None`` = ``{}``); return ``json.loads(json.dumps(metadata))``.

    Raises:
        TypeError: ``metadata`` is not a mapping, or holds a non-str key or a non-JSON value.
        ValueError: It holds a non-finite float.
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(
            f"checkpoint metadata must be a mapping of JSON values, got {type(metadata).__name__}"
        )
    check_json_value(metadata, "checkpoint metadata")
    return json.loads(json.dumps(metadata))


# --- atomic directory write ---


def _absolute(checkpoint_dir: str | PathLike[str]) -> Path:
    if not isinstance(checkpoint_dir, (str, PathLike)):
        raise TypeError(
            f"checkpoint_dir must be a str or PathLike, got {type(checkpoint_dir).__name__}"
        )
    path = Path(os.path.abspath(os.fspath(checkpoint_dir)))
    if path.name in ("", ".", ".."):
        raise ValueError(f"checkpoint_dir {str(checkpoint_dir)!r} does not name a directory")
    return path


def _verify_written(tmp_dir: Path) -> None:
    """Refuse to commit a checkpoint whose writer produced no manifest."""
    manifest = tmp_dir / MANIFEST_NAME
    if not manifest.is_file():
        raise RuntimeError(
            f"checkpoint writer did not create {MANIFEST_NAME} in {str(tmp_dir)!r}; not committing"
        )


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
    """Flush every file and directory under ``root`` so the rename commits durable content."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            _fsync_path(Path(dirpath) / name, directory=False)
        _fsync_path(Path(dirpath), directory=True)


def write_checkpoint_atomically(
    checkpoint_dir: str | PathLike[str], write_fn: Callable[[Path], None]
) -> Path:
    """Write a checkpoint directory through a temp sibling and two renames.

    ``write_fn`` fills ``<dir>.tmp-<random>``; after fsync an existing ``<dir>`` is renamed to
    ``<dir>.old-<random>``, the temp dir renamed into place (the old one restored if that fails)
    and the old one removed.

    Args:
        checkpoint_dir: Final directory; its missing parents are created.
        write_fn: Called once with the empty temp directory; must write every file there,
            including ``manifest.json`` (see ``write_manifest``).

    Returns:
        The absolute final checkpoint path.

    Raises:
        NotADirectoryError: ``checkpoint_dir`` exists and is not a directory (nothing written).
        RuntimeError: ``write_fn`` wrote no ``manifest.json`` (nothing committed).
        Exception: Whatever ``write_fn`` or the file system raised; the temp dir has then been
            removed and a previous ``checkpoint_dir`` is intact.
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


# --- manifests ---


def write_manifest(directory: str | PathLike[str], manifest: Mapping[str, Any]) -> Path:
    """Write ``manifest.json`` into the (temp) checkpoint directory being written; return its path.

    ``manifest`` holds at least ``"format"`` (str) and ``"format_version"`` (int).

    Raises:
        ValueError: ``format``/``format_version`` missing or of the wrong type.
        TypeError: The manifest is not JSON-serialisable.
    """
    fmt = manifest.get("format") if isinstance(manifest, Mapping) else None
    version = manifest.get("format_version") if isinstance(manifest, Mapping) else None
    if not isinstance(fmt, str) or not fmt:
        raise ValueError(f"manifest needs a non-empty str 'format', got {fmt!r}")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(f"manifest needs an int 'format_version', got {version!r}")
    path = Path(os.fspath(directory)) / MANIFEST_NAME
    text = json.dumps(manifest, indent=1, sort_keys=False)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


def resolve_checkpoint_dir(checkpoint_dir: str | PathLike[str]) -> Path:
    """The absolute path of an existing checkpoint directory, or explain why it is not there.

    Raises:
        FileNotFoundError: The directory is missing (naming any surviving ``<dir>.old-*``, which
            is what a crash between the two commit renames leaves) or is not a directory.
    """
    path = _absolute(checkpoint_dir)
    if path.is_dir():
        return path
    if path.exists():
        raise FileNotFoundError(f"checkpoint path {str(path)!r} is not a directory")
    survivors: list[str] = []
    if path.parent.is_dir():
        prefix = f"{path.name}{_OLD_INFIX}"
        survivors = sorted(
            str(p) for p in path.parent.iterdir() if p.name.startswith(prefix) and p.is_dir()
        )
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
    checkpoint_dir: str | PathLike[str],
    *,
    expected_format: str,
    supported_versions: Collection[int],
) -> dict[str, Any]:
    """Read ``<checkpoint_dir>/manifest.json``, checking ``"format"`` and ``"format_version"``.

    Raises:
        FileNotFoundError: Directory or manifest missing (see ``resolve_checkpoint_dir``).
        ValueError: The manifest is not a JSON object, or its format name or version is not the
            expected one; the message names the file (and the version).
    """
    path = resolve_checkpoint_dir(checkpoint_dir) / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint manifest {str(path)!r} does not exist")
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"checkpoint manifest {str(path)!r} is corrupt: {exc}") from exc
    if not isinstance(manifest, dict):
        raise ValueError(
            f"checkpoint manifest {str(path)!r} is corrupt: expected a JSON object, "
            f"got {type(manifest).__name__}"
        )
    fmt = manifest.get("format")
    version = manifest.get("format_version")
    if fmt != expected_format:
        raise ValueError(
            f"checkpoint manifest {str(path)!r} has format {fmt!r} (format_version {version!r}), "
            f"expected format {expected_format!r}"
        )
    known = _is_int_version(version) and version in supported_versions
    if not known:
        raise ValueError(
            f"checkpoint manifest {str(path)!r} has unsupported format_version {version!r} "
            f"for format {fmt!r}; supported: {sorted(supported_versions)}"
        )
    return manifest
