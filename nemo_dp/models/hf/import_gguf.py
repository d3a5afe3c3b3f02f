"""Turn a GGUF checkpoint into an ordinary transformers model directory.

    python -m nemo_dp.models.hf.import_gguf --gguf FILE --out DIR [--dtype float32|bfloat16]

transformers reads GGUF but will not ``save_pretrained`` it, so the weights are copied into a
fresh model and saved with the tokenizer; unsupported architectures are refused first, and the
directory appears atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = [
    "IMPORT_COMMAND",
    "IMPORT_RECORD",
    "SUPPORTED_ARCHITECTURES",
    "IMPORT_DTYPES",
    "gguf_architecture",
    "check_gguf_architecture",
    "import_gguf",
    "main",
]

#: The command line of this module (named in errors about GGUF-only directories).
IMPORT_COMMAND = "python -m nemo_dp.models.hf.import_gguf --gguf FILE --out DIR"

#: The file an import writes beside the weights: where they came from (JSON).
IMPORT_RECORD = "gguf_import.json"

#: GGUF ``general.architecture`` values imported: decoder-only transformer families that both
#: transformers' GGUF loader reads and the policy's KV-cached generation drives (attention
#: masks and position ids).  State-space (``mamba``) and encoder-decoder (``t5``) files are not.
SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "gemma2",
    "gemma3",
    "gpt2",
    "llama",
    "mistral",
    "nemotron",
    "phi3",
    "qwen2",
    "qwen3",
    "stablelm",
    "starcoder2",
)

#: ``--dtype`` values.
IMPORT_DTYPES: tuple[str, ...] = ("float32", "bfloat16")

Log = Callable[[str], None]


def _print(message: str) -> None:
    print(f"[import_gguf] {message}", flush=True)


def gguf_architecture(path: str | os.PathLike[str]) -> str:
    """The ``general.architecture`` string of a GGUF file's header.

    Args:
        path: The GGUF file.

    Returns:
        The architecture name (e.g. ``llama``).

    Raises:
        ValueError: The file is not a readable GGUF file or has no ``general.architecture``.
    """
    from gguf import GGUFReader

    try:
        reader = GGUFReader(os.fspath(path))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable GGUF file: {exc}") from exc
    field = reader.fields.get("general.architecture")
    if field is None:
        raise ValueError(f"{path}: the GGUF header has no general.architecture")
    return str(field.contents())


def check_gguf_architecture(path: str | os.PathLike[str]) -> str:
    """Read the header and refuse an architecture this importer does not support.

    Args:
        path: The GGUF file.

    Returns:
        The architecture.

    Raises:
        ValueError: Naming the architecture found and the supported ones.
    """
    arch = gguf_architecture(path)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} is not supported; supported architectures: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return arch


def _check_out(out: Path) -> None:
    if out.exists():
        raise ValueError(f"--out: {out} already exists; remove it or choose another directory")
    if not out.parent.is_dir():
        raise ValueError(f"--out: the parent directory {out.parent} does not exist")


def _fresh_copy(model: object, dtype: str) -> object:
    """A normally constructed model with ``model``'s config (minus its GGUF quantisation
    entry) and weights, in ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM

    config_dict = model.config.to_dict()  # type: ignore[attr-defined]
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = type(model.config).from_dict(config_dict)  # type: ignore[attr-defined]
    torch_dtype = getattr(torch, dtype)
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    state = model.state_dict()  # type: ignore[attr-defined]
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    if getattr(config, "tie_word_embeddings", False):
        # A tied head is one tensor under two names; the copy is complete without it.
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(
            f"the GGUF weights do not fit a fresh {type(fresh).__name__}: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )
    own = fresh.state_dict()
    for name, value in state.items():
        if name in own and not torch.equal(own[name], value.to(torch_dtype)):
            raise ValueError(f"copying the GGUF weights changed tensor {name!r}")
    fresh.generation_config = model.generation_config  # type: ignore[attr-defined]
    return fresh


def _chmod_like_new_files(directory: Path) -> None:
    """Give ``directory`` and its files the modes a plain ``mkdir`` / ``open`` would (the
    temporary directory and some writers use owner-only modes)."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.iterdir():
        path.chmod(0o666 & ~umask)


def import_gguf(
    gguf: str | os.PathLike[str], out: str | os.PathLike[str], *, dtype: str = "float32", log: Log = _print
) -> Path:
    """Write ``gguf`` as a ``save_pretrained`` directory at ``out`` (atomically).

    Args:
        gguf: A GGUF file of a supported architecture.
        out: The directory to create (must not exist; its parent must).
        dtype: Weight dtype of the written safetensors (``float32`` or ``bfloat16``).
        log: Progress lines.

    Returns:
        ``out`` as a path.

    Raises:
        ValueError: A missing or unsupported GGUF file, an existing ``out``, an unknown
            ``dtype``, or a tokenizer / chat template that did not survive the round trip.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, dst = Path(gguf).expanduser().resolve(), Path(out).expanduser().absolute()
    if dtype not in IMPORT_DTYPES:
        raise ValueError(f"--dtype: got {dtype!r}; legal values: {list(IMPORT_DTYPES)}")
    if not src.is_file():
        raise ValueError(f"--gguf: {gguf} is not a file")
    _check_out(dst)
    t0 = time.perf_counter()
    arch = check_gguf_architecture(src)
    log(f"{src.name}: architecture {arch}, {src.stat().st_size / 2**20:.0f} MiB")
    log("loading and dequantising the weights (transformers GGUF loader) ...")
    model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    log(f"loaded {type(model).__name__} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters)")
    fresh = _fresh_copy(model, dtype)
    del model
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    try:
        log(f"writing {dtype} safetensors, config and tokenizer ...")
        fresh.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        reread = AutoTokenizer.from_pretrained(str(tmp), local_files_only=True)
        if reread.chat_template != tokenizer.chat_template:
            raise ValueError(f"{src}: the chat template did not survive save_pretrained")
        record = {"source": src.name, "source_bytes": src.stat().st_size, "architecture": arch, "dtype": dtype}
        (tmp / IMPORT_RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        _chmod_like_new_files(tmp)
        os.rename(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"wrote {dst} in {time.perf_counter() - t0:.1f} s")
    return dst


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``--gguf FILE --out DIR [--dtype float32|bfloat16]``.

    Args:
        argv: Arguments (default ``sys.argv[1:]``).

    Returns:
        0 on success, 2 on a refused input (the reason on stderr).
    """
    parser = argparse.ArgumentParser(description="Import a GGUF checkpoint as a transformers model directory.")
    parser.add_argument("--gguf", required=True, help="the GGUF file")
    parser.add_argument("--out", required=True, help="the directory to create")
    parser.add_argument("--dtype", default="float32", choices=IMPORT_DTYPES, help="weight dtype written")
    args = parser.parse_args(argv)
    try:
        import_gguf(args.gguf, args.out, dtype=args.dtype)
    except ValueError as exc:
        print(f"import_gguf: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
