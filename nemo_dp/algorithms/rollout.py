"""Rollouts and held-out evaluation on top of ``Policy.generate``.

A rollout tokenises prompts, repeats each ``group_size`` times, samples with per-row seeds and
scores the decoded responses; evaluation is greedy with one row per problem.  Used by the legacy
trainers on the driver.
"""

from __future__ import annotations

import math

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nemo_dp.data.arithmetic import Problem
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.environments.weighted import score_parts

__all__ = ["Rollout", "decode_responses", "rollout", "evaluate", "mean_reward"]


@dataclass
class Rollout:
    """One rollout batch.

    Attributes:
        batch: ``input_ids``, ``input_lengths``, ``prompt_lengths``, ``generation_logprobs``,
            ``token_mask``, ``truncated`` (from generation) plus ``rewards`` float32 [N] (and
            each reward's values, ``reward/<fn>``, when ``env.rewards`` lists several).
        responses: Decoded response texts (before eos).
        answers: Reference answers, aligned with the rows.
    """

    batch: BatchedDataDict
    responses: list[str]
    answers: list[str]


def decode_responses(batch: BatchedDataDict, tokenizer: Any) -> list[str]:
    """Decode each row's response tokens (between ``prompt_lengths`` and ``input_lengths``; stops at eos)."""
    ids = batch["input_ids"]
    starts = batch["prompt_lengths"].tolist()
    ends = batch["input_lengths"].tolist()
    return [tokenizer.decode(ids[i, int(s) : int(e)].tolist()) for i, (s, e) in enumerate(zip(starts, ends))]


def rollout(
    policy: Any,
    problems: Sequence[Problem],
    *,
    tokenizer: Any,
    env: Any,
    group_size: int,
    seeds: Sequence[int],
    greedy: bool,
    return_images: bool = True,
) -> Rollout:
    """Generate ``group_size`` responses per problem and score them.

    Rows are grouped: rows ``i * group_size ... (i + 1) * group_size - 1`` answer problem ``i``.

    Args:
        policy: Anything with ``generate(prompts, seeds, greedy=...)``.
        env: Anything with ``score(responses, answers)``.
        seeds: One per row (``len(problems) * group_size``).
        greedy: Argmax decoding.
        return_images: Keep visual prompts' image columns in the batch (needed to train on
            it; evaluation passes False).

    Raises:
        ValueError: If the number of seeds does not match the rows.
    """
    n = len(problems) * group_size
    if len(seeds) != n:
        raise ValueError(f"rollout: {len(seeds)} seeds for {n} rows ({len(problems)} problems x {group_size})")
    prompts = [tokenizer.encode_prompt(p.prompt) for p in problems for _ in range(group_size)]
    answers = [p.answer for p in problems for _ in range(group_size)]
    batch = policy.generate(prompts, list(seeds), greedy=greedy, return_images=return_images)
    responses = decode_responses(batch, tokenizer)
    for key, values in score_parts(env, responses, answers).items():  # rewards, and reward/<fn> of a list
        batch[key] = values
    return Rollout(batch=batch, responses=responses, answers=answers)


def evaluate(
    policy: Any, problems: Sequence[Problem], *, tokenizer: Any, env: Any, num_examples_to_print: int = 0
) -> dict[str, Any]:
    """Greedy exact-match accuracy on held-out problems.

    Returns ``{"val_accuracy": float, "val_samples": int, "examples": [str, ...]}`` with
    ``num_examples_to_print`` ``prompt -> response`` examples.

    Raises:
        ValueError: If ``problems`` is empty.
    """
    if not problems:
        raise ValueError("evaluate: no held-out problems")
    out = rollout(
        policy, problems, tokenizer=tokenizer, env=env, group_size=1, seeds=[0] * len(problems), greedy=True,
        return_images=False,
    )
    rewards = out.batch["rewards"]
    examples = [
        f"{p.prompt}{r!r} (expected {p.answer!r})"
        for p, r in list(zip(problems, out.responses))[:num_examples_to_print]
    ]
    return {"val_accuracy": mean_reward(rewards.tolist()), "val_samples": len(problems), "examples": examples}


def mean_reward(rewards: Sequence[float]) -> float:
    """The mean of per-problem rewards as the one float64 every report uses.

    Summed with ``math.fsum``, so the result depends neither on the rewards' dtype nor on their
    order: training and ``launchers/evaluate.py`` report the same number.

    Raises:
        ValueError: ``rewards`` is empty.
    """
    values = [float(r) for r in rewards]
    if not values:
        raise ValueError("mean_reward: no rewards")
    return math.fsum(values) / len(values)
