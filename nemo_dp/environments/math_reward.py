r"""A verifiable reward for math-style answers in free text.

The final answer is the text after the last ``####``, else the last ``\boxed{...}``, else the
last number; the reference goes through the first two rules only.  Both sides are minimally
normalised and compared exactly (``"42.0"`` does not match ``"42"``); no answer scores 0.
"""

from __future__ import annotations

import re
from typing import Optional

import torch

__all__ = ["extract_final_answer", "normalize_answer", "reference_answer", "MathEnv"]

_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_GROUPED = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_BOXED = "\\boxed{"


def normalize_answer(text: str) -> str:
    """Strip whitespace, ``$`` at either end, one trailing period and thousands separators."""
    out = text.strip().strip("$").strip()
    if out.endswith(".") and not out.endswith(".."):
        out = out[:-1].rstrip()
    if _GROUPED.match(out):
        out = out.replace(",", "")
    return out


def _after_hashes(text: str) -> Optional[str]:
    pos = text.rfind("####")
    if pos < 0:
        return None
    rest = text[pos + 4 :].split("\n", 1)[0]
    return rest if rest.strip() else None


def _last_boxed(text: str) -> Optional[str]:
    pos = text.rfind(_BOXED)
    if pos < 0:
        return None
    depth, start = 1, pos + len(_BOXED)
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def _marked(text: str) -> Optional[str]:
    found = _after_hashes(text)
    return _last_boxed(text) if found is None else found


def extract_final_answer(text: str) -> Optional[str]:
    """The normalised final answer a response gives, or None (rules in the module docstring)."""
    found = _marked(text)
    if found is not None:
        return normalize_answer(found) or None
    numbers = _NUMBER.findall(text)
    return normalize_answer(numbers[-1]) if numbers else None


def reference_answer(answer: str) -> str:
    """The normalised reference: after ``####`` / inside ``\\boxed{}`` when present, else as is."""
    found = _marked(answer)
    return normalize_answer(answer if found is None else found)


class MathEnv:
    """Final-answer exact match: 1.0 when the response's final answer equals the reference."""

    def score(self, responses: list[str], answers: list[str]) -> torch.Tensor:
        """Float32 ``[N]`` scores (``ValueError`` when the lists differ in length)."""
        if len(responses) != len(answers):
            raise ValueError(f"MathEnv.score: {len(responses)} responses for {len(answers)} answers")
        rewards = []
        for response, answer in zip(responses, answers):
            got = extract_final_answer(response)
            rewards.append(float(got is not None and got == reference_answer(answer)))
        return torch.tensor(rewards, dtype=torch.float32)
