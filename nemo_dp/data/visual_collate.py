"""SFT batches with images: token ids with expanded image placeholders, plus the images.

Examples are ``VisualSFTExample`` (the built-in visual task) or ``ImageSFTExample`` (a user's
image jsonl).  Each is encoded as a generation prompt, so SFT learns exactly what a rollout
samples after; images travel as ``PackedTensor`` columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from nemo_dp.data.image_rows import ImageSFTExample, is_image_example
from nemo_dp.data.visual_task import VisualSFTExample
from nemo_dp.utils.packed_tensor import IMAGE_GRID_THW, PIXEL_VALUES
from nemo_dp.distributed.batched_data_dict import BatchedDataDict

__all__ = ["collate_visual_sft"]


def collate_visual_sft(
    examples: Sequence[VisualSFTExample | ImageSFTExample], tokenizer: Any, max_seq_len: int | None = None
) -> BatchedDataDict:
    """Tokenise, right-pad and attach the images of visual SFT examples.

    ``tokenizer`` is a vision-language one (``policy=hf_vlm``; its ``processor`` renders the
    image placeholders).

    Returns:
        ``input_ids``, ``input_lengths``, ``token_mask`` (1 on the response and its eos),
        ``sample_mask`` as ``collate_sft`` gives them, plus ``pixel_values`` and
        ``image_grid_thw`` (``PackedTensor``, one entry per row).

    Raises:
        TypeError: A row is not a ``VisualSFTExample`` or an ``ImageSFTExample``.
        ValueError: The tokenizer has no image processor, or an example is longer than
            ``max_seq_len`` (naming its index).
    """
    processor = getattr(tokenizer, "processor", None)
    if processor is None:
        raise ValueError("collate_sft: visual examples need a vision-language tokenizer (policy=hf_vlm)")
    rows: list[tuple[list[int], int]] = []
    prompts = []
    for i, ex in enumerate(examples):
        if not is_image_example(ex):
            raise TypeError(
                f"collate_sft: example {i} is a {type(ex).__name__}, not a VisualSFTExample or ImageSFTExample"
            )
        enc = processor.encode_messages(ex.prompt.messages())
        ids = list(enc.input_ids) + tokenizer.encode_response(ex.response)
        if max_seq_len is not None and len(ids) > max_seq_len:
            raise ValueError(f"collate_sft: example {i} has {len(ids)} tokens > max_seq_len={max_seq_len}")
        rows.append((ids, len(enc.input_ids)))
        prompts.append(enc)
    _, pixel_values, grids = processor.pack(prompts)
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
    token_mask = torch.zeros((len(rows), width), dtype=torch.int32)
    for i, (ids, prompt_len) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        token_mask[i, prompt_len : len(ids)] = 1
    return BatchedDataDict(
        {
            "input_ids": input_ids,
            "input_lengths": torch.tensor([len(ids) for ids, _ in rows], dtype=torch.int32),
            "token_mask": token_mask,
            "sample_mask": torch.ones(len(rows), dtype=torch.float32),
            PIXEL_VALUES: pixel_values,
            IMAGE_GRID_THW: grids,
        }
    )
