"""Checks of a ``policy=hf`` node that run on the driver before Ray starts.

Why this module exists: a wrong path or an unusable checkpoint must fail in the first second,
naming the key and the fix, not minutes later inside a Ray actor.  Everything here reads only
local files (``local_files_only=True``): this toolkit never downloads from the hub, and a
hub-style name that is not a local directory is refused as such.
"""

from __future__ import annotations

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
    """Resolve ``path`` as an existing local directory.

    Args:
        key: The config key holding it (named in errors).
        path: The configured value.

    Returns:
        The directory.

    Raises:
        ValueError: Missing (a hub-style name gets its own explanation) or not a directory.
    """
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
    raise ValueError(
        f"{key}: directory {path!r} does not exist; point it at a local checkpoint directory "
        f"or build one with `{_MAKE_TINY}`"
    )


def causal_lm_architectures() -> set[str]:
    """Class names transformers registers as causal LMs (``AutoModelForCausalLM``).

    Returns:
        The names.
    """
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


def validate_hf_policy(policy_cfg: Any) -> None:
    """Check the ``policy=hf`` keys, the checkpoint and the tokenizer (local files only).

    Args:
        policy_cfg: The ``policy`` node.

    Raises:
        ValueError: Naming the key at fault (``policy.model_name_or_path``,
            ``policy.tokenizer_name_or_path``, ``policy.dtype``, ...) and the fix.
    """
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
            f"has only {model_vocab} embedding rows; use the tokenizer the model was trained with"
        )
    for name, tid in (("eos", tok.eos_id), ("pad", tok.pad_id)):
        if not 0 <= tid < model_vocab:
            raise ValueError(
                f"{tok_key}: {name} token id {tid} is outside the model's vocabulary of {model_vocab}"
            )
    model_node = cfg_get(policy_cfg, "model", None)
    max_len = cfg_get(model_node, "max_seq_len", None) if model_node is not None else None
    limit = getattr(config, "max_position_embeddings", None)
    if max_len is not None and limit is not None and int(max_len) > int(limit):
        raise ValueError(
            f"policy.model.max_seq_len: {max_len} exceeds the checkpoint's "
            f"max_position_embeddings={limit}; lower it"
        )
