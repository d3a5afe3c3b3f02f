"""Rows of a user's image dataset as the trainers pass them around: image paths, not pixels.

An :class:`ImagePrompt` holds a prompt's chat turns with image parts naming resolved paths.  Like
the built-in task's ``VisualPrompt`` it is what the driver moves; the policy's workers load and
encode the images, so pixels exist only where the model reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_dp.data.images import image_paths, with_loaded_images
from nemo_dp.data.visual_task import VisualPrompt, VisualSFTExample

__all__ = ["ImagePrompt", "ImageSFTExample", "is_image_example", "is_image_prompt"]


@dataclass(frozen=True)
class ImagePrompt:
    """A prompt of a user's image dataset: ``{"role", "content"}`` turns, image parts naming absolute paths."""

    turns: tuple[dict[str, Any], ...]

    def image_paths(self) -> list[str]:
        return image_paths(self.turns)

    def messages(self) -> list[dict[str, Any]]:
        """The turns with each image path replaced by the loaded RGB ``PIL`` image."""
        return with_loaded_images(self.turns)

    def __str__(self) -> str:
        texts: list[str] = []
        for turn in self.turns:
            content = turn["content"]
            if isinstance(content, str):
                texts.append(content)
                continue
            for p in content:
                texts.append(f"[image {Path(p['image']).name}]" if p["type"] == "image" else p["text"])
        return " ".join(texts) + " "


@dataclass(frozen=True)
class ImageSFTExample:
    """A supervised example of a user's image dataset: the turns before the last, and that assistant turn's text."""

    prompt: ImagePrompt
    response: str


def is_image_prompt(prompt: Any) -> bool:
    """Whether ``prompt`` is encoded by the workers (a ``VisualPrompt`` or an :class:`ImagePrompt`)."""
    return isinstance(prompt, (VisualPrompt, ImagePrompt))


def is_image_example(example: Any) -> bool:
    """Whether ``example`` is an SFT example with images (built-in task or a user's file)."""
    return isinstance(example, (VisualSFTExample, ImageSFTExample))
