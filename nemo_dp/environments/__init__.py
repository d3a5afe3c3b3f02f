"""Verifiable rewards: the reward registry (exact match for the built-in task, final-answer
match for users' math data, a format regex), users' own reward functions and weighted lists of
them, chosen by ``env.reward`` / ``env.rewards`` through ``make_environment``."""

from nemo_dp.environments.registry import (
    REWARDS,
    RewardSpec,
    answer_extractor,
    make_environment,
    register_reward,
    resolve_reward,
    reward_spec,
    single_reward_names,
)

__all__ = [
    "REWARDS",
    "RewardSpec",
    "answer_extractor",
    "make_environment",
    "register_reward",
    "resolve_reward",
    "reward_spec",
    "single_reward_names",
]
