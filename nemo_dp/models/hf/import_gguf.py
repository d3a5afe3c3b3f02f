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
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "IMPORT_COMMAND", "IMPORT_RECORD", "SUPPORTED_ARCHITECTURES", "IMPORT_DTYPES", "gguf_architecture",
    "check_gguf_architecture", "import_gguf", "main",
]

#: The command line of this module (named in errors about GGUF-only directories).
IMPORT_COMMAND = "python -m nemo_dp.models.hf.import_gguf --gguf FILE --out DIR"

#: The file an import writes beside the weights: where they came from (JSON).
IMPORT_RECORD = "gguf_import.json"

#: GGUF ``general.architecture`` values imported: decoder-only transformer families that both
#: transformers' GGUF loader reads and the policy's KV-cached generation drives (attention
#: masks and position ids).  State-space (``mamba``) and encoder-decoder (``t5``) files are not.
SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "gemma2", "gemma3", "gpt2", "llama", "mistral", "nemotron", "phi3", "qwen2", "qwen3", "stablelm", "starcoder2",
)

#: ``--dtype`` values.
IMPORT_DTYPES: tuple[str, ...] = ("float32", "bfloat16")

Log = Callable[[str], None]


def _print(message: str) -> None:
    print(f"[import_gguf] {message}", flush=True)


#: GGUF metadata value types: scalar type id -> ``struct`` format; 8 is a string, 9 an array.
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_architecture(path: str | os.PathLike[str]) -> str:
    """The ``general.architecture`` string (e.g. ``llama``) of a GGUF file's header.

    Reads the metadata entries only up to that key (usually the first), so it costs
    microseconds where a full parse of a 49k-token vocabulary takes seconds.

    Raises:
        ValueError: The file is not a readable GGUF file or has no ``general.architecture``.
    """
    try:
        with open(path, "rb") as fh:
            return _header_architecture(fh, str(path))
    except OSError as exc:
        raise ValueError(f"{path}: not a readable GGUF file: {exc}") from exc


def _header_architecture(fh: Any, path: str) -> str:
    def read(n: int) -> bytes:
        data = fh.read(n)
        if len(data) != n:
            raise ValueError(f"{path}: not a readable GGUF file: the header ends early")
        return data

    if read(4) != b"GGUF":
        raise ValueError(f"{path}: not a readable GGUF file: it does not start with the GGUF magic")
    order = "<"
    version = struct.unpack("<I", read(4))[0]
    if version > 0xFFFF:  # written big-endian
        order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
    if version < 2:
        raise ValueError(f"{path}: not a readable GGUF file: header version {version} (2 or later is read)")

    def number(fmt: str) -> Any:
        return struct.unpack(order + fmt, read(struct.calcsize(fmt)))[0]

    def skip(vtype: int) -> None:
        if vtype in _GGUF_SCALARS:
            read(struct.calcsize(_GGUF_SCALARS[vtype]))
        elif vtype == _GGUF_STRING:
            read(number("Q"))
        elif vtype == _GGUF_ARRAY:
            etype, count = number("I"), number("Q")
            if etype in _GGUF_SCALARS:
                read(count * struct.calcsize(_GGUF_SCALARS[etype]))
            else:
                for _ in range(count):
                    skip(etype)
        else:
            raise ValueError(f"{path}: not a readable GGUF file: unknown metadata value type {vtype}")

    number("Q")  # tensor count
    for _ in range(number("Q")):
        key = read(number("Q")).decode("utf-8", errors="replace")
        vtype = number("I")
        if key == "general.architecture":
            if vtype != _GGUF_STRING:
                raise ValueError(f"{path}: the GGUF header's general.architecture is not a string")
            return read(number("Q")).decode("utf-8", errors="replace")
        skip(vtype)
    raise ValueError(f"{path}: the GGUF header has no general.architecture")


def check_gguf_architecture(path: str | os.PathLike[str]) -> str:
    """Like :func:`gguf_architecture`, but refuse an architecture this importer does not support.

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
    """A normally constructed model with ``model``'s config (minus GGUF quantisation) and weights, in ``dtype``."""
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
    """Give ``directory`` and its files the modes a plain ``mkdir`` / ``open`` would.

    The temporary directory and some writers use owner-only modes.
    """
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.iterdir():
        path.chmod(0o666 & ~umask)


def import_gguf(
    gguf: str | os.PathLike[str], out: str | os.PathLike[str], *, dtype: str = "float32", log: Log = _print
) -> Path:
    """Write ``gguf`` as a ``save_pretrained`` directory at ``out`` (atomically); return ``out`` as a path.

    Args:
        out: The directory to create (must not exist; its parent must).
        dtype: Weight dtype of the written safetensors (``float32`` or ``bfloat16``).
        log: Receives progress lines.

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
    """Command line (``argv`` default ``sys.argv[1:]``); returns 0, or 2 on a refused input (reason on stderr)."""
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
