"""Reward functions from the user's code, called the way TRL calls them.

Named ``package.module:function`` or ``path/to/file.py:function``; called with ``completions``,
``prompts`` and every other dataset column as keyword arguments (only those named, without
``**kwargs``), returning one number or ``None`` per completion.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Optional

__all__ = ["UserReward", "RewardError", "load_function"]

_FIXED = ("completions", "prompts")


class RewardError(RuntimeError):
    """A reward function failed or returned something unusable while scoring.

    Attributes:
        reward: The reward's label (its ``fn`` setting).
        detail: What went wrong, naming the sample where one is at fault.
        step: The training step, once known (``with_step``).
    """

    def __init__(self, reward: str, detail: str, step: Optional[int] = None) -> None:
        self.reward, self.detail, self.step = reward, detail, step
        at = f" at step {step}" if step is not None else ""
        super().__init__(f"reward {reward!r}{at}: {detail}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (RewardError, (self.reward, self.detail, self.step))

    def with_step(self, step: int) -> RewardError:
        """The same error naming the step it happened at."""
        return RewardError(self.reward, self.detail, step)


def _split(spec: str, key: str) -> tuple[str, str]:
    target, _, name = spec.rpartition(":")
    if not target or not name or not name.isidentifier():
        raise ValueError(
            f"{key}: {spec!r} is not 'package.module:function' or 'path/to/file.py:function'"
        )
    return target, name


def _module(target: str, key: str) -> Any:
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = os.path.abspath(target)
        if not os.path.isfile(path):
            raise ValueError(f"{key}: reward file {target!r} does not exist (resolved to {path})")
        # One module per file version and process: a worker receives the reward with every
        # batch and must not re-run the file each time (module state, such as a counter, lives on).
        version = f"{path}:{os.stat(path).st_mtime_ns}"
        name = "nemo_dp_user_reward_" + hashlib.sha1(version.encode()).hexdigest()[:12]
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ValueError(f"{key}: {target!r} cannot be loaded as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # as an import would (dataclasses and pickle look it up)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise ValueError(f"{key}: importing reward file {target!r} failed: {type(exc).__name__}: {exc}") from exc
        return module
    try:
        return importlib.import_module(target)
    except Exception as exc:
        raise ValueError(
            f"{key}: cannot import reward module {target!r}: {type(exc).__name__}: {exc} (is its directory on "
            "PYTHONPATH? a file path 'path/to/file.py:function' works too)"
        ) from exc


def load_function(spec: str, *, key: str) -> Callable[..., Any]:
    """Import the function ``spec`` (``package.module:function`` or ``path/to/file.py:function``) names.

    ``key`` is the config key that names it (in errors).

    Raises:
        ValueError: The module does not import, has no such attribute, or it is not callable.
    """
    target, name = _split(spec, key)
    module = _module(target, key)
    fn = getattr(module, name, None)
    if fn is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ValueError(f"{key}: {target!r} has no function {name!r} (its functions: {public})")
    if not callable(fn):
        raise ValueError(f"{key}: {spec!r} is a {type(fn).__name__}, not a function")
    return fn


def _accepts(fn: Callable[..., Any]) -> tuple[bool, set[str], set[str]]:
    """``(has **kwargs, named keyword parameters, required ones)`` of ``fn``."""
    params = inspect.signature(fn).parameters.values()
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    required = {
        p.name
        for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.POSITIONAL_ONLY)
    }
    positional_only = {p.name for p in params if p.kind is p.POSITIONAL_ONLY}
    return var_kw, named, required | positional_only


class UserReward:
    """A user's reward function, loaded on first use (also after being sent to a worker).

    Args:
        spec: As :func:`load_function`; a relative file path is made absolute here, on the driver.

    Raises:
        ValueError: A malformed ``spec``.
    """

    def __init__(self, spec: str, *, key: str) -> None:
        target, name = _split(spec, key)
        if target.endswith(".py") or "/" in target or os.sep in target:
            target = os.path.abspath(target)
        self.spec = f"{target}:{name}"
        self.label = spec
        self.key = key
        self._fn: Optional[Callable[..., Any]] = None

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "label": self.label, "key": self.key, "_fn": None}

    @property
    def fn(self) -> Callable[..., Any]:
        """The function (imported on first access)."""
        if self._fn is None:
            self._fn = load_function(self.spec, key=self.key)
        return self._fn

    def check(self, columns: Sequence[str]) -> None:
        """Refuse, before any rollout, a function that cannot be called with the dataset ``columns``.

        Raises:
            ValueError: It does not import, takes no ``completions``, or needs an argument that
                no column gives.
        """
        fn = self.fn
        try:
            var_kw, named, required = _accepts(fn)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{self.key}: the signature of {self.label!r} cannot be read: {exc}") from exc
        if "completions" not in named and not var_kw:
            raise ValueError(
                f"{self.key}: {self.label!r} must take a 'completions' keyword argument (TRL's reward "
                "signature: def reward(completions, **kwargs) -> list[float])"
            )
        given = set(_FIXED) | set(columns)
        unmet = sorted(required - given)
        if unmet:
            raise ValueError(
                f"{self.key}: {self.label!r} requires {unmet}, which no dataset column gives (columns: "
                f"{sorted(columns)}, plus completions and prompts)"
            )

    def __call__(self, responses: list[str], answers: Sequence[Any]) -> list[float]:
        """One float per response; ``None`` results (the reward does not apply) become NaN.

        ``answers`` are aligned with ``responses``; an ``Answer`` carries its dataset row.

        Raises:
            RewardError: It raised, or returned the wrong count or a non-number (naming the
                sample).
        """
        n = len(responses)
        chat = [bool(getattr(a, "chat", False)) for a in answers]
        completions = [[{"role": "assistant", "content": r}] if c else r for r, c in zip(responses, chat)]
        kwargs: dict[str, Any] = {"completions": completions, "prompts": [getattr(a, "prompt", None) for a in answers]}
        names: list[str] = []
        for a in answers:
            for name in getattr(a, "columns", {"answer": str(a)}):
                if name not in names:
                    names.append(name)
        for name in names:
            if name not in kwargs:
                kwargs[name] = [getattr(a, "columns", {"answer": str(a)}).get(name) for a in answers]
        var_kw, named, _ = _accepts(self.fn)
        if not var_kw:
            kwargs = {k: v for k, v in kwargs.items() if k in named}
        try:
            out = self.fn(**kwargs)
        except Exception as exc:
            first = kwargs.get("prompts", [None])[0] if "prompts" in kwargs else getattr(answers[0], "prompt", None)
            raise RewardError(
                self.label,
                f"raised {type(exc).__name__}: {exc} (scoring {n} samples; sample 0's prompt: {_short(first)})",
            ) from exc
        try:
            values = list(out)
        except TypeError:
            raise RewardError(self.label, f"returned {type(out).__name__}, not a list of {n} numbers") from None
        if len(values) != n:
            raise RewardError(self.label, f"returned {len(values)} values for {n} completions; give one per completion")
        result = []
        for i, v in enumerate(values):
            if v is None:
                result.append(math.nan)
                continue
            if not isinstance(v, numbers.Real):
                raise RewardError(
                    self.label,
                    f"returned {type(v).__name__} {v!r} for sample {i} (prompt {_short(getattr(answers[i], 'prompt', None))}); "
                    "give a float, or None where the reward does not apply",
                )
            f = float(v)
            if math.isinf(f):
                raise RewardError(self.label, f"returned {f} for sample {i}; rewards must be finite (or None)")
            result.append(f)
        return result


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
