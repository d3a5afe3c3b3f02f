"""Run-health checks fed one step record at a time, so a run that cannot learn says so."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ZeroAdvantageDetector"]


def _number(record: Mapping[str, Any], key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass
class ZeroAdvantageDetector:
    """Warns once per streak of ``patience`` GRPO steps whose advantages are all zero (every group's rewards
    equal), naming the key to change; the ``*_enabled`` flags tailor the hint, and an
    ``advantage_key`` value at or below ``tolerance`` counts as zero.

    Raises:
        ValueError: ``patience`` < 1 or ``tolerance`` < 0.
    """

    patience: int = 5
    warm_start_enabled: bool = False
    dynamic_sampling_enabled: bool = False
    tolerance: float = 0.0
    advantage_key: str = "advantage_abs_mean"
    reward_key: str = "reward_mean"
    _streak: int = field(default=0, init=False)
    _first_step: int | None = field(default=None, init=False)
    _warned: bool = field(default=False, init=False)
    _rewards: list[float] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if self.patience < 1:
            raise ValueError(f"ZeroAdvantageDetector: patience must be >= 1, got {self.patience}")
        if self.tolerance < 0:
            raise ValueError(f"ZeroAdvantageDetector: tolerance must be >= 0, got {self.tolerance}")

    @property
    def streak(self) -> int:
        return self._streak

    def update(self, step: int, record: Mapping[str, Any]) -> str | None:
        """Feed one step's record (one without a finite ``advantage_key`` changes nothing); return the
        warning on the step the streak reaches ``patience``, else ``None``."""
        adv = _number(record, self.advantage_key)
        if adv is None:
            return None
        if adv > self.tolerance:
            self._streak, self._first_step, self._warned = 0, None, False
            self._rewards.clear()
            return None
        self._streak += 1
        if self._first_step is None:
            self._first_step = step
        reward = _number(record, self.reward_key)
        if reward is not None:
            self._rewards.append(reward)
        if self._streak < self.patience or self._warned:
            return None
        self._warned = True
        return self._message(step)

    def _message(self, step: int) -> str:
        head = (
            f"steps {self._first_step}-{step}: every advantage is 0 ({self.advantage_key} <= "
            f"{self.tolerance:g} for {self._streak} consecutive steps), so loss and gradient are 0 "
            "and the policy does not change"
        )
        rewards = self._rewards
        if rewards and max(rewards) <= 0.0:
            cause = "no sampled response earned any reward: the policy cannot solve a prompt yet"
            if self.warm_start_enabled:
                fix = "lengthen the SFT warm start (algorithm.warm_start.max_steps)"
            else:
                fix = "enable the SFT warm start (algorithm.warm_start.enabled=true)"
            fix += " or start from an SFT run's weights (policy.init_from=<checkpoint>)"
        else:
            cause = "all generations of each prompt got the same reward (zero-std groups)"
            if self.dynamic_sampling_enabled:
                fix = (
                    "raise algorithm.dynamic_sampling.max_gen_batches or "
                    "algorithm.num_generations_per_prompt, or use harder/easier prompts"
                )
            else:
                fix = (
                    "enable dynamic sampling (algorithm.dynamic_sampling.enabled=true) to drop "
                    "zero-std groups, or raise algorithm.num_generations_per_prompt"
                )
        return f"{head}; {cause}; {fix}"
