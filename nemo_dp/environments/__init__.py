"""Verifiable rewards: the reward registry, users' reward functions and weighted lists of them."""

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
