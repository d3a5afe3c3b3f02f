"""KV-cached sampling from any ``CausalLM``: each row samples (Gumbel-max) from its own generator seeded
with ``seeds[i]``, so a sample depends only on prompt, seed and weights, however prompts are batched."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from nemo_dp.models.precision import FULL_PRECISION, Precision
from nemo_dp.models.protocol import CausalLM

__all__ = ["generate"]


def _validate(
    model: CausalLM, prompts: list[list[int]], max_new_tokens: int, greedy: bool, temperature: float, seeds: list[int]
) -> None:
    if not prompts:
        raise ValueError("generate: prompts must not be empty")
    if len(seeds) != len(prompts):
        raise ValueError(f"generate: got {len(seeds)} seeds for {len(prompts)} prompts")
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"generate: prompt {i} is empty")
    if max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
    if not greedy and temperature <= 0.0:
        raise ValueError(f"generate: temperature must be > 0 when sampling, got {temperature}")
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > model.max_positions:
        raise ValueError(
            f"generate: longest prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds "
            f"the model's max positions ({model.max_positions})"
        )


@torch.no_grad()
def generate(
    model: CausalLM, prompts: list[list[int]], *, max_new_tokens: int, eos_id: int, pad_id: int, greedy: bool,
    temperature: float, seeds: list[int], precision: Precision = FULL_PRECISION,
) -> dict[str, Any]:
    """Generate a response for each prompt (left-padded internally, returned right-padded).

    Args:
        prompts: Token ids per prompt (bos included by the caller).
        max_new_tokens: Most tokens to generate per row (eos included).
        greedy: Argmax decoding (seeds are then unused).
        temperature: Sampling temperature (> 0 when not greedy).
        precision: The forwards run in its autocast; the sampling itself always in float32.

    Returns:
        ``input_ids`` int64 [B, S], ``input_lengths`` / ``prompt_lengths`` int32 [B],
        ``generation_logprobs`` float32 [B, S] (under softmax(logits/temperature); 0 off the
        response), ``token_mask`` int32 [B, S] (response, eos included), ``truncated`` bool [B].

    Raises:
        ValueError: A bad argument or a sequence beyond the model's ``max_positions``.
    """
    _validate(model, prompts, max_new_tokens, greedy, temperature, seeds)
    was_training = model.training
    model.eval()
    device = next(iter(model.parameters())).device
    try:
        # One outer autocast region: autocast caches its bfloat16 weight copies until the outermost
        # region exits, so the weights are cast once per call instead of once per token.
        with precision.autocast(device):
            return _generate(model, prompts, max_new_tokens, eos_id, pad_id, greedy, temperature, seeds, precision)
    finally:
        model.train(was_training)


def _generate(
    model: CausalLM, prompts: list[list[int]], max_new_tokens: int, eos_id: int, pad_id: int, greedy: bool,
    temperature: float, seeds: list[int], precision: Precision,
) -> dict[str, Any]:
    device = next(iter(model.parameters())).device
    bsz = len(prompts)
    plens = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    width = int(plens.max())
    total = width + max_new_tokens
    offsets = width - plens

    left = torch.full((bsz, width), pad_id, dtype=torch.long)
    key_valid = torch.zeros((bsz, total), dtype=torch.bool)
    for i, p in enumerate(prompts):
        left[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        key_valid[i, width - len(p) :] = True
    positions = (torch.arange(width).unsqueeze(0) - offsets.unsqueeze(1)).clamp(min=0)
    key_valid_dev = key_valid.to(device)

    with precision.autocast(device):
        logits, cache = model.prefill(left.to(device), key_valid_dev[:, :width], positions.to(device), total)
    logits = logits.float().cpu()

    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    new_tokens = torch.full((bsz, max_new_tokens), pad_id, dtype=torch.long)
    new_logprobs = torch.zeros((bsz, max_new_tokens), dtype=torch.float32)
    finished = torch.zeros(bsz, dtype=torch.bool)
    resp_len = torch.zeros(bsz, dtype=torch.long)
    vocab = logits.shape[-1]

    for t in range(max_new_tokens):
        if greedy:
            scores = logits
            tok = logits.argmax(dim=-1)
        else:
            scores = logits / temperature
            noise = torch.empty((bsz, vocab), dtype=torch.float32)
            for i in range(bsz):
                noise[i] = 0.5 if finished[i] else torch.rand(vocab, generator=gens[i])
            gumbel = -torch.log(-torch.log(noise))
            tok = (scores + gumbel).argmax(dim=-1)
        logp = F.log_softmax(scores, dim=-1).gather(1, tok.unsqueeze(1)).squeeze(1)
        active = ~finished
        new_tokens[active, t] = tok[active]
        new_logprobs[active, t] = logp[active]
        resp_len += active.long()
        finished |= active & (tok == eos_id)
        if bool(finished.all()) or t == max_new_tokens - 1:
            break
        step_pos = (plens + t).unsqueeze(1)
        key_valid_dev[:, width + t] = True
        with precision.autocast(device):
            logits, cache = model.decode(
                tok.unsqueeze(1).to(device), step_pos.to(device), key_valid_dev[:, : width + t + 1], cache
            )
        logits = logits.float().cpu()

    lengths = plens + resp_len
    seq = int(lengths.max())
    input_ids = torch.full((bsz, seq), pad_id, dtype=torch.long)
    gen_lp = torch.zeros((bsz, seq), dtype=torch.float32)
    token_mask = torch.zeros((bsz, seq), dtype=torch.int32)
    for i, p in enumerate(prompts):
        pl, rl = len(p), int(resp_len[i])
        input_ids[i, :pl] = torch.tensor(p, dtype=torch.long)
        input_ids[i, pl : pl + rl] = new_tokens[i, :rl]
        gen_lp[i, pl : pl + rl] = new_logprobs[i, :rl]
        token_mask[i, pl : pl + rl] = 1
    return {
        "input_ids": input_ids,
        "input_lengths": lengths.to(torch.int32),
        "prompt_lengths": plens.to(torch.int32),
        "generation_logprobs": gen_lp,
        "token_mask": token_mask,
        "truncated": ~finished,
    }
