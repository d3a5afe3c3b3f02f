"""Rewards from the user's code and weighted reward lists: TRL's calling convention, the
weighted total (``None`` adds nothing), the format reward, and every way reward code can be
wrong failing with a message that names the function and the sample (at config time where
possible). The functions live in files written by each test, imported by path as a user's are.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from nemo_dp.config.env import EnvConfig, RewardItem
from nemo_dp.data.answer import with_row
from nemo_dp.environments import make_environment
from nemo_dp.environments.arithmetic_env import ArithmeticEnv
from nemo_dp.environments.user_reward import RewardError, UserReward
from nemo_dp.environments.weighted import (
    WeightedRewards,
    check_rewards,
    find_reward_error,
    reward_part_means,
    score_parts,
)

REWARDS_PY = '''
seen = {}

def correct(completions, solution, **kwargs):
    seen["kwargs"] = sorted(kwargs)
    seen["prompts"] = kwargs["prompts"]
    return [1.0 if c.strip() == s else 0.0 for c, s in zip(completions, solution)]

def chatty(completions, **kwargs):
    seen["completions"] = completions
    return [float(len(c[0]["content"])) for c in completions]

def only_hard(completions, level):
    return [None if lv == 0 else 0.5 for lv in level]

def no_completions(prompts):
    return [0.0] * len(prompts)

def needs_missing(completions, difficulty):
    return [0.0] * len(completions)

def short(completions, **kwargs):
    return [1.0]

def text(completions, **kwargs):
    return ["high"] * len(completions)

def boom(completions, **kwargs):
    raise ZeroDivisionError("division by zero in my reward")

not_a_function = 3
'''


@pytest.fixture
def rewards_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARDS_PY)
    return path


def _answers(chat: bool = False) -> list[Any]:
    rows = [("1+1=", "2", 0), ("2+3=", "5", 1), ("4+4=", "8", 2)]
    return [
        with_row(s, [{"role": "user", "content": q}] if chat else q, chat=chat, columns={"solution": s, "level": lv})
        for q, s, lv in rows
    ]


def _env(*entries: dict[str, Any], **kw: Any) -> Any:
    return EnvConfig(rewards=[RewardItem(**e) for e in entries], **kw)


def test_a_trl_reward_function_by_file_path_gets_completions_prompts_and_columns(rewards_file: Path) -> None:
    env = make_environment(EnvConfig(reward=f"{rewards_file}:correct"))
    assert isinstance(env, WeightedRewards)
    out = score_parts(env, ["2", "4", " 8"], _answers())
    assert out["rewards"].tolist() == [1.0, 0.0, 1.0]
    module = sys.modules[env.parts[0][2].fn.__module__]
    assert module.seen["kwargs"] == ["level", "prompts"]
    assert module.seen["prompts"] == ["1+1=", "2+3=", "4+4="]


def test_chat_rows_give_message_lists(rewards_file: Path) -> None:
    env = make_environment(EnvConfig(reward=f"{rewards_file}:chatty"))
    env.score(["ab", "c", ""], _answers(chat=True))
    module = sys.modules[env.parts[0][2].fn.__module__]
    assert module.seen["completions"][0] == [{"role": "assistant", "content": "ab"}]


def test_a_module_path_works_too(rewards_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(rewards_file.parent))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    env = make_environment(EnvConfig(reward="my_rewards:correct"))
    assert env.score(["2", "5", "9"], _answers()).tolist() == [1.0, 1.0, 0.0]


def test_weighted_total_none_adds_nothing_and_each_mean_is_logged(rewards_file: Path) -> None:
    env = make_environment(
        _env(
            {"fn": "format", "weight": 0.5, "pattern": "[0-9]+"},
            {"fn": f"{rewards_file}:correct", "weight": 2.0},
            {"fn": f"{rewards_file}:only_hard", "weight": 1.0},
        )
    )
    out = score_parts(env, ["2", "x4", "8"], _answers())
    # format: 1, 0, 1; correct: 1, 0, 1; only_hard: None, 0.5, 0.5
    assert out["rewards"].tolist() == [0.5 + 2.0, 0.5, 0.5 + 2.0 + 0.5]
    assert torch.isnan(out["reward/only_hard"][0])
    means = reward_part_means(out)
    assert means == {"reward/format": pytest.approx(2 / 3), "reward/correct": pytest.approx(2 / 3), "reward/only_hard": 0.5}


def test_a_single_built_in_reward_stays_its_own_scorer() -> None:
    env = make_environment(EnvConfig())
    assert isinstance(env, ArithmeticEnv)
    assert list(score_parts(env, ["2"], ["2"])) == ["rewards"]
    listed = make_environment(_env({"fn": "exact"}, {"fn": "math", "weight": 0.5}))
    assert listed.score(["2", "#### 3"], ["2", "3"]).tolist() == [1.5, 0.5]


def test_the_user_function_is_sent_by_spec_and_reloaded(rewards_file: Path) -> None:
    reward = UserReward(f"{rewards_file}:correct", key="env.reward")
    reward.fn  # loaded on the driver
    copy = pickle.loads(pickle.dumps(reward))
    assert copy._fn is None and copy.spec == f"{rewards_file}:correct"
    assert copy(["2"], _answers()[:1]) == [1.0]
    # A worker gets the reward with every batch: the file runs once per process, so module
    # state lives on between batches.
    assert pickle.loads(pickle.dumps(reward)).fn is copy.fn is reward.fn
    answer = pickle.loads(pickle.dumps(_answers()[1]))
    assert answer == "5" and answer.columns == {"solution": "5", "level": 1} and answer.prompt == "2+3="


def test_relative_file_paths_are_resolved_on_the_driver(rewards_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(rewards_file.parent)
    assert UserReward("my_rewards.py:correct", key="env.reward").spec == f"{rewards_file}:correct"


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("missing_file.py:f", r"env.reward: reward file '.*/missing_file.py' does not exist"),
        ("no_such_pkg.mod:f", r"env.reward: cannot import reward module 'no_such_pkg.mod': ModuleNotFoundError"),
        ("{file}:nope", r"env.reward: '.*my_rewards.py' has no function 'nope' \(its functions: \['boom', 'chatty', "),
        ("{file}:not_a_function", r"is a int, not a function"),
        ("{file}:no_completions", r"must take a 'completions' keyword argument \(TRL's reward signature"),
        ("{file}:needs_missing", r"requires \['difficulty'\], which no dataset column gives \(columns: \['level', "
         r"'solution'\], plus completions and prompts\) \[scoring env.rl_data\]"),
    ],
)
def test_bad_reward_code_fails_before_ray(rewards_file: Path, fn: str, message: str) -> None:
    env_cfg = EnvConfig(reward=fn.format(file=rewards_file))
    with pytest.raises(ValueError, match=message):
        check_rewards(env_cfg, [("env.rl_data", ("solution", "level"))])


def test_broken_file_names_the_error(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import nonexistent_module_xyz\n")
    with pytest.raises(ValueError, match=r"importing reward file '.*broken.py' failed: ModuleNotFoundError"):
        check_rewards(EnvConfig(reward=f"{tmp_path}/broken.py:f"), [])


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("short", r"^reward '.*my_rewards.py:short': returned 1 values for 3 completions; give one per completion$"),
        ("text", r"returned str 'high' for sample 0 \(prompt '1\+1='\); give a float, or None"),
        ("boom", r"raised ZeroDivisionError: division by zero in my reward \(scoring 3 samples; sample 0's prompt: '1\+1='\)"),
    ],
)
def test_bad_reward_results_name_the_function_and_the_sample(rewards_file: Path, fn: str, message: str) -> None:
    env = make_environment(EnvConfig(reward=f"{rewards_file}:{fn}"))
    with pytest.raises(RewardError, match=message) as info:
        env.score(["1", "2", "3"], _answers())
    stepped = info.value.with_step(7)
    assert str(stepped).startswith(f"reward '{rewards_file}:{fn}' at step 7: ")
    # Found behind the wrappers a Ray task error or a re-raise puts around it.
    try:
        try:
            raise info.value
        except RewardError as exc:
            raise RuntimeError("worker failed") from exc
    except RuntimeError as outer:
        assert find_reward_error(outer) is info.value
    assert pickle.loads(pickle.dumps(stepped)).step == 7


def test_config_rules_of_the_reward_settings(rewards_file: Path) -> None:
    with pytest.raises(ValueError, match=r"env.reward and env.rewards are both set \(env.reward='math'\)"):
        _env({"fn": "exact"}, reward="math")
    with pytest.raises(ValueError, match=r"env.rewards\[0\]: reward 'format' needs \['pattern'\]"):
        _env({"fn": "format"})
    with pytest.raises(ValueError, match=r"env.rewards\[1\]: reward 'math' takes no \['pattern'\]"):
        _env({"fn": "exact"}, {"fn": "math", "pattern": "x"})
    with pytest.raises(ValueError, match=r"env.rewards\[0\].fn: unknown reward 'fuzzy'; legal values: \['exact', 'math', "
                       r"'format'\] or a function"):
        _env({"fn": "fuzzy"})
    with pytest.raises(ValueError, match=r"pattern '\(' is not a regular expression"):
        _env({"fn": "format", "pattern": "("})
    with pytest.raises(ValueError, match=r"env.rewards: must not be empty"):
        EnvConfig(rewards=[])
    with pytest.raises(ValueError, match=r"env.rewards\[0\].weight: must be a finite number"):
        _env({"fn": "exact", "weight": float("inf")})
    with pytest.raises(ValueError, match=r"env.reward: 'nocolon:' is not 'package.module:function'"):
        make_environment(SimpleNamespace(reward="nocolon:", rewards=None))


def test_format_reward_matches_the_whole_response() -> None:
    env = make_environment(_env({"fn": "format", "pattern": r"<a>.*</a>"}))
    assert env.score(["<a>x\ny</a>", "<a>x</a> tail", "no"], ["", "", ""]).tolist() == [1.0, 0.0, 0.0]


def test_evaluation_reports_the_answer_of_the_first_reward_that_extracts_one(rewards_file: Path) -> None:
    from nemo_dp.environments import answer_extractor

    assert answer_extractor(EnvConfig(reward="math"))("so #### 42") == "42"
    assert answer_extractor(_env({"fn": "format", "pattern": "x"}, {"fn": "math"}))("so #### 42") == "42"
    assert answer_extractor(EnvConfig(reward=f"{rewards_file}:correct"))("42<eos>junk") == "42"
