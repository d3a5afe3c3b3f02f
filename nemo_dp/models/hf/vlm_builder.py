"""``policy=hf_vlm`` builder: a Qwen2-VL checkpoint directory as the policy.

Loads model and processor with ``load_vlm`` (local files only) and gives the run a
:class:`VLMTokenizer` that also carries the image processor; the default path, the offline tiny
Qwen2-VL under ``.cache/nemo_dp/tiny-qwen2-vl``, is built on first use.  Image prompts are not
tokenised on the driver: the policy's workers encode them, so the pixels exist only there.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from nemo_dp.models.builders import ModelBuilder, cfg_get
from nemo_dp.models.hf.builder import check_tokenizer_fits
from nemo_dp.models.hf.settings import HFSettings, hf_settings
from nemo_dp.models.hf.tokenizer import HFTokenizer
from nemo_dp.models.hf.validate import check_local_dir

__all__ = ["BUILDER", "TINY_VLM_NAME", "VLMTokenizer", "load_vlm_tokenizer"]

#: Directory name of the offline tiny Qwen2-VL that ``prepare`` builds when it is missing.
TINY_VLM_NAME = "tiny-qwen2-vl"


class VLMTokenizer(HFTokenizer):
    """The checkpoint's tokenizer plus its image processor (``processor``, a ``VLMProcessor``)."""

    def __init__(self, processor: Any, source: str = "<in-memory>") -> None:
        super().__init__(processor.tokenizer.hf_tokenizer, source)
        self.processor = processor

    def encode_prompt(self, prompt: Any) -> Any:  # type: ignore[override]
        """Token ids of a text prompt; an image prompt (``VisualPrompt``, ``ImagePrompt``) is returned as it is.

        The workers render or load and encode its images.
        """
        from nemo_dp.data.image_rows import is_image_prompt

        if is_image_prompt(prompt):
            return prompt
        return super().encode_prompt(prompt)

    def save_pretrained(self, directory: Any) -> None:
        """Write the tokenizer and the image processor (``save_pretrained`` of each)."""
        self.processor.save_pretrained(directory)


def load_vlm_tokenizer(settings: HFSettings) -> VLMTokenizer:
    """The tokenizer and image processor saved in ``settings.tokenizer_name_or_path``."""
    from transformers import AutoConfig

    from nemo_dp.models.hf.vlm_processor import VLMProcessor

    config = AutoConfig.from_pretrained(settings.model_name_or_path, local_files_only=True)
    processor = VLMProcessor.from_pretrained(settings.tokenizer_name_or_path, image_token_id=int(config.image_token_id))
    return VLMTokenizer(processor, settings.tokenizer_name_or_path)


def _load_model(settings: HFSettings) -> Any:
    from nemo_dp.models.hf.vlm import load_vlm

    model, _ = load_vlm(settings.model_name_or_path, dtype=settings.torch_dtype)
    return model


def _build_model(policy_cfg: Any, vocab_size: int, seed: int) -> Any:
    del seed  # the weights come from disk, identical on every rank
    settings = hf_settings(policy_cfg)
    return check_tokenizer_fits(_load_model(settings), vocab_size, settings)


def _build_tokenizer(policy_cfg: Any) -> VLMTokenizer:
    return load_vlm_tokenizer(hf_settings(policy_cfg))


def _load_pretrained(policy_cfg: Any, directory: str) -> Any:
    return _load_model(dataclasses.replace(hf_settings(policy_cfg), model_name_or_path=directory))


def _save_tokenizer(policy_cfg: Any, directory: str) -> None:
    load_vlm_tokenizer(hf_settings(policy_cfg)).save_pretrained(directory)


def _load_saved_tokenizer(policy_cfg: Any, directory: str) -> VLMTokenizer | None:
    if not (Path(directory) / "tokenizer_config.json").is_file():
        return None
    settings = hf_settings(policy_cfg)
    saved = dataclasses.replace(settings, model_name_or_path=directory, tokenizer_name_or_path=directory)
    return load_vlm_tokenizer(saved)


def validate_vlm_policy(policy_cfg: Any) -> None:
    """Check a ``policy=hf_vlm`` node before Ray starts (local files only).

    Raises:
        ValueError: Naming the key at fault: the model directory is missing or not a Qwen2-VL
            checkpoint, remote code is asked for, or sequence packing / dynamic batching is on
            (a row's image patches cannot be split across or packed into other rows).
    """
    settings = hf_settings(policy_cfg)
    key = "policy.model_name_or_path"
    path = check_local_dir(key, settings.model_name_or_path)
    config_file = path / "config.json"
    if not config_file.is_file() or not any(path.glob("*.safetensors")):
        raise ValueError(
            f"{key}: {str(path)!r} needs config.json and *.safetensors weights (a save_pretrained directory)"
        )
    model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
    if model_type != "qwen2_vl":
        raise ValueError(
            f"{key}: {str(path)!r} holds a {model_type!r} model; policy=hf_vlm loads Qwen2-VL ('qwen2_vl') "
            "checkpoints (use policy=hf for a text model)"
        )
    if settings.trust_remote_code:
        raise ValueError("policy.trust_remote_code: policy=hf_vlm loads transformers' own Qwen2-VL; set it to false")
    check_local_dir("policy.tokenizer_name_or_path", settings.tokenizer_name_or_path)
    for group in ("sequence_packing", "dynamic_batching"):
        node = cfg_get(policy_cfg, group, None)
        if node is not None and bool(cfg_get(node, "enabled", False)):
            raise ValueError(
                f"policy.{group}.enabled: not supported with policy=hf_vlm (each row carries its own "
                "images); set it to false"
            )


def prepare_vlm_policy(policy_cfg: Any) -> None:
    """Build the tiny Qwen2-VL at the default cache path ``.cache/nemo_dp/tiny-qwen2-vl`` when needed.

    Needed when it is missing or its ``BUILD_FILE`` differs; any other path is left to validation,
    as for ``policy=hf``.
    """
    from nemo_dp.models.hf.make_tiny import TINY_CACHE_DIR
    from nemo_dp.models.hf.make_tiny_vlm import ensure_tiny_vlm_checkpoint

    given = Path(hf_settings(policy_cfg).model_name_or_path).expanduser()
    default = Path(TINY_CACHE_DIR) / TINY_VLM_NAME
    if given.absolute() != default.absolute():
        return
    if not (given / "config.json").is_file():
        print(
            f"policy.model_name_or_path: {given} does not exist yet; building the offline tiny Qwen2-VL "
            "checkpoint there (random weights, first use of the default cache path)",
            flush=True,
        )
    # reuses a current build; rebuilds (saying so) one written by an older builder version
    ensure_tiny_vlm_checkpoint(TINY_CACHE_DIR, name=TINY_VLM_NAME)


BUILDER = ModelBuilder(
    kind="hf_vlm", build_model=_build_model, build_tokenizer=_build_tokenizer, validate=validate_vlm_policy,
    load_pretrained=_load_pretrained, prepare=prepare_vlm_policy, save_tokenizer=_save_tokenizer,
    load_saved_tokenizer=_load_saved_tokenizer, takes_images=True,
)
