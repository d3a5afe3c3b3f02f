"""Offline tiny vision-language checkpoints: ``python -m nemo_dp.models.hf.make_tiny_vlm --out DIR``.

Writes a BPE tokenizer trained on the built-in visual task (chat and Qwen2-VL vision specials; an
image part renders as ``<|vision_start|><|image_pad|><|vision_end|>``), a Qwen2-VL image processor
sized for tiny images and a random tiny ``Qwen2VLForConditionalGeneration``, laid out like a hub
checkpoint that ``load_vlm`` reads.  No ``Qwen2VLProcessor`` is saved: it needs torchvision.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nemo_dp.models.hf.make_tiny import EOS_TOKEN, START_TOKEN, build_once, check_at_least_one, check_divides
from nemo_dp.models.hf.make_tiny import seeded_model, special_token_ids, train_bpe_tokenizer

__all__ = [
    "BUILD_FILE", "BUILD_VERSION", "IMAGE_TOKEN", "VLM_CHAT_TEMPLATE", "VisionDims", "ensure_tiny_vlm_checkpoint",
    "make_tiny_vlm_checkpoint", "main",
]

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_TOKEN = "<|image_pad|>"
VIDEO_TOKEN = "<|video_pad|>"
VISION_TOKENS: tuple[str, ...] = (VISION_START, VISION_END, IMAGE_TOKEN, VIDEO_TOKEN)

#: ChatML with image parts: a message's content is a string or a list of ``{"type": "text",
#: "text": ...}`` / ``{"type": "image", ...}`` parts; each image part becomes one placeholder,
#: which the processor side expands to the image's number of merged patches.
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: Version of what this module writes for given arguments.  Bump it whenever a change here
#: changes the written directory (tokenizer corpus, vocabulary, model config), so a cached
#: build from an older version is rebuilt rather than silently reused.
BUILD_VERSION = 2
#: The file recording how a directory was built (:data:`BUILD_VERSION`, seed, vocabulary
#: target, positions, :class:`VisionDims`): the key a cached build must match.
BUILD_FILE = "nemo_dp_tiny_vlm.json"
#: Defaults of :func:`make_tiny_vlm_checkpoint` (the cached build uses them).
DEFAULT_VOCAB_SIZE = 384
DEFAULT_MAX_POSITIONS = 256

_FILES_DONE = (
    "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "preprocessor_config.json",
    BUILD_FILE,
)


@dataclass(frozen=True)
class VisionDims:
    """Shape of a tiny VLM checkpoint (defaults: seconds to build and run on one CPU core).

    Attributes:
        hidden_size: Width of the language model (also the vision tower's output width).
        num_heads: Attention heads of the language model (``hidden_size / num_heads`` must be
            even: the rotary halves are split into Qwen2-VL's three M-RoPE sections).
        vision_depth: Vision transformer blocks.
        patch_size: Pixels per patch side.
        merge_size: Patches merged per side into one language token.
        min_pixels: Smallest image area after resizing (``max_pixels``: largest).
    """

    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    vision_depth: int = 1
    vision_embed_dim: int = 32
    vision_heads: int = 2
    patch_size: int = 4
    merge_size: int = 2
    min_pixels: int = 8 * 8
    max_pixels: int = 32 * 32

    def __post_init__(self) -> None:
        check_at_least_one("make_tiny_vlm", self)
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ValueError(
                f"make_tiny_vlm: hidden_size ({self.hidden_size}) / num_heads ({self.num_heads}) "
                "must be an even integer"
            )
        check_divides("make_tiny_vlm", self, ("num_kv_heads", "num_heads"), ("vision_heads", "vision_embed_dim"))
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"make_tiny_vlm: min_pixels {self.min_pixels} > max_pixels {self.max_pixels}")

    def mrope_section(self) -> list[int]:
        """Rotary frequencies per M-RoPE section (temporal, height, width); sums to head_dim/2."""
        half = self.hidden_size // self.num_heads // 2
        first = half - 2 * (half // 3)
        return [first, half // 3, half // 3]


def _corpus(seed: int) -> Iterator[str]:
    from nemo_dp.data.visual_task import KINDS, VisualTask

    for kind in KINDS:
        task = VisualTask(kind=kind, seed=seed)
        for p in task.train_problems(200):
            yield f"{START_TOKEN}user\n{VISION_START}{IMAGE_TOKEN}{VISION_END}{p.question}{EOS_TOKEN}\n"
            yield f"{START_TOKEN}assistant\n{p.answer}{EOS_TOKEN}\n"


def make_tiny_vlm_checkpoint(
    out: str | os.PathLike[str], *, seed: int = 0, vocab_size: int = DEFAULT_VOCAB_SIZE,
    max_positions: int = DEFAULT_MAX_POSITIONS, dims: VisionDims | None = None,
) -> Path:
    """Write a tokenizer, an image processor and a random tiny Qwen2-VL model into ``out``; return it.

    Like :func:`~nemo_dp.models.hf.make_tiny.make_tiny_checkpoint`, but ``vocab_size``: the visual
    task's text has only about 95 merges, so the default 384 takes them all (351 tokens with seed 0)
    and every answer (digit, count, colour name) is one token.
    """
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil

    d = dims or VisionDims()
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    tok = train_bpe_tokenizer(_corpus(seed), vocab_size, extra_specials=VISION_TOKENS, chat_template=VLM_CHAT_TEMPLATE)
    ids = special_token_ids(tok)
    token_id = tok.convert_tokens_to_ids
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": d.hidden_size,
            "intermediate_size": d.intermediate_size,
            "num_hidden_layers": d.num_layers,
            "num_attention_heads": d.num_heads,
            "num_key_value_heads": d.num_kv_heads,
            "max_position_embeddings": max_positions,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": d.mrope_section()},
            **ids,
        },
        vision_config={
            "depth": d.vision_depth,
            "embed_dim": d.vision_embed_dim,
            "hidden_size": d.hidden_size,
            "num_heads": d.vision_heads,
            "mlp_ratio": 2,
            "patch_size": d.patch_size,
            "spatial_merge_size": d.merge_size,
            "temporal_patch_size": 2,
            "in_channels": 3,
        },
        image_token_id=token_id(IMAGE_TOKEN),
        video_token_id=token_id(VIDEO_TOKEN),
        vision_start_token_id=token_id(VISION_START),
        vision_end_token_id=token_id(VISION_END),
        tie_word_embeddings=False,
    )
    model = seeded_model(seed, lambda: Qwen2VLForConditionalGeneration(config).to(torch.float32), ids)
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=d.patch_size,
        merge_size=d.merge_size,
        temporal_patch_size=2,
        min_pixels=d.min_pixels,
        max_pixels=d.max_pixels,
    )
    model.save_pretrained(str(target))
    tok.save_pretrained(str(target))
    image_processor.save_pretrained(str(target))
    build = _build_record(seed=seed, vocab_size=vocab_size, max_positions=max_positions, dims=d)
    (target / BUILD_FILE).write_text(json.dumps(build, indent=2, sort_keys=True) + "\n")
    return target


def _build_record(*, seed: int, vocab_size: int, max_positions: int, dims: VisionDims) -> dict[str, object]:
    return {
        "version": BUILD_VERSION,
        "seed": seed,
        "vocab_size": vocab_size,
        "max_positions": max_positions,
        "dims": asdict(dims),
    }


def _recorded_build(path: Path) -> object:
    try:
        return json.loads((path / BUILD_FILE).read_text())
    except (OSError, ValueError):
        return None


def ensure_tiny_vlm_checkpoint(
    cache_dir: str | os.PathLike[str], *, seed: int = 0, dims: VisionDims | None = None, name: str = "tiny-qwen2-vl"
) -> Path:
    """The tiny VLM checkpoint directory ``cache_dir/name``, built on first use (atomically renamed).

    A directory already there is reused only when its :data:`BUILD_FILE` matches this build
    (:data:`BUILD_VERSION`, seed, shape).  Otherwise (another builder version, other arguments,
    or incomplete) it is moved aside and removed, with a line saying so, and rebuilt.  Give a
    non-default ``dims`` its own ``name``.
    """
    d = dims or VisionDims()
    final = Path(cache_dir) / name
    want = _build_record(seed=seed, vocab_size=DEFAULT_VOCAB_SIZE, max_positions=DEFAULT_MAX_POSITIONS, dims=d)
    if final.exists() and _recorded_build(final) != want:
        found = _recorded_build(final)
        version = found.get("version") if isinstance(found, dict) else None
        print(
            f"make_tiny_vlm: {final} was built by another version of the builder or with other "
            f"arguments (found {BUILD_FILE} version {version}, want {BUILD_VERSION}); rebuilding it",
            flush=True,
        )
        aside = final.parent / f"{final.name}.stale-{uuid.uuid4().hex}"
        if _recorded_build(final) != want:  # not replaced by a concurrent rebuild meanwhile
            try:
                os.rename(final, aside)
            except FileNotFoundError:
                pass  # another process moved it first
            shutil.rmtree(aside, ignore_errors=True)
    return build_once(final, _FILES_DONE, lambda tmp: make_tiny_vlm_checkpoint(tmp, seed=seed, dims=d))


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point (``argv`` default ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="target directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-positions", type=int, default=DEFAULT_MAX_POSITIONS)
    args = parser.parse_args(argv)
    path = make_tiny_vlm_checkpoint(args.out, seed=args.seed, max_positions=args.max_positions)
    print(f"wrote tiny Qwen2-VL checkpoint to {path}: {sorted(p.name for p in path.iterdir())}")


if __name__ == "__main__":
    main()
