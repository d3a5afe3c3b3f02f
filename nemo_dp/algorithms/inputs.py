"""Input builders: the loader, held-out problems and environment a trainer consumes.

One builder per kind of algorithm input (``build_sft_inputs`` for supervised pairs,
``build_rl_inputs`` for RL prompts), so that an algorithm names its builder instead of a shared
function branching on ``algorithm.name``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_dp.data.arithmetic import ArithmeticTask, Problem
from nemo_dp.data.datasets import EpochLoader, RLPromptDataset, SFTDataset
from nemo_dp.environments.arithmetic_env import ArithmeticEnv

__all__ = ["TrainerInputs", "build_sft_inputs", "build_rl_inputs"]


@dataclass
class TrainerInputs:
    """What a trainer consumes besides the policy and the config.

    Attributes:
        train_loader: Resumable loader of SFT pairs (SFT) or problems (GRPO / PPO).
        val_problems: Held-out problems for greedy exact-match evaluation.
        env: The reward environment.
    """

    train_loader: EpochLoader[Any]
    val_problems: list[Problem]
    env: ArithmeticEnv


def _task_and_val(master_config: Any) -> tuple[ArithmeticTask, list[Problem]]:
    from nemo_dp.data.jsonl import load_rl_jsonl

    env_cfg = master_config.env
    algo = master_config.algorithm
    task = ArithmeticTask(int(env_cfg.digits), tuple(env_cfg.operators), int(env_cfg.seed))
    if env_cfg.val_jsonl is not None:
        val_problems = list(load_rl_jsonl(str(env_cfg.val_jsonl)))[: int(algo.val_samples)]
    else:
        val_problems = task.eval_problems(int(algo.val_samples))
    return task, val_problems


def build_sft_inputs(master_config: Any) -> TrainerInputs:
    """Inputs of a supervised phase: ``policy.train_global_batch_size`` pairs per batch.

    Pairs come from ``env.sft_jsonl`` when set, else from the arithmetic generator
    (``algorithm.num_train_samples``); ``algorithm.shuffle`` decides the epoch order.

    Args:
        master_config: Validated root config whose ``algorithm`` is an SFT node.

    Returns:
        The inputs.
    """
    task, val_problems = _task_and_val(master_config)
    env_cfg = master_config.env
    algo = master_config.algorithm
    if env_cfg.sft_jsonl is not None:
        dataset: Any = SFTDataset.from_jsonl(str(env_cfg.sft_jsonl))
    else:
        dataset = SFTDataset.from_arithmetic(task, int(algo.num_train_samples))
    loader = EpochLoader(
        dataset,
        batch_size=int(master_config.policy.train_global_batch_size),
        seed=int(master_config.seed),
        shuffle=bool(algo.shuffle),
    )
    return TrainerInputs(train_loader=loader, val_problems=val_problems, env=ArithmeticEnv())


def build_rl_inputs(master_config: Any) -> TrainerInputs:
    """Inputs of an RL phase (GRPO, PPO): ``algorithm.num_prompts_per_step`` problems per batch.

    Prompts come from ``env.rl_jsonl`` when set, else from the arithmetic generator
    (``algorithm.num_train_prompts``); the epoch order is always shuffled.

    Args:
        master_config: Validated root config whose ``algorithm`` is an RL node.

    Returns:
        The inputs.
    """
    task, val_problems = _task_and_val(master_config)
    env_cfg = master_config.env
    algo = master_config.algorithm
    if env_cfg.rl_jsonl is not None:
        dataset: Any = RLPromptDataset.from_jsonl(str(env_cfg.rl_jsonl))
    else:
        dataset = RLPromptDataset.from_arithmetic(task, int(algo.num_train_prompts))
    loader = EpochLoader(
        dataset, batch_size=int(algo.num_prompts_per_step), seed=int(master_config.seed), shuffle=True
    )
    return TrainerInputs(train_loader=loader, val_problems=val_problems, env=ArithmeticEnv())
