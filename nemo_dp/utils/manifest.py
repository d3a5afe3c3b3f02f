"""File manifests (sizes and SHA-256, ``file_manifest.json``) that make a checkpoint's integrity checkable: a
writer calls :func:`write_manifest` last, a loader :func:`verify_manifest` first."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_dp.utils.json_files import load_json

__all__ = [
    "FILE_MANIFEST_NAME",
    "FILE_MANIFEST_FORMAT",
    "FILE_MANIFEST_VERSION",
    "CheckpointCorruptError",
    "ManifestReport",
    "build_manifest",
    "write_manifest",
    "read_file_manifest",
    "verify_manifest",
    "has_manifest",
]

FILE_MANIFEST_NAME = "file_manifest.json"
FILE_MANIFEST_FORMAT = "nemo_dp.file_manifest"
FILE_MANIFEST_VERSION = 1
_CHUNK = 1 << 20
_TMP_PREFIX = f".{FILE_MANIFEST_NAME}.tmp-"


class CheckpointCorruptError(ValueError):
    """A checkpoint file (``path``) is missing, truncated or altered, or the manifest itself is unusable.

    ``reason``: ``missing``, ``truncated``, ``grown``, ``altered``, ``unexpected``, ``no_manifest`` or ``bad_manifest``.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str, message: str) -> None:
        super().__init__(message)
        self.path = Path(path)
        self.reason = reason


@dataclass
class ManifestReport:
    """What :func:`verify_manifest` checked (``extra_files``: present but not listed)."""

    directory: Path
    files: int
    total_bytes: int
    extra_files: list[str] = field(default_factory=list)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _payload_files(directory: Path) -> list[str]:
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
        base = Path(dirpath)
        for name in list(dirnames):
            if (base / name).is_symlink():
                raise ValueError(
                    f"{base / name}: symbolic link in a checkpoint; a file manifest covers regular files only"
                )
        for name in filenames:
            path = base / name
            rel = path.relative_to(directory).as_posix()
            if rel == FILE_MANIFEST_NAME or rel.startswith(_TMP_PREFIX):
                continue
            if path.is_symlink() or not path.is_file():
                raise ValueError(f"{path}: not a regular file; a file manifest covers regular files only")
            out.append(rel)
    return sorted(out)


def build_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"format", "format_version", "hash": "sha256", "files": {relpath: {"size", "sha256"}}}`` of a directory.

    Raises:
        NotADirectoryError: ``directory`` is not a directory.
        ValueError: It holds a symbolic link or a special file.
    """
    root = Path(directory)
    if not root.is_dir():
        raise NotADirectoryError(f"build_manifest: {str(root)!r} is not a directory")
    files = {rel: {"size": (root / rel).stat().st_size, "sha256": _sha256(root / rel)} for rel in _payload_files(root)}
    return {"format": FILE_MANIFEST_FORMAT, "format_version": FILE_MANIFEST_VERSION, "hash": "sha256", "files": files}


def write_manifest(directory: str | os.PathLike[str]) -> Path:
    """Write ``file_manifest.json`` covering every file now in ``directory``; return its path.

    Written through a temp file, ``fsync`` and ``os.replace``: a crash leaves no manifest or a complete one.
    Raises like :func:`build_manifest` (then nothing is written).
    """
    root = Path(directory)
    manifest = build_manifest(root)
    final = root / FILE_MANIFEST_NAME
    tmp = root / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def has_manifest(directory: str | os.PathLike[str]) -> bool:
    """Whether ``file_manifest.json`` exists in ``directory``."""
    return (Path(directory) / FILE_MANIFEST_NAME).is_file()


def _bad(path: Path, message: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(path, "bad_manifest", f"checkpoint file manifest {path}: {message}")


def read_file_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and structurally check ``directory``'s file manifest (``CheckpointCorruptError`` if missing or bad)."""
    path = Path(directory) / FILE_MANIFEST_NAME
    if not path.is_file():
        raise CheckpointCorruptError(
            path,
            "no_manifest",
            f"checkpoint {Path(directory)} has no {FILE_MANIFEST_NAME}: it was written without a "
            "file manifest or the copy is incomplete",
        )
    manifest = load_json(path, lambda exc: _bad(path, f"not valid JSON ({exc}); the file is truncated or overwritten"))
    if not isinstance(manifest, dict):
        raise _bad(path, f"expected a JSON object, got {type(manifest).__name__}")
    if manifest.get("format") != FILE_MANIFEST_FORMAT:
        raise _bad(path, f"format {manifest.get('format')!r}, expected {FILE_MANIFEST_FORMAT!r}")
    if manifest.get("format_version") != FILE_MANIFEST_VERSION:
        raise _bad(
            path, f"unsupported format_version {manifest.get('format_version')!r}; supported: [{FILE_MANIFEST_VERSION}]"
        )
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise _bad(path, "'files' must be an object of {relative path: {size, sha256}}")
    for rel, entry in files.items():
        ok = (
            isinstance(entry, dict)
            and isinstance(entry.get("size"), int)
            and not isinstance(entry.get("size"), bool)
            and entry["size"] >= 0
            and isinstance(entry.get("sha256"), str)
            and len(entry["sha256"]) == 64
        )
        if not ok:
            raise _bad(path, f"entry {rel!r} needs an int 'size' >= 0 and a 64-hex 'sha256'")
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or not parts:
            raise _bad(path, f"entry {rel!r} is not a relative path inside the checkpoint")
    return manifest


def verify_manifest(
    directory: str | os.PathLike[str], *, check_hashes: bool = True, strict: bool = False
) -> ManifestReport:
    """Check every file listed in ``directory``'s manifest against its size and (``check_hashes``) checksum.

    Raises:
        CheckpointCorruptError: Naming the first file (sorted) that is ``missing``, ``truncated``,
            ``grown``, ``altered`` or (``strict``) not listed (``unexpected``); or see :func:`read_file_manifest`.
    """
    root = Path(directory)
    manifest = read_file_manifest(root)
    files: dict[str, dict[str, Any]] = manifest["files"]
    total = 0
    for rel in sorted(files):
        entry = files[rel]
        path = root / rel
        if not path.is_file():
            raise CheckpointCorruptError(
                path, "missing", f"checkpoint file {path} is missing (listed in {FILE_MANIFEST_NAME})"
            )
        size = path.stat().st_size
        if size != entry["size"]:
            reason = "truncated" if size < entry["size"] else "grown"
            raise CheckpointCorruptError(
                path,
                reason,
                f"checkpoint file {path} is {reason}: {size} bytes, the manifest records {entry['size']} bytes",
            )
        if check_hashes and _sha256(path) != entry["sha256"]:
            raise CheckpointCorruptError(
                path,
                "altered",
                f"checkpoint file {path} is altered: its SHA-256 differs from the manifest's "
                f"(size {size} bytes unchanged; zeroed or overwritten content)",
            )
        total += size
    extra = [rel for rel in _payload_files(root) if rel not in files]
    if strict and extra:
        path = root / extra[0]
        raise CheckpointCorruptError(
            path,
            "unexpected",
            f"checkpoint file {path} is not listed in {FILE_MANIFEST_NAME} "
            f"({len(extra)} unlisted file(s): {extra[:5]})",
        )
    return ManifestReport(directory=root, files=len(files), total_bytes=total, extra_files=extra)
