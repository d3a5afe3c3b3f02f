"""Checks of a ``policy=hf`` node that run on the driver before Ray starts (local files only)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from nemo_dp.models.builders import cfg_get
from nemo_dp.models.hf.import_gguf import IMPORT_COMMAND
from nemo_dp.models.hf.settings import HFSettings, hf_settings

__all__ = ["validate_hf_policy", "check_local_dir", "causal_lm_architectures"]

_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_MAKE_TINY = "python -m nemo_dp.models.hf.make_tiny --arch llama --out DIR"


def check_local_dir(key: str, path: str) -> Path:
    """``path``, the value of config ``key``, as an existing local directory (else ``ValueError``)."""
    p = Path(path).expanduser()
    if p.is_dir():
        return p
    if p.exists():
        raise ValueError(f"{key}: {path!r} is a file; it must be a checkpoint directory")
    if _HUB_NAME.match(path) and not path.startswith("."):
        raise ValueError(
            f"{key}: {path!r} looks like a HuggingFace hub name, but models are loaded from local "
            "directories only (no downloads): download it on a machine with network access "
            f"(e.g. `huggingface-cli download {path} --local-dir DIR`) and set {key}=DIR, or build "
            f"an offline tiny checkpoint with `{_MAKE_TINY}`"
        )
    tiny = ""
    if p.name.startswith("tiny-"):
        from nemo_dp.models.hf.make_tiny import TINY_CACHE_DIR

        tiny = (
            f" (only the default cache path {TINY_CACHE_DIR}/tiny-<arch> is built on first use; "
            "any other path must exist)"
        )
    raise ValueError(
        f"{key}: directory {path!r} does not exist; point it at a local checkpoint directory "
        f"or build one with `{_MAKE_TINY}`{tiny}"
    )


def causal_lm_architectures() -> set[str]:
    """Class names transformers registers as causal LMs (``AutoModelForCausalLM``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names: set[str] = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update([value] if isinstance(value, str) else value)
    return names


def _check_model_dir(settings: HFSettings) -> Any:
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    key = "policy.model_name_or_path"
    given = Path(settings.model_name_or_path).expanduser()
    if given.is_file() and given.suffix == ".gguf":
        raise ValueError(
            f"{key}: {settings.model_name_or_path!r} is a GGUF file; import it into a checkpoint "
            f"directory first with `{IMPORT_COMMAND.replace('FILE', str(given))}` and set {key}=DIR"
        )
    path = check_local_dir(key, settings.model_name_or_path)
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    if ggufs and not (path / "config.json").is_file():
        raise ValueError(
            f"{key}: {str(path)!r} holds only GGUF weights ({', '.join(ggufs)}), which policy=hf "
            f"does not load; import them into a checkpoint directory with "
            f"`{IMPORT_COMMAND.replace('FILE', str(path / ggufs[0]))}` and set {key}=DIR"
        )
    if not (path / "config.json").is_file():
        raise ValueError(f"{key}: {str(path)!r} has no config.json; it is not a HuggingFace checkpoint")
    if not any(path.glob("*.safetensors")):
        raise ValueError(
            f"{key}: {str(path)!r} holds no *.safetensors weights; only safetensors are loaded "
            "(pickle-based .bin files could execute code): re-save the model with "
            "save_pretrained() in an environment you trust"
        )
    try:
        config = AutoConfig.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=settings.trust_remote_code
        )
    except ValueError as exc:
        hint = " (set policy.trust_remote_code=true only if you trust its code)" if "remote" in str(exc) else ""
        raise ValueError(f"{key}: cannot read the config in {str(path)!r}: {exc}{hint}") from exc
    archs = list(getattr(config, "architectures", None) or [])
    causal = causal_lm_architectures()
    not_causal = [a for a in archs if a not in causal]
    if not_causal or (not archs and config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        named = not_causal or [config.model_type]
        raise ValueError(
            f"{key}: {str(path)!r} is a {', '.join(named)} checkpoint, not a causal language "
            "model; policy=hf needs a *ForCausalLM / *LMHeadModel checkpoint (e.g. Llama, Qwen2, "
            "GPT-2)"
        )
    return config


def _declared_ids(model_dir: Path, name: str) -> list[tuple[str, int]]:
    """``(file:key, id)`` of every ``<name>_token_id`` the model's JSON files declare."""
    found: list[tuple[str, int]] = []
    for file_name in ("config.json", "generation_config.json"):
        path = model_dir / file_name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"policy.model_name_or_path: cannot read {str(path)!r}: {exc}") from exc
        value = data.get(f"{name}_token_id") if isinstance(data, dict) else None
        for tid in value if isinstance(value, list) else [value]:
            if isinstance(tid, int) and not isinstance(tid, bool):
                found.append((f"{file_name}:{name}_token_id", tid))
    return found


