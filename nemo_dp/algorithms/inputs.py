"""Input builders: the loader, held-out problems and environment a trainer consumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_dp.data.arithmetic import Problem
from nemo_dp.data.datasets import EpochLoader, RLPromptDataset, SFTDataset
from nemo_dp.data.sources import build_val_problems, rl_source, sft_source
from nemo_dp.environments import make_environment

__all__ = ["TrainerInputs", "build_sft_inputs", "build_rl_inputs"]


@dataclass
class TrainerInputs:

    train_loader: EpochLoader[Any]
    val_problems: list[Problem]
    env: Any


def _inputs(master_config: Any, tokenizer: Any | None, loader: EpochLoader[Any]) -> TrainerInputs:
    return TrainerInputs(loader, build_val_problems(master_config, tokenizer), make_environment(master_config.env))


def build_sft_inputs(master_config: Any, tokenizer: Any | None = None) -> TrainerInputs:
    """Inputs of a supervised phase (``env.sft_jsonl`` or generated pairs, ``train_global_batch_size`` a batch).

    Raises:
        DatasetError: A dataset problem, naming the key, file:line and field.
    """
    algo = master_config.algorithm
    src = sft_source(master_config.env, int(algo.num_train_samples), num_samples_key="algorithm.num_train_samples")
    loader = EpochLoader(
        SFTDataset(src.rows),
        batch_size=int(master_config.policy.train_global_batch_size),
        seed=int(master_config.seed),
        shuffle=bool(algo.shuffle),
    )
    return _inputs(master_config, tokenizer, loader)


def build_rl_inputs(master_config: Any, tokenizer: Any | None = None) -> TrainerInputs:
    """Like :func:`build_sft_inputs`, but RL prompts (``env.rl_jsonl`` or generated), ``num_prompts_per_step`` each.

    The epoch order is always shuffled.
    """
    algo = master_config.algorithm
    src = rl_source(
        master_config.env,
        int(algo.num_train_prompts),
        num_prompts_key="algorithm.num_train_prompts",
        tokenizer=tokenizer,
    )
    loader = EpochLoader(
        RLPromptDataset(src.rows), batch_size=int(algo.num_prompts_per_step), seed=int(master_config.seed), shuffle=True
    )
    return _inputs(master_config, tokenizer, loader)
