"""The reward registry: built-in rewards (``exact``, ``math``, ``format``) and the config's choice.

``auto`` picks ``math`` for problems from a user's file and ``exact`` otherwise; a value with a
``:`` is a user's function (``nemo_dp.environments.user_reward``).
"""

from __future__ import annotations

import math as _math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

import torch

from nemo_dp.environments.arithmetic_env import EOS_MARKER, ArithmeticEnv
from nemo_dp.environments.math_reward import MathEnv, extract_final_answer

__all__ = [
    "RewardSpec",
    "REWARDS",
    "register_reward",
    "reward_spec",
    "single_reward_names",
    "is_function_path",
    "resolve_reward",
    "reward_entries",
    "check_reward_entry",
    "make_environment",
    "answer_extractor",
    "FormatReward",
]


@dataclass(frozen=True)
class RewardSpec:
    """One registered reward.

    Attributes:
        build: Builds the scorer (``score(responses, answers)`` -> float ``[N]``) from ``params``.
        extract: The answer a response gives (what evaluation reports), or None if it compares none.
        params: The required entry keys besides ``fn`` and ``weight``.
    """

    name: str
    build: Callable[..., Any]
    extract: Optional[Callable[[str], Optional[str]]] = None
    params: tuple[str, ...] = ()


#: Every registered reward, by name.
REWARDS: dict[str, RewardSpec] = {}


def register_reward(spec: RewardSpec) -> RewardSpec:
    """Add ``spec`` to the registry and return it (re-registering an equal spec is a no-op).

    Raises:
        ValueError: The name is taken, is ``auto`` or holds a ``:``.
    """
    if spec.name == "auto" or ":" in spec.name or not spec.name:
        raise ValueError(f"register_reward: {spec.name!r} cannot name a reward ('auto' and ':' are reserved)")
    if spec.name in REWARDS and REWARDS[spec.name] != spec:
        raise ValueError(f"register_reward: a reward named {spec.name!r} is already registered")
    REWARDS[spec.name] = spec
    return spec


def reward_spec(name: str, *, key: str = "env.reward") -> RewardSpec:
    """The registered reward ``name``; raises ``ValueError`` naming the legal ones (``key``: the config key)."""
    if name not in REWARDS:
        legal = list(single_reward_names()) if key == "env.reward" else list(REWARDS)
        raise ValueError(
            f"{key}: unknown reward {name!r}; legal values: {legal} or a function "
            "('package.module:function' or 'path/to/file.py:function')"
        )
    return REWARDS[name]


def single_reward_names() -> tuple[str, ...]:
    """Legal built-in values of ``env.reward``: ``auto`` and every reward without parameters."""
    return ("auto", *(n for n, s in REWARDS.items() if not s.params))


def is_function_path(value: str) -> bool:
    """Whether a reward setting names a user's function (``module:function``, ``file.py:function``)."""
    return ":" in value


class FormatReward:
    """1.0 when the whole response matches the regex ``pattern`` (DOTALL); ``ValueError`` if it does not compile."""

    def __init__(self, pattern: str) -> None:
        try:
            self.regex = re.compile(str(pattern), re.DOTALL)
        except re.error as exc:
            raise ValueError(f"pattern {pattern!r} is not a regular expression: {exc}") from None
        self.pattern = str(pattern)

    def score(self, responses: list[str], answers: list[str]) -> torch.Tensor:
        """Float32 ``[N]`` scores (``ValueError`` when the lists differ in length)."""
        if len(responses) != len(answers):
            raise ValueError(f"FormatReward.score: {len(responses)} responses for {len(answers)} answers")
        return torch.tensor([float(self.regex.fullmatch(r) is not None) for r in responses], dtype=torch.float32)


register_reward(RewardSpec("exact", lambda: ArithmeticEnv(), lambda response: response.split(EOS_MARKER, 1)[0]))
register_reward(RewardSpec("math", lambda: MathEnv(), extract_final_answer))
register_reward(RewardSpec("format", lambda pattern: FormatReward(pattern), None, ("pattern",)))

# The files whose problems (prompt + answer) a reward scores.
_ANSWER_FILE_KEYS: tuple[str, ...] = ("rl_data", "val_data", "rl_jsonl", "val_jsonl")


def _auto(env_cfg: Any) -> str:
    uses_files = any(getattr(env_cfg, k, None) is not None for k in _ANSWER_FILE_KEYS)
    return "math" if uses_files else "exact"


