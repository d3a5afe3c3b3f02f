"""Verifiable-reward environments: exact match for the built-in task, final-answer match for
users' math data, chosen by ``env.reward`` through ``make_environment``."""

from nemo_dp.environments.registry import REWARD_NAMES, make_environment, resolve_reward

__all__ = ["REWARD_NAMES", "make_environment", "resolve_reward"]
