"""``VLMProcessor``: chat turns with image parts -> token ids plus per-sample image tensors.

Does for images what transformers' ``Qwen2VLProcessor`` does (which needs torchvision): renders
the turns with the tokenizer's chat template, runs the image processor and expands each
``<|image_pad|>`` to the image's ``t * h * w / merge**2`` merged patches.  It also packs a
batch's images as ``PackedTensor`` columns, one entry per sample.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nemo_dp.models.hf.tokenizer import HFTokenizer
from nemo_dp.utils.packed_tensor import PackedTensor

__all__ = ["EncodedPrompt", "VLMProcessor", "image_parts"]


@dataclass(frozen=True)
class EncodedPrompt:
    """One prompt ready for the model.

    Attributes:
        input_ids: Token ids with every image placeholder expanded.
        pixel_values: ``[patches, C * T * P * P]`` of all the prompt's images, or ``None``.
        image_grid_thw: ``[images, 3]`` int64, or ``None``.
    """

    input_ids: list[int]
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None


def image_parts(messages: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The ``"image"`` values of every image part of ``messages``, in order."""
    out: list[Any] = []
    for turn in messages:
        content = turn.get("content")
        if isinstance(content, (list, tuple)):
            out.extend(part["image"] for part in content if isinstance(part, Mapping) and part.get("type") == "image")
    return out


class VLMProcessor:
    """Tokenizer + image processor of a vision-language checkpoint.

    Args:
        tokenizer: The transformers tokenizer (its chat template renders image parts as one
            ``<|image_pad|>`` each).
        image_token_id: The placeholder's id (the model config's ``image_token_id``).
        source: Where they were loaded from (for messages).
    """

    def __init__(self, tokenizer: Any, image_processor: Any, image_token_id: int, source: str = "<in-memory>") -> None:
        self.tokenizer = HFTokenizer(tokenizer, source)
        self.image_processor = image_processor
        self.image_token_id = int(image_token_id)
        self.merge_size = int(image_processor.merge_size)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str], *, image_token_id: int) -> VLMProcessor:
        """Load the tokenizer and the image processor saved in ``directory``."""
        from transformers import AutoImageProcessor, AutoTokenizer

        path = os.fspath(directory)
        return cls(AutoTokenizer.from_pretrained(path), AutoImageProcessor.from_pretrained(path), image_token_id, path)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Write the tokenizer and the image processor into ``directory``."""
        self.tokenizer.hf_tokenizer.save_pretrained(os.fspath(directory))
        self.image_processor.save_pretrained(os.fspath(directory))

    def images_to_tensors(self, images: Sequence[Any]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(pixel_values, image_grid_thw)`` of RGB ``PIL`` images (``(None, None)`` for none)."""
        if not images:
            return None, None
        out = self.image_processor(images=list(images), return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"].to(torch.int64)

    def encode_messages(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
    ) -> EncodedPrompt:
        """Render chat turns for the model: expanded ids (``[bos]?`` + rendered text) and the images' tensors.

        ``messages`` is ``[{"role": ..., "content": str | [{"type": "text", "text": ...},
        {"type": "image", "image": PIL.Image}, ...]}, ...]``.

        Raises:
            ValueError: The rendered text does not hold one placeholder per image part.
        """
        images = image_parts(messages)
        text = self.tokenizer.hf_tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt
        )
        ids = self.tokenizer.encode_prompt(text)
        slots = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(slots) != len(images):
            raise ValueError(
                f"VLMProcessor: the chat template rendered {len(slots)} image placeholders for "
                f"{len(images)} image parts"
            )
        pixel_values, grid = self.images_to_tensors(images)
        if grid is None:
            return EncodedPrompt(ids, None, None)
        counts = (grid.prod(dim=-1) // (self.merge_size * self.merge_size)).tolist()
        expanded: list[int] = []
        image = 0
        for t in ids:
            if t == self.image_token_id:
                expanded.extend([t] * int(counts[image]))
                image += 1
            else:
                expanded.append(t)
        return EncodedPrompt(expanded, pixel_values, grid)

    @staticmethod
    def pack(prompts: Sequence[EncodedPrompt]) -> tuple[list[list[int]], PackedTensor, PackedTensor]:
        """A batch: the ids per row and the images as PackedTensors (one entry per row)."""
        if not prompts:
            raise ValueError("VLMProcessor.pack: no prompts")
        return (
            [list(p.input_ids) for p in prompts],
            PackedTensor([p.pixel_values for p in prompts], dim_to_pack=0),
            PackedTensor([p.image_grid_thw for p in prompts], dim_to_pack=0),
        )
