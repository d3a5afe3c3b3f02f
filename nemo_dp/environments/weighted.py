"""Several weighted rewards: what ``env.rewards`` (or a user's ``env.reward`` function) builds.

A sample's total is the weighted sum, a ``None`` reward adding nothing (as TRL does); each
reward's values come back too (``score_parts``) for ``reward/<fn>`` metrics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nemo_dp.environments.registry import REWARDS, is_function_path
from nemo_dp.environments.user_reward import RewardError, UserReward

__all__ = [
    "WeightedRewards",
    "score_parts",
    "reward_part_means",
    "check_rewards",
    "find_reward_error",
    "PART_PREFIX",
]

#: Key prefix of each reward's per-sample values in a rollout batch and its metric.
PART_PREFIX = "reward/"


class WeightedRewards:
    """A weighted sum of built-in and user rewards, from checked ``registry.reward_entries`` output."""

    def __init__(self, entries: Sequence[Mapping[str, Any]]) -> None:
        self.parts: list[tuple[str, float, Any]] = []
        labels: list[str] = []
        for entry in entries:
            fn = str(entry["fn"])
            scorer = UserReward(fn, key=f"{entry['key']}.fn" if entry["key"] != "env.reward" else "env.reward") \
                if is_function_path(fn) else REWARDS[fn].build(**entry["params"])
            label = fn.rpartition(":")[2] if is_function_path(fn) else fn
            if label in labels:
                label = f"{label}_{len(labels)}"
            labels.append(label)
            self.parts.append((label, float(entry["weight"]), scorer))

    def check(self, columns: Sequence[str]) -> None:
        """Import every user function and check it can be called with the dataset ``columns`` (before Ray).

        Raises:
            ValueError: Naming the entry's key.
        """
        for _, _, scorer in self.parts:
            if isinstance(scorer, UserReward):
                scorer.check(columns)

    def score_parts(self, responses: list[str], answers: Sequence[Any]) -> dict[str, torch.Tensor]:
        """The total and each reward's values; ``answers`` are ``Answer`` (with its row) for user functions.

        Returns:
            ``{"rewards": total float32 [N], "reward/<label>": float32 [N] (NaN = not applicable)}``.

        Raises:
            RewardError: A reward failed (naming it and the sample).
            ValueError: The lists differ in length.
        """
        n = len(responses)
        if len(answers) != n:
            raise ValueError(f"WeightedRewards.score: {n} responses for {len(answers)} answers")
        total = torch.zeros(n, dtype=torch.float64)
        out: dict[str, torch.Tensor] = {}
        for label, weight, scorer in self.parts:
            if isinstance(scorer, UserReward):
                values = torch.tensor(scorer(list(responses), list(answers)), dtype=torch.float64)
            else:
                values = scorer.score(list(responses), list(answers)).to(torch.float64)
                if values.shape != (n,):
                    raise RewardError(label, f"returned shape {tuple(values.shape)} for {n} completions")
            total += torch.nan_to_num(values * weight, nan=0.0)
            out[PART_PREFIX + label] = values.to(torch.float32)
        return {"rewards": total.to(torch.float32), **out}

    def score(self, responses: list[str], answers: Sequence[Any]) -> torch.Tensor:
        """The weighted total per response (float32 ``[N]``); see ``score_parts``."""
        return self.score_parts(responses, answers)["rewards"]


def score_parts(env: Any, responses: list[str], answers: Sequence[Any]) -> dict[str, torch.Tensor]:
    """``{"rewards": ...}`` plus each reward's values when ``env`` combines several (float32 tensors)."""
    if isinstance(env, WeightedRewards):
        return env.score_parts(responses, answers)
    return {"rewards": env.score(responses, answers).to(torch.float32)}


def reward_part_means(batch: Mapping[str, Any]) -> dict[str, float]:
    """``{"reward/<label>": mean}`` over the samples each reward applies to (NaN: none), from a batch or carry."""
    out: dict[str, float] = {}
    for key in batch:
        if str(key).startswith(PART_PREFIX):
            values = batch[key].float()
            ok = ~torch.isnan(values)
            out[str(key)] = float(values[ok].mean()) if bool(ok.any()) else math.nan
    return out


def check_rewards(env_cfg: Any, rewarded: Sequence[tuple[str, Sequence[str]]]) -> None:
    """Build ``env_cfg``'s rewards and check every user function against each rewarded set.

    Run on the driver before Ray starts, so a function that does not import, or cannot take
    a dataset's columns, fails as a configuration error.

    Args:
        rewarded: ``(dataset key, columns)`` of each set whose rows are scored
            (``DatasetReport.reward_columns``).

    Raises:
        ValueError: Naming the reward's key and, for a column mismatch, the dataset key.
    """
    from nemo_dp.environments.registry import make_environment

    env = make_environment(env_cfg)
    if not isinstance(env, WeightedRewards):
        return
    for key, columns in rewarded:
        try:
            env.check(list(columns))
        except ValueError as exc:
            raise ValueError(f"{exc} [scoring {key}]") from exc
    if not rewarded:
        env.check([])


def find_reward_error(exc: BaseException) -> RewardError | None:
    """The ``RewardError`` behind ``exc`` (itself, a Ray task error's cause, or a chained one)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        cur = todo.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(cur, RewardError) and type(cur) is RewardError:
            return cur
        todo.extend([getattr(cur, "cause", None), cur.__cause__, cur.__context__])
    return None
