"""Images on the policy workers: encoding visual prompts, binding a batch's images, generating.

:func:`generate_rows` is the chunked generation over text and image prompts that the policy and
rollout workers share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.models.builders import cfg_get
from nemo_dp.models.generation import generate
from nemo_dp.utils.packed_tensor import IMAGE_FIELDS, IMAGE_GRID_THW, PIXEL_VALUES

__all__ = ["bind_images", "encode_visual_prompts", "generate_rows", "has_images", "wire_prompt"]


def wire_prompt(prompt: Any) -> Any:
    """A prompt as a worker call carries it: a list of token ids, or the ``VisualPrompt`` / ``ImagePrompt``."""
    from nemo_dp.data.image_rows import is_image_prompt

    return prompt if is_image_prompt(prompt) else list(prompt)


def has_images(batch: Mapping[str, Any]) -> bool:
    """Whether ``batch`` carries image columns."""
    return PIXEL_VALUES in batch


def bind_images(model: torch.nn.Module, batch: Mapping[str, Any]) -> torch.nn.Module:
    """``model`` for the rows of ``batch``: bound to their images when the batch has any.

    Returns ``model.with_images(...)`` for a batch with ``pixel_values`` / ``image_grid_thw``
    ``PackedTensor`` columns (one entry per row), else ``model`` itself.

    Raises:
        ValueError: Only one of the two image columns is present, or the batch has images and
            the model cannot read them.
    """
    present = [f for f in IMAGE_FIELDS if f in batch]
    if not present:
        return model
    if len(present) != len(IMAGE_FIELDS):
        raise ValueError(f"a batch with images needs both {list(IMAGE_FIELDS)}, got only {present}")
    if not hasattr(model, "with_images"):
        raise ValueError(
            f"the batch carries images but the policy's model ({type(model).__name__}) does not read "
            "them; use policy=hf_vlm"
        )
    return model.with_images(batch[PIXEL_VALUES], batch[IMAGE_GRID_THW])


def _processor(worker: Any) -> Any:
    processor = getattr(worker, "_vlm_processor", None)
    if processor is None:
        from nemo_dp.models.builders import build_tokenizer

        processor = getattr(build_tokenizer(worker.cfg), "processor", None)
        if processor is None:
            raise ValueError("visual prompts need a vision-language policy (policy=hf_vlm)")
        worker._vlm_processor = processor
    return processor


def encode_visual_prompts(worker: Any, prompts: Sequence[Any]) -> tuple[list[list[int]], dict[str, Any]]:
    """Token ids per prompt, and the image columns when any prompt is an image prompt.

    ``VisualPrompt`` images are rendered and ``ImagePrompt`` files loaded here; the worker's
    ``policy`` config builds the processor, once.

    Returns:
        ``(token_ids, images)``: ``images`` is ``{}`` for a text-only batch, else
        ``{"pixel_values": PackedTensor, "image_grid_thw": PackedTensor}`` (a text row's
        entries are ``None``).
    """
    from nemo_dp.data.image_rows import is_image_prompt

    if not any(is_image_prompt(p) for p in prompts):
        return [list(p) for p in prompts], {}
    processor = _processor(worker)
    from nemo_dp.models.hf.vlm_processor import EncodedPrompt

    encoded = [
        processor.encode_messages(p.messages()) if is_image_prompt(p) else EncodedPrompt(list(p), None, None)
        for p in prompts
    ]
    ids, pixel_values, grids = processor.pack(encoded)
    return ids, {PIXEL_VALUES: pixel_values, IMAGE_GRID_THW: grids}


def generate_rows(
    worker: Any, prompts: Sequence[Any], seeds: Sequence[int], *, greedy: bool, keep_images: bool = True
) -> BatchedDataDict:
    """Generate for ``prompts`` in chunks of ``generation_batch_size``, one seed per row.

    The policy worker's ``generate`` and the rollout worker both call this, so their rows are
    bit-identical.

    Args:
        worker: The worker: ``cfg`` (the policy config), ``model``, ``eos_id``, ``pad_id``,
            ``precision`` and what :func:`encode_visual_prompts` reads.
        prompts: Token ids per prompt, or image prompts.
        greedy: Argmax decoding instead of sampling.

    Returns:
        The fields of ``nemo_dp.models.generation.generate`` (``input_ids`` padded with
        ``pad_id``), plus the image columns when ``keep_images``.
    """
    gen_cfg = cfg_get(worker.cfg, "generation")
    bs = int(cfg_get(worker.cfg, "generation_batch_size"))
    parts = []
    for s in range(0, len(prompts), bs):
        token_ids, images = encode_visual_prompts(worker, prompts[s : s + bs])
        out = generate(
            bind_images(worker.model, images) if images else worker.model,
            token_ids,
            max_new_tokens=int(cfg_get(gen_cfg, "max_new_tokens")),
            eos_id=worker.eos_id,
            pad_id=worker.pad_id,
            greedy=greedy,
            temperature=float(cfg_get(gen_cfg, "temperature")),
            seeds=[int(x) for x in seeds[s : s + bs]],
            precision=worker.precision,
        )
        parts.append(BatchedDataDict({**out, **(images if keep_images else {})}))
    return BatchedDataDict.from_batches(parts, pad_value_dict={"input_ids": worker.pad_id})
