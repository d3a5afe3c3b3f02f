"""Atomic, code-free training checkpoints (model, optimizer, RNG, loader cursor, counters).

Tensors go to ``tensors.safetensors``, everything else to typed ``state.json``, and a ``"pretrained"``
mapping under key ``K`` becomes the directory ``<checkpoint>/K/``.  Nothing is ever unpickled.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nemo_dp.utils.checkpoint_io import read_manifest, write_checkpoint_atomically, write_manifest
from nemo_dp.utils.json_files import load_json
from nemo_dp.utils.manifest import has_manifest, verify_manifest

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_FORMAT_VERSION",
    "STATE_FILE",
    "STEP_DIR",
    "STATE_JSON",
    "TENSORS_FILE",
    "PRETRAINED_KEY",
    "REQUIRED_FILES",
    "checkpoint_dir_for_step",
    "encode_state",
    "write_training_state",
    "checkpoint_manifest",
    "save_training_checkpoint",
    "load_training_checkpoint",
]

CHECKPOINT_FORMAT = "nemo_dp.training_checkpoint"
CHECKPOINT_FORMAT_VERSION = 2
#: Pickled state of format_version 1 (refused unread).
STATE_FILE = "state.pt"
STATE_JSON = "state.json"
TENSORS_FILE = "tensors.safetensors"
PRETRAINED_KEY = "pretrained"
REQUIRED_FILES: tuple[str, ...] = ("manifest.json", STATE_JSON, TENSORS_FILE)
#: Name of a step directory (:func:`checkpoint_dir_for_step`); group 1 is the step.
STEP_DIR = re.compile(r"^step_(\d+)$")
_TAG = "__nemo_dp__"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def checkpoint_dir_for_step(root: str | os.PathLike[str], step: int) -> Path:
    """``root / f"step_{step:08d}"`` (``ValueError`` for a negative ``step``)."""
    if step < 0:
        raise ValueError(f"checkpoint_dir_for_step: step must be >= 0, got {step}")
    return Path(root) / f"step_{step:08d}"


class _Encoder:
    """Splits a state tree into JSON, a tensor table and pretrained file trees."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.file_trees: dict[str, dict[str, bytes]] = {}

    def encode(self, value: Any, path: tuple[str, ...]) -> Any:
        where = "state" + "".join(f"[{p!r}]" for p in path)
        if value is None or isinstance(value, (bool, str, int)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {_TAG: "float", "v": repr(value)}
        if isinstance(value, torch.Tensor):
            key = f"t{len(self.tensors)}"
            self.tensors[key] = value.detach().to("cpu").contiguous().clone()
            return {_TAG: "tensor", "key": key}
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biuf":
                raise TypeError(f"{where}: NumPy array of dtype {value.dtype} cannot be checkpointed")
            data = [self.encode(x, path) for x in value.reshape(-1).tolist()]
            return {_TAG: "ndarray", "dtype": value.dtype.str, "shape": list(value.shape), "data": data}
        if isinstance(value, np.generic):
            return {_TAG: "npscalar", "dtype": value.dtype.str, "v": self.encode(value.item(), path)}
        if isinstance(value, bytes):
            return {_TAG: "bytes", "v": base64.b64encode(value).decode("ascii")}
        if isinstance(value, tuple):
            return {_TAG: "tuple", "items": [self.encode(v, (*path, str(i))) for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [self.encode(v, (*path, str(i))) for i, v in enumerate(value)]
        if isinstance(value, Mapping):
            if path and path[-1] == PRETRAINED_KEY and all(isinstance(v, bytes) for v in value.values()):
                return self._file_tree(value, path, where)
            if all(isinstance(k, str) for k in value) and _TAG not in value:
                return {k: self.encode(v, (*path, k)) for k, v in value.items()}
            items = []
            for k, v in value.items():
                if not isinstance(k, (str, int, bool)) and k is not None:
                    raise TypeError(f"{where}: dict key {k!r} of type {type(k).__name__} cannot be checkpointed")
                items.append([k, self.encode(v, (*path, str(k)))])
            return {_TAG: "dict", "items": items}
        raise TypeError(f"{where}: value of type {type(value).__name__} cannot be checkpointed")

    def _file_tree(self, files: Mapping[str, bytes], path: tuple[str, ...], where: str) -> dict[str, Any]:
        top = path[0] if len(path) > 1 else None
        if top is None or not _SAFE_NAME.match(top) or top in (STATE_JSON, TENSORS_FILE, "manifest.json"):
            raise ValueError(f"{where}: a pretrained file tree needs a plain top-level key, got {path!r}")
        if top in self.file_trees:
            raise ValueError(f"{where}: a second pretrained file tree under top-level key {top!r}")
        for name in files:
            if not isinstance(name, str) or not _SAFE_NAME.match(name):
                raise ValueError(f"{where}: pretrained file name {name!r} is not a plain file name")
        self.file_trees[top] = dict(files)
        return {_TAG: "files", "dir": top, "names": sorted(files)}


def _decode(value: Any, tensors: Mapping[str, torch.Tensor], base: Path) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors, base) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(_TAG)
    if tag is None:
        return {k: _decode(v, tensors, base) for k, v in value.items()}
    if tag == "float":
        return float(value["v"])
    if tag == "tensor":
        return tensors[value["key"]]
    if tag == "ndarray":
        flat = [_decode(x, tensors, base) for x in value["data"]]
        return np.array(flat, dtype=np.dtype(value["dtype"])).reshape(value["shape"])
    if tag == "npscalar":
        return np.dtype(value["dtype"]).type(_decode(value["v"], tensors, base))
    if tag == "bytes":
        return base64.b64decode(value["v"])
    if tag == "tuple":
        return tuple(_decode(v, tensors, base) for v in value["items"])
    if tag == "dict":
        return {k: _decode(v, tensors, base) for k, v in value["items"]}
    if tag == "files":
        directory = base / value["dir"]
        return {name: (directory / name).read_bytes() for name in value["names"]}
    raise ValueError(f"load_training_checkpoint: {base / STATE_JSON} has an unknown tag {tag!r}")


def encode_state(state: Mapping[str, Any]) -> tuple[Any, dict[str, torch.Tensor], dict[str, dict[str, bytes]]]:
    """Split ``state`` into ``(json_tree, tensors, file_trees)`` (no I/O).

    Raises:
        TypeError: A value that cannot be stored without code (naming its path).
        ValueError: A malformed pretrained file tree.
    """
    enc = _Encoder()
    tree = enc.encode(state, ())
    return tree, enc.tensors, enc.file_trees


def write_training_state(directory: str | os.PathLike[str], state: Mapping[str, Any]) -> list[str]:
    """Write ``state``'s files (not the manifest; nothing if it cannot be stored); return the top-level names."""
    from safetensors.torch import save_file

    tree, tensors, trees = encode_state(state)
    base = Path(directory)
    save_file(tensors, str(base / TENSORS_FILE), metadata={"format": "pt"})
    for top, files in trees.items():
        (base / top).mkdir()
        for name, data in files.items():
            (base / top / name).write_bytes(data)
    (base / STATE_JSON).write_text(json.dumps(tree, allow_nan=False), encoding="utf-8")
    return sorted([STATE_JSON, TENSORS_FILE, *trees])


def checkpoint_manifest(state: Mapping[str, Any], files: list[str], **extra: Any) -> dict[str, Any]:
    """The manifest: ``format``, ``format_version``, ``state``'s ``keys``, ``files`` (as written) and ``extra``."""
    head = {"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_FORMAT_VERSION}
    return {**head, "keys": sorted(str(k) for k in state), "files": files, **extra}


def save_training_checkpoint(
    checkpoint_dir: str | os.PathLike[str], state: dict[str, Any], *, finalize: Callable[[Path], None] | None = None
) -> Path:
    """Atomically write ``state`` to ``checkpoint_dir``; return its absolute path.

    ``finalize(tmp_dir)`` runs after every file is written and before the commit rename.

    Raises:
        TypeError: ``state`` is not a dict or holds a value that cannot be stored (nothing written).
        Exception: Whatever the file system raised; the previous checkpoint is then intact.
    """
    if not isinstance(state, dict):
        raise TypeError(f"save_training_checkpoint: state must be a dict, got {type(state).__name__}")
    encode_state(state)  # refuse before touching the disk

    def write(tmp: Path) -> None:
        write_manifest(tmp, checkpoint_manifest(state, write_training_state(tmp, state)))
        if finalize is not None:
            finalize(tmp)

    return write_checkpoint_atomically(checkpoint_dir, write)


def load_training_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_training_checkpoint` (tensors on CPU).

    Raises:
        FileNotFoundError: The directory, its manifest or its state files are missing.
        ValueError: Another format or version (a version-1 pickle is refused unread), or a corrupt file.
        nemo_dp.utils.manifest.CheckpointCorruptError: A file of its file manifest is missing,
            truncated or altered (checked before reading).
    """
    if has_manifest(checkpoint_dir):
        verify_manifest(checkpoint_dir)
    manifest = read_manifest(
        checkpoint_dir, expected_format=CHECKPOINT_FORMAT, supported_versions=(1, CHECKPOINT_FORMAT_VERSION)
    )
    base = Path(checkpoint_dir)
    if manifest["format_version"] != CHECKPOINT_FORMAT_VERSION:
        raise ValueError(
            f"load_training_checkpoint: {base / 'manifest.json'} has format_version "
            f"{manifest['format_version']}, an older format that is no longer supported: its state "
            f"is {base / STATE_FILE}, a pickle that can run code when loaded, so it was not read. "
            f"This version reads format_version {CHECKPOINT_FORMAT_VERSION} ({STATE_JSON} + "
            f"{TENSORS_FILE}); start a fresh run or resume from a checkpoint written by this version"
        )
    from safetensors.torch import load_file

    state_json = base / STATE_JSON
    for path in (state_json, base / TENSORS_FILE):
        if not path.is_file():
            raise FileNotFoundError(f"load_training_checkpoint: {path} is missing")
    tree = load_json(state_json, lambda exc: ValueError(f"load_training_checkpoint: {state_json} is corrupt: {exc}"))
    return _decode(tree, load_file(str(base / TENSORS_FILE)), base)
