"""Math reward: final-answer extraction (#### > \\boxed{} > last number), exact comparison, and
the reward registry (the built-in task keeps its exact-match reward bit for bit)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nemo_dp.environments import make_environment, resolve_reward
from nemo_dp.environments.arithmetic_env import ArithmeticEnv
from nemo_dp.environments.math_reward import MathEnv, extract_final_answer, reference_answer


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so 40 + 2 = 42\n#### 42", "42"),
        ("#### 1,234", "1234"),
        ("#### 42.\nthen 7", "42"),  # #### wins over a later number
        ("a #### 3 then #### 5", "5"),  # the last ####
        ("#### x = 3", "x = 3"),  # exact text after ####, not a number hunt
        ("the answer is \\boxed{42} (and 7)", "42"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # last box, nested braces
        ("\\boxed{7} #### 8", "8"),  # #### over \boxed
        ("$\\boxed{ 42 }$", "42"),
        ("I think 12, no, 13.", "13"),
        ("5-3=2", "2"),
        ("it is -4", "-4"),
        ("about 0.5 now", "0.5"),
        ("total 1,000,000 apples", "1000000"),
    ],
)
def test_extract_final_answer(text: str, answer: str) -> None:
    assert extract_final_answer(text) == answer


@pytest.mark.parametrize("text", ["", "no digits here", "#### ", "\\boxed{", "####\n"])
def test_no_answer(text: str) -> None:
    assert extract_final_answer(text) is None


def test_reference_answer_is_taken_as_is_unless_marked() -> None:
    assert reference_answer("42") == "42"
    assert reference_answer("40 plus 2 is 42.\n#### 42") == "42"
    assert reference_answer("\\boxed{42}") == "42"
    assert reference_answer(" x = 3 ") == "x = 3"  # no number hunt in the reference


def test_math_env_scores_exactly() -> None:
    env = MathEnv()
    responses = ["so #### 42", "\\boxed{42.0}", "42", "4 2", "41", "", "1,234"]
    answers = ["42", "42", "#### 42", "42", "42", "42", "1234"]
    rewards = env.score(responses, answers)
    assert rewards.dtype == torch.float32
    assert rewards.tolist() == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="2 responses for 1 answers"):
        env.score(["a", "b"], ["a"])


def _env(**kw: object) -> SimpleNamespace:
    base = {"sft_jsonl": None, "rl_jsonl": None, "val_jsonl": None, "reward": "auto"}
    base.update(kw)
    return SimpleNamespace(**base)


def test_registry_auto_keeps_exact_for_the_built_in_task() -> None:
    assert resolve_reward(_env()) == "exact"
    assert isinstance(make_environment(_env()), ArithmeticEnv)
    assert resolve_reward(SimpleNamespace(sft_jsonl=None, rl_jsonl=None, val_jsonl=None)) == "exact"
    for key in ("rl_jsonl", "val_jsonl"):
        assert isinstance(make_environment(_env(**{key: "x.jsonl"})), MathEnv)
    # An SFT file alone: the run is still scored on the generator's held-out problems.
    assert isinstance(make_environment(_env(sft_jsonl="x.jsonl")), ArithmeticEnv)
    assert isinstance(make_environment(_env(rl_jsonl="x.jsonl", reward="exact")), ArithmeticEnv)
    assert isinstance(make_environment(_env(reward="math")), MathEnv)
    with pytest.raises(ValueError, match=r"env.reward: unknown reward 'fuzzy'; legal values: \['auto', 'exact', 'math'\]"):
        make_environment(_env(reward="fuzzy"))


def test_exact_reward_unchanged_on_arithmetic_responses() -> None:
    # The built-in task's reward: the response before eos must equal the answer exactly.
    responses = ["42", "42<eos>junk", " 42", "042", "x42", "4"]
    answers = ["42"] * 6
    assert ArithmeticEnv().score(responses, answers).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert make_environment(_env()).score(responses, answers).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
