"""Rollouts and held-out evaluation on top of ``Policy.generate``, for the legacy trainers on the driver."""

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
        batch: The generation fields plus ``rewards`` float32 [N] (and ``reward/<fn>`` per reward of a list).
        responses: Decoded response texts (before eos).
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
    """Generate ``group_size`` responses per problem (consecutive rows) and score them.

    ``return_images`` keeps visual prompts' image columns (needed to train on the batch).

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
    """Greedy exact-match accuracy: ``{"val_accuracy", "val_samples", "examples"}``.

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
    """The mean reward as the one float64 every report uses (``math.fsum``: independent of dtype and order).

    Raises:
        ValueError: ``rewards`` is empty.
    """
    values = [float(r) for r in rewards]
    if not values:
        raise ValueError("mean_reward: no rewards")
    return math.fsum(values) / len(values)
