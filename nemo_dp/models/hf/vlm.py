"""``HFVisionLM``: a Qwen2-VL model, and its view as a ``CausalLM`` for one batch of images.

:meth:`HFVisionLM.with_images` returns an :class:`ImageBoundLM`, a ``CausalLM`` that maps the
protocol's per-row 1-D positions to Qwen2-VL's M-RoPE positions, so the KV-cached sampler and the
log-prob code work unchanged.  Images travel per sample as ``PackedTensor`` columns
``pixel_values`` and ``image_grid_thw`` (``None`` without images), in placeholder-token order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nemo_dp.models.hf.model import HFWrapper
from nemo_dp.utils.packed_tensor import PackedTensor

__all__ = ["HFVisionLM", "ImageBoundLM", "load_vlm"]


def _packed(value: PackedTensor | torch.Tensor | None, name: str) -> torch.Tensor | None:
    if value is None or isinstance(value, torch.Tensor):
        return value
    if isinstance(value, PackedTensor):
        return value.as_tensor()
    raise TypeError(f"{name} must be a PackedTensor, a tensor or None, got {type(value).__name__}")


class HFVisionLM(HFWrapper):
    """A loaded ``Qwen2VLForConditionalGeneration`` with M-RoPE position handling."""

    def __init__(self, hf_model: Any) -> None:
        super().__init__(hf_model)
        self.image_token_id = int(hf_model.config.image_token_id)

    @property
    def max_positions(self) -> int:
        return int(self.hf.config.text_config.max_position_embeddings)

    @property
    def hidden_size(self) -> int:
        return int(self.hf.config.text_config.hidden_size)

    def rope_positions(
        self, input_ids: torch.Tensor, image_grid_thw: torch.Tensor | None, attention_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """M-RoPE positions ``[3, B, S]`` and per-row offsets ``[B, 1]``.

        A row's text positions after its last image are ``1-D position + offset``.

        Raises:
            ValueError: The image placeholders do not match ``image_grid_thw``.
        """
        mm_types = (input_ids == self.image_token_id).int()
        merge = int(self.hf.config.vision_config.spatial_merge_size)
        want = 0 if image_grid_thw is None else int((image_grid_thw.prod(dim=-1) // (merge * merge)).sum())
        have = int(mm_types.sum())
        if have != want:
            raise ValueError(
                f"the batch holds {have} image placeholder tokens but its images need {want} "
                f"(image_grid_thw {None if image_grid_thw is None else image_grid_thw.tolist()})"
            )
        return self.hf.model.get_rope_index(
            input_ids, mm_token_type_ids=mm_types, image_grid_thw=image_grid_thw, attention_mask=attention_mask
        )

    def run(
        self, input_ids: torch.Tensor, *, pixel_values: torch.Tensor | None, image_grid_thw: torch.Tensor | None,
        position_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, past_key_values: Any = None,
        use_cache: bool = False, logits_to_keep: int = 0,
    ) -> Any:
        """The model's output for one call with explicit M-RoPE positions.

        ``logits_to_keep`` > 0 keeps the logits of the last that many positions only.
        """
        return self.hf(
            input_ids=input_ids, pixel_values=pixel_values, image_grid_thw=image_grid_thw, position_ids=position_ids,
            attention_mask=attention_mask, past_key_values=past_key_values, use_cache=use_cache,
            logits_to_keep=logits_to_keep,
        )

    def with_images(
        self, pixel_values: PackedTensor | torch.Tensor | None, image_grid_thw: PackedTensor | torch.Tensor | None
    ) -> ImageBoundLM:
        """This model as a ``CausalLM`` (sharing its parameters) over one batch whose rows hold these images.

        Args:
            pixel_values: Per-sample patches (a PackedTensor with one entry per row, or the
                already concatenated tensor), or ``None`` for a text-only batch.
            image_grid_thw: Per-sample grids, packed the same way.

        Raises:
            ValueError: Only one of the two is given.
        """
        pv = _packed(pixel_values, "pixel_values")
        grid = _packed(image_grid_thw, "image_grid_thw")
        if (pv is None) != (grid is None):
            raise ValueError("with_images: give both pixel_values and image_grid_thw, or neither")
        return ImageBoundLM(self, pv, grid)


@dataclass
class _Cache:
    past: Any
    offsets: torch.Tensor  # [B, 1]: M-RoPE position minus 1-D position, per row


#: Logit given to the image placeholder token in every output: its probability underflows to 0
#: (never sampled), while its log-prob stays finite (masked sums over prompt positions stay
#: finite, where ``-inf`` would turn them into NaN).
PLACEHOLDER_LOGIT = -1.0e4


class ImageBoundLM(nn.Module):
    """``CausalLM`` view of an :class:`HFVisionLM` for one batch of images.

    Prefill keeps each row's M-RoPE offset (an image's tokens take 3-D positions; text after it
    continues from the image's largest one) in the cache and decode shifts the new token's 1-D
    position by it, so a cached decode gives the log-probs of a full forward.  Every call covers
    the whole batch the images were bound for, rows in the same order.  The image placeholder
    is not a token the model may emit: all outputs (forward, prefill, decode) give it
    ``PLACEHOLDER_LOGIT``, so a response never holds one (the model would then need an image for
    it) and sampled log-probs still equal the full forward's.
    """

    def __init__(self, vlm: HFVisionLM, pixel_values: torch.Tensor | None, image_grid_thw: torch.Tensor | None) -> None:
        super().__init__()
        self.vlm = vlm
        self.pixel_values = pixel_values
        self.image_grid_thw = image_grid_thw

    max_positions = property(lambda self: self.vlm.max_positions, doc="The bound model's ``max_positions``.")
    hidden_size = property(lambda self: self.vlm.hidden_size, doc="The bound model's ``hidden_size``.")
    vocab_size = property(lambda self: self.vlm.vocab_size, doc="The bound model's ``vocab_size``.")

    def _no_placeholder(self, logits: torch.Tensor) -> torch.Tensor:
        index = torch.tensor([self.vlm.image_token_id], device=logits.device)
        return logits.index_fill(-1, index, PLACEHOLDER_LOGIT)

    def _images_on(self, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.pixel_values is None:
            return None, None
        return self.pixel_values.to(device), self.image_grid_thw.to(device)

    def forward(self, input_ids: torch.Tensor, logits_from: int = 0) -> torch.Tensor:
        """Cache-free forward over right-padded rows: logits ``[B, S - logits_from, V]``."""
        pv, grid = self._images_on(input_ids.device)
        positions, _ = self.vlm.rope_positions(input_ids, grid, None)
        keep = int(input_ids.shape[1]) - int(logits_from) if logits_from else 0
        out = self.vlm.run(input_ids, pixel_values=pv, image_grid_thw=grid, position_ids=positions, logits_to_keep=keep)
        return self._no_placeholder(out.logits)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Last-layer hidden states ``[B, S, hidden_size]`` (after the final norm)."""
        pv, grid = self._images_on(input_ids.device)
        positions, _ = self.vlm.rope_positions(input_ids, grid, None)
        out = self.vlm.hf.model(
            input_ids=input_ids, pixel_values=pv, image_grid_thw=grid, position_ids=positions, use_cache=False
        )
        return out.last_hidden_state

    def prefill(
        self, input_ids: torch.Tensor, key_valid: torch.Tensor, positions: torch.Tensor, max_len: int
    ) -> tuple[torch.Tensor, Any]:
        """Left-padded prompts (with their images) through the model, opening its KV cache.

        ``positions`` (1-D, per row) is replaced by the rows' M-RoPE positions; ``max_len`` is
        unused (the cache grows as needed).
        """
        del max_len
        pv, grid = self._images_on(input_ids.device)
        mask = key_valid.long()
        rope, _ = self.vlm.rope_positions(input_ids, grid, mask)
        out = self.vlm.run(
            input_ids, pixel_values=pv, image_grid_thw=grid, position_ids=rope, attention_mask=mask, use_cache=True,
            logits_to_keep=1,  # sampling reads the last column only
        )
        # next text position in M-RoPE minus the protocol's next 1-D position, per row
        offsets = rope.amax(dim=(0, 2)) + 1 - (positions[:, -1] + 1)
        return self._no_placeholder(out.logits[:, -1]), _Cache(out.past_key_values, offsets.unsqueeze(1))

    def decode(
        self, tokens: torch.Tensor, positions: torch.Tensor, key_valid: torch.Tensor, cache: Any
    ) -> tuple[torch.Tensor, Any]:
        """One text token per row through the cache (its M-RoPE position = 1-D + row offset)."""
        rope = (positions + cache.offsets).unsqueeze(0).expand(3, -1, -1)
        out = self.vlm.run(
            tokens, pixel_values=None, image_grid_thw=None, position_ids=rope, attention_mask=key_valid.long(),
            past_key_values=cache.past, use_cache=True,
        )
        return self._no_placeholder(out.logits[:, -1]), _Cache(out.past_key_values, cache.offsets)

    def lm_head_only_parameters(self) -> list[nn.Parameter]:
        return self.vlm.lm_head_only_parameters()

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        self.vlm.save_pretrained(directory)


def load_vlm(path: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32) -> tuple[HFVisionLM, Any]:
    """Load ``(model, VLMProcessor)`` from a Qwen2-VL ``save_pretrained`` directory.

    ``path`` holds the model, its tokenizer and its image processor (e.g. one written by
    ``nemo_dp.models.hf.make_tiny_vlm``).

    Raises:
        FileNotFoundError: ``path`` is not a directory.
        ValueError: The directory is not a Qwen2-VL checkpoint.
    """
    from transformers import AutoConfig, Qwen2VLForConditionalGeneration

    from nemo_dp.models.hf.vlm_processor import VLMProcessor

    directory = os.fspath(path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"load_vlm: {directory!r} is not a directory")
    config = AutoConfig.from_pretrained(directory)
    if config.model_type != "qwen2_vl":
        raise ValueError(
            f"load_vlm: {directory!r} holds a {config.model_type!r} model; this loader reads Qwen2-VL "
            "('qwen2_vl') checkpoints"
        )
    model = Qwen2VLForConditionalGeneration.from_pretrained(directory, dtype=dtype)
    return HFVisionLM(model), VLMProcessor.from_pretrained(directory, image_token_id=int(config.image_token_id))
