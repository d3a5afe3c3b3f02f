"""The one place that turns ``env.reward`` into a reward environment.

``exact`` is the built-in arithmetic task's exact match (``ArithmeticEnv``); ``math`` is the
final-answer match for users' data (``MathEnv``). ``auto`` (the default) picks ``math`` when
the problems being scored come from a user's file (``env.rl_jsonl`` or ``env.val_jsonl``) and
``exact`` otherwise, so the built-in task keeps its reward bit for bit (an SFT file alone does
not change it: its run is still scored on the generator's held-out problems) and users'
free-text answers are scored by their final answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nemo_dp.environments.arithmetic_env import ArithmeticEnv
from nemo_dp.environments.math_reward import MathEnv

__all__ = ["REWARD_NAMES", "resolve_reward", "make_environment"]

_BUILDERS: dict[str, Callable[[], Any]] = {"exact": ArithmeticEnv, "math": MathEnv}

#: Legal values of ``env.reward``.
REWARD_NAMES: tuple[str, ...] = ("auto", *_BUILDERS)

# The files whose problems (prompt + answer) a reward scores.
_ANSWER_FILE_KEYS: tuple[str, ...] = ("rl_jsonl", "val_jsonl")


def resolve_reward(env_cfg: Any) -> str:
    """The reward ``env_cfg`` selects, with ``auto`` resolved.

    Args:
        env_cfg: The ``env`` node (dataclass or DictConfig); a node without ``reward`` counts as
            ``auto``.

    Returns:
        ``"exact"`` or ``"math"``.

    Raises:
        ValueError: On an unknown ``env.reward`` (naming the legal values).
    """
    name = str(getattr(env_cfg, "reward", "auto") or "auto")
    if name not in REWARD_NAMES:
        raise ValueError(f"env.reward: unknown reward {name!r}; legal values: {list(REWARD_NAMES)}")
    if name != "auto":
        return name
    uses_files = any(getattr(env_cfg, k, None) is not None for k in _ANSWER_FILE_KEYS)
    return "math" if uses_files else "exact"


def make_environment(env_cfg: Any) -> Any:
    """Build the reward environment for ``env_cfg`` (``score(responses, answers)``).

    Args:
        env_cfg: The ``env`` node.

    Returns:
        An ``ArithmeticEnv`` or a ``MathEnv``.

    Raises:
        ValueError: On an unknown ``env.reward``.
    """
    return _BUILDERS[resolve_reward(env_cfg)]()