def _get(node: Any, name: str, default: Any = None) -> Any:
    return node.get(name, default) if isinstance(node, Mapping) else getattr(node, name, default)


def reward_entries(env_cfg: Any) -> list[dict[str, Any]]:
    """The rewards ``env_cfg`` selects, as ``{"key", "fn", "weight", "params"}`` entries (``auto`` resolved).

    Raises:
        ValueError: ``env.reward`` and ``env.rewards`` both set, an empty list, or an entry without ``fn``.
    """
    name = str(_get(env_cfg, "reward", "auto") or "auto")
    items = _get(env_cfg, "rewards", None)
    if items is None:
        fn = _auto(env_cfg) if name == "auto" else name
        return [{"key": "env.reward", "fn": fn, "weight": 1.0, "params": {}}]
    if name != "auto":
        raise ValueError(
            f"env.reward and env.rewards are both set (env.reward={name!r}); give one: env.rewards "
            "for several weighted rewards, env.reward for one"
        )
    if len(items) == 0:
        raise ValueError("env.rewards: must not be empty; give at least one {fn: ..., weight: ...} entry or null")
    out = []
    for i, item in enumerate(items):
        key = f"env.rewards[{i}]"
        fn = _get(item, "fn", None)
        if fn is None or not str(fn).strip():
            raise ValueError(f"{key}.fn: must name a reward (e.g. math, format) or a function 'module:function'")
        fn = str(fn)
        params = {p: _get(item, p) for p in ("pattern",) if _get(item, p) is not None}
        out.append({"key": key, "fn": _auto(env_cfg) if fn == "auto" else fn, "weight": float(_get(item, "weight", 1.0)),
                    "params": params})
    return out


def check_reward_entry(entry: Mapping[str, Any]) -> None:
    """Refuse a built-in entry's unknown name, missing or unexpected parameters, bad weight (user functions: form only).

    Raises:
        ValueError: Naming the entry's key.
    """
    key, fn, weight, params = entry["key"], entry["fn"], entry["weight"], entry["params"]
    if not _math.isfinite(weight):
        raise ValueError(f"{key}.weight: must be a finite number, got {weight!r}")
    if is_function_path(fn):
        if params:
            raise ValueError(f"{key}: {sorted(params)} apply only to built-in rewards, not to function {fn!r}")
        return
    spec = reward_spec(fn, key=f"{key}.fn" if key != "env.reward" else key)
    missing = [p for p in spec.params if p not in params]
    extra = [p for p in params if p not in spec.params]
    if missing:
        raise ValueError(f"{key}: reward {fn!r} needs {missing} (e.g. {{fn: {fn}, {missing[0]}: ...}} in env.rewards)")
    if extra:
        raise ValueError(f"{key}: reward {fn!r} takes no {extra}")
    spec.build(**params)


def resolve_reward(env_cfg: Any) -> str:
    """The single reward ``env_cfg`` selects: a registered name, a function path, or ``"rewards"`` for a list.

    Raises:
        ValueError: On an unknown ``env.reward``.
    """
    entries = reward_entries(env_cfg)
    if len(entries) > 1 or entries[0]["key"] != "env.reward":
        return "rewards"
    fn = entries[0]["fn"]
    if not is_function_path(fn):
        reward_spec(fn)
    return fn


def answer_extractor(env_cfg: Any) -> Callable[[str], Optional[str]]:
    """The answer extraction of the first reward that compares answers; else the response up to ``eos``.

    Raises:
        ValueError: On an unknown reward setting.
    """
    for entry in reward_entries(env_cfg):
        fn = entry["fn"]
        if not is_function_path(fn):
            spec = reward_spec(fn, key=entry["key"])
            if spec.extract is not None:
                return spec.extract
    return REWARDS["exact"].extract  # type: ignore[return-value]


def make_environment(env_cfg: Any) -> Any:
    """The reward environment for ``env_cfg``: a built-in scorer, or ``WeightedRewards`` for a function or a list.

    Raises:
        ValueError: On an unknown or malformed reward setting (naming the key).
    """
    entries = reward_entries(env_cfg)
    for entry in entries:
        check_reward_entry(entry)
    if len(entries) == 1 and entries[0]["key"] == "env.reward" and not is_function_path(entries[0]["fn"]):
        return REWARDS[entries[0]["fn"]].build()
    from nemo_dp.environments.weighted import WeightedRewards

    return WeightedRewards(entries)