def _check_special_ids(hf_tok: Any, tok_key: str, tok_path: Path, model_dir: Path) -> None:
    """Check the tokenizer's eos / bos / pad ids against each model file that declares one (a list: any of them).

    Models pad their embedding, so these ids are what tells another model's tokenizer apart.
    """
    for name in ("eos", "bos", "pad"):
        tid = getattr(hf_tok, f"{name}_token_id", None)
        declared = _declared_ids(model_dir, name)
        files = {where for where, _ in declared}
        if tid is None or all(int(tid) in {i for w, i in declared if w == f} for f in files):
            continue
        token = getattr(hf_tok, f"{name}_token", None)
        model_side = ", ".join(f"{where}={i}" for where, i in declared)
        raise ValueError(
            f"{tok_key}: the tokenizer at {str(tok_path)!r} has {name} id {int(tid)} ({token!r}) but "
            f"the model at policy.model_name_or_path={str(model_dir)!r} declares {model_side}; use the "
            "tokenizer the model was trained with (or fix those ids in the model's files)"
        )


def validate_hf_policy(policy_cfg: Any) -> None:
    """Check the ``policy=hf`` keys, the checkpoint and the tokenizer; ``ValueError`` naming the key and the fix."""
    from transformers import AutoTokenizer

    from nemo_dp.models.hf.tokenizer import HFTokenizer

    settings = hf_settings(policy_cfg)
    config = _check_model_dir(settings)
    tok_key = "policy.tokenizer_name_or_path"
    tok_path = check_local_dir(tok_key, settings.tokenizer_name_or_path)
    try:
        hf_tok = AutoTokenizer.from_pretrained(
            str(tok_path), local_files_only=True, trust_remote_code=settings.trust_remote_code
        )
    except (OSError, ValueError) as exc:
        raise ValueError(f"{tok_key}: cannot load a tokenizer from {str(tok_path)!r}: {exc}") from exc
    tok = HFTokenizer(hf_tok, source=str(tok_path))
    model_vocab = int(config.vocab_size)
    if tok.vocab_size > model_vocab:
        raise ValueError(
            f"{tok_key}: the tokenizer at {str(tok_path)!r} has {tok.vocab_size} tokens but the model "
            f"has only {model_vocab} embedding rows (config.json:vocab_size={model_vocab} of "
            f"policy.model_name_or_path={settings.model_name_or_path!r}); use the tokenizer the model "
            "was trained with"
        )
    for name, tid in (("eos", tok.eos_id), ("pad", tok.pad_id), ("bos", tok.bos_id)):
        if tid is not None and not 0 <= tid < model_vocab:
            raise ValueError(
                f"{tok_key}: {name} token id {tid} is outside the model's vocabulary of {model_vocab}"
            )
    _check_special_ids(hf_tok, tok_key, tok_path, Path(settings.model_name_or_path).expanduser())
    model_node = cfg_get(policy_cfg, "model", None)
    max_len = cfg_get(model_node, "max_seq_len", None) if model_node is not None else None
    limit = getattr(config, "max_position_embeddings", None)
    if max_len is not None and limit is not None and int(max_len) > int(limit):
        raise ValueError(
            f"policy.model.max_seq_len: {max_len} exceeds the checkpoint's "
            f"max_position_embeddings={limit}; lower it"
        )
