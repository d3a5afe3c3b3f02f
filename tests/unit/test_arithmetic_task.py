"""ArithmeticTask: correct answers, determinism from the seed, train/eval disjointness."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_dp.data.arithmetic import ArithmeticTask, Problem, is_eval_problem, make_problem
from nemo_dp.environments.arithmetic_env import ArithmeticEnv


def test_problem_format() -> None:
    assert make_problem(37, "+", 5) == Problem(prompt="37+5=", answer="42")
    assert make_problem(3, "-", 15) == Problem(prompt="3-15=", answer="-12")
    assert make_problem(12, "*", 11) == Problem(prompt="12*11=", answer="132")


@settings(max_examples=60, deadline=None)
@given(digits=st.integers(1, 3), seed=st.integers(0, 10**6), ops=st.sampled_from([("+",), ("+", "-"), ("+", "-", "*")]))
def test_answers_are_correct_and_operands_in_range(digits: int, seed: int, ops: tuple[str, ...]) -> None:
    task = ArithmeticTask(digits, ops, seed)
    for p in task.train_problems(20) + task.eval_problems(5):
        expr = p.prompt[:-1]
        op = next(o for o in ops if o in expr[1:])
        a, b = expr.split(op, 1)
        assert op in ops
        assert 0 <= int(a) < 10**digits and 0 <= int(b) < 10**digits
        assert p.prompt.endswith("=")
        x, y = int(a), int(b)
        assert int(p.answer) == {"+": x + y, "-": x - y, "*": x * y}[op]


def test_deterministic_from_seed() -> None:
    a = ArithmeticTask(2, ("+", "-"), seed=3)
    b = ArithmeticTask(2, ("+", "-"), seed=3)
    c = ArithmeticTask(2, ("+", "-"), seed=4)
    assert a.train_problems(50) == b.train_problems(50)
    assert a.eval_problems(50) == b.eval_problems(50)
    assert a.train_problems(50) != c.train_problems(50)


def test_eval_disjoint_from_train_by_construction() -> None:
    # Whole 2-digit addition space: train (any seed) never meets eval (any seed).
    train = set(ArithmeticTask(2, ("+",), seed=0).train_problems(8000))
    evals = set(ArithmeticTask(2, ("+",), seed=1).eval_problems(800))
    assert len(train) == 8000 and len(evals) == 800
    assert not train & evals
    for p in evals:
        a, b = p.prompt[:-1].split("+")
        assert is_eval_problem(int(a), "+", int(b))


def test_large_space_uses_sampling_and_stays_disjoint() -> None:
    task = ArithmeticTask(4, ("+", "*"), seed=0)
    train, evals = task.train_problems(300), task.eval_problems(300)
    assert len(set(train)) == 300 and len(set(evals)) == 300
    assert not set(train) & set(evals)


def test_errors() -> None:
    with pytest.raises(ValueError, match="digits must be >= 1"):
        ArithmeticTask(0, ("+",), 0)
    with pytest.raises(ValueError, match=r"operator '/' not in"):
        ArithmeticTask(1, ("+", "/"), 0)
    with pytest.raises(ValueError, match="holds only"):
        ArithmeticTask(1, ("+",), 0).eval_problems(100)


def test_env_exact_match() -> None:
    env = ArithmeticEnv()
    r = env.score(["42", "42 ", "4", "42<eos>junk", ""], ["42", "42", "42", "42", "0"])
    assert r.dtype.is_floating_point
    assert r.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="2 responses for 1 answers"):
        env.score(["1", "2"], ["1"])


def test_exact_reward_cuts_where_the_char_tokenizer_renders_eos() -> None:
    from nemo_dp.models.tiny.tokenizer import CharTokenizer
    from nemo_dp.environments.arithmetic_env import EOS_MARKER

    tok = CharTokenizer()
    rendered = tok.decode(tok.encode("42") + [tok.eos_id] + tok.encode("7"), stop_at_eos=False)
    assert rendered == "42" + EOS_MARKER + "7"
    assert ArithmeticEnv().score([rendered, "427"], ["42", "42"]).tolist() == [1.0, 0.0]
