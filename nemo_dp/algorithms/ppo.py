"""Legacy (in-memory) PPO trainer: actor-critic with token-level rewards and GAE.

Per step: draw ``num_prompts_per_step`` problems, sample ``num_generations_per_prompt``
responses each (per-row seeds), score them, mask truncated rows (overlong filtering), compute
the policy's ``prev_logprobs``, the reference policy's log-probs and the critic's values, build
token-level rewards (the score at the last response token, a per-token KL penalty
``-kl_coef * (logp - logp_ref)``), GAE advantages (whitened) and returns, then run
``ppo_epochs`` epochs; each epoch trains the policy (clipped PG loss) and the critic (clipped
value loss) on a fresh shuffle of the batch.  The whole batch lives in driver memory; the
data-plane twin is ``ppo_sync.ppo_train_sync`` and shares everything else via
``ppo_common``.  The critic is a ``Value`` worker group this trainer creates (and shuts down);
its call signature is the one every trainer shares.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from nemo_dp.algorithms.ppo_common import (
    PPO_POLICY_TRAIN_KEYS,
    PPO_VALUE_TRAIN_KEYS,
    build_ppo_loss_fns,
    compute_ppo_targets,
    epoch_permutation,
    optimizer_steps_per_phase,
    ppo_step_metrics,
)
from nemo_dp.algorithms.rollout import evaluate, rollout
from nemo_dp.algorithms.sft import restore_trainer_state
from nemo_dp.algorithms.trainer_common import (
    TRAINER_STATE_VERSION,
    Checkpointer,
    RunLogger,
    sample_seeds,
    should_validate,
)
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.distributed.worker_group import RayCluster
from nemo_dp.models.value.value import Value, critic_config
from nemo_dp.utils.seeding import capture_rng_state

__all__ = ["ppo_train", "start_ppo_phase", "make_value"]


def start_ppo_phase(
    policy: Any,
    value: Any,
    master_config: Any,
    *,
    start_state: dict[str, Any] | None,
    train_loader: Any,
    logger: RunLogger,
) -> dict[str, Any]:
    """Fresh start or resume of both models (shared by both PPO trainers).

    A fresh run freezes the policy's current weights as the reference, starts fresh optimizers
    and (``algorithm.value.init_from_policy``) copies the policy's trunk into the critic.  A
    resume restores policy, loader, driver RNG and the critic from the checkpoint.

    Args:
        policy: The policy facade.
        value: The critic facade.
        master_config: Root config (PPO).
        start_state: A loaded checkpoint or ``None``.
        train_loader: The problem loader.
        logger: For the resume line.

    Returns:
        The trainer counters.
    """
    algo = master_config.algorithm
    counters: dict[str, Any] = {
        "step": 0,
        "consumed_samples": 0,
        "val_accuracy": None,
        "initial_val_accuracy": None,
    }
    if start_state is not None:
        counters.update(
            restore_trainer_state(start_state, algorithm="ppo", policy=policy, train_loader=train_loader)
        )
        value.load_state_dict(start_state["value"])
        logger.info(f"resumed from {start_state['checkpoint_path']} at step {counters['step']}")
        return counters
    policy.snapshot_reference_policy()
    steps = optimizer_steps_per_phase(master_config)
    policy.reset_optimizer(float(master_config.policy.optimizer.lr), decay_steps=steps)
    if bool(algo.value.init_from_policy):
        value.init_trunk_from(policy.state_dict()["weights"]["model"])
    value.reset_optimizer(float(algo.value.lr), decay_steps=steps)
    return counters


def make_value(
    master_config: Any, tokenizer: Any, *, value_factory: Callable[..., Any] = Value
) -> Any:
    """Build the critic's worker group for a PPO run.

    Args:
        master_config: Root config (PPO): ``policy`` and ``algorithm.value``.
        tokenizer: The tokenizer (vocabulary and special ids).
        value_factory: ``Value`` or a callable with its keyword arguments (the data-plane
            trainer passes ``functools.partial(TQValue.from_policy, policy)``).

    Returns:
        The critic facade.
    """
    return value_factory(
        cluster=RayCluster(),
        config=critic_config(master_config.policy, master_config.algorithm.value),
        vocab_size=tokenizer.vocab_size,
        pad_id=tokenizer.pad_id,
        eos_id=tokenizer.eos_id,
        seed=int(master_config.seed),
    )


def ppo_train(
    policy: Any,
    master_config: Any,
    *,
    train_loader: Any,
    val_problems: list[Any],
    tokenizer: Any,
    env: Any,
    logger: RunLogger,
    checkpointer: Checkpointer,
    start_state: dict[str, Any] | None,
) -> dict[str, Any]:
    """Run PPO for ``algorithm.max_steps`` steps (in-memory batches).

    Args:
        policy: The policy facade (``Policy``).
        master_config: The validated root config (``algorithm`` is PPO).
        train_loader: Resumable loader of problems, batch size ``num_prompts_per_step``.
        val_problems: Held-out problems for greedy exact-match evaluation.
        tokenizer: The tokenizer.
        env: The reward environment.
        logger: The phase's ``RunLogger``.
        checkpointer: The phase's ``Checkpointer``.
        start_state: A loaded checkpoint to resume from, or ``None`` for a fresh run.

    Returns:
        ``{"step", "consumed_samples", "val_accuracy", "initial_val_accuracy"}``.
    """
    value = make_value(master_config, tokenizer)
    try:
        return _ppo_loop(
            policy,
            value,
            master_config,
            train_loader=train_loader,
            val_problems=val_problems,
            tokenizer=tokenizer,
            env=env,
            logger=logger,
            checkpointer=checkpointer,
            start_state=start_state,
        )
    finally:
        value.shutdown()


def _ppo_loop(
    policy: Any,
    value: Any,
    master_config: Any,
    *,
    train_loader: Any,
    val_problems: list[Any],
    tokenizer: Any,
    env: Any,
    logger: RunLogger,
    checkpointer: Checkpointer,
    start_state: dict[str, Any] | None,
) -> dict[str, Any]:
    algo = master_config.algorithm
    max_steps = int(algo.max_steps)
    group = int(algo.num_generations_per_prompt)
    counters = start_ppo_phase(
        policy, value, master_config, start_state=start_state, train_loader=train_loader, logger=logger
    )
    policy_loss_fn, value_loss_fn = build_ppo_loss_fns(algo)
    logger.start(max_steps, int(counters["step"]))

    def _evaluate() -> float:
        ev = evaluate(
            policy,
            val_problems,
            tokenizer=tokenizer,
            env=env,
            num_examples_to_print=int(master_config.logger.num_val_examples_to_print),
        )
        for line in ev["examples"]:
            logger.info(f"  {line}")
        return float(ev["val_accuracy"])

    if counters["step"] == 0 and bool(algo.val_at_start):
        acc = _evaluate()
        counters["initial_val_accuracy"] = acc
        logger.info(f"step 0: held-out accuracy {acc:.3f} ({len(val_problems)} problems)")
        logger.log_step(0, {"val_accuracy": acc})

    while counters["step"] < max_steps:
        step = int(counters["step"]) + 1
        t0 = time.perf_counter()
        problems = train_loader.next_batch()
        seeds = sample_seeds(int(master_config.seed), step, 0, len(problems) * group)
        batch = rollout(
            policy, problems, tokenizer=tokenizer, env=env, group_size=group, seeds=seeds, greedy=False
        ).batch
        t_gen = time.perf_counter() - t0
        sample_mask = torch.ones(batch.size, dtype=torch.float32)
        if bool(algo.overlong_filtering):
            sample_mask = sample_mask * (~batch["truncated"].bool()).float()
        data = BatchedDataDict(
            {
                "input_ids": batch["input_ids"],
                "input_lengths": batch["input_lengths"],
                "token_mask": batch["token_mask"],
                "sample_mask": sample_mask,
                "generation_logprobs": batch["generation_logprobs"],
            }
        )
        t1 = time.perf_counter()
        data["prev_logprobs"] = policy.get_logprobs(data)["logprobs"]
        data["reference_policy_logprobs"] = policy.get_reference_policy_logprobs(data)["reference_logprobs"]
        data["values"] = value.get_values(data)["values"]
        t_fwd = time.perf_counter() - t1
        targets = compute_ppo_targets(
            algo,
            scores=batch["rewards"],
            token_mask=data["token_mask"],
            sample_mask=sample_mask,
            prev_logprobs=data["prev_logprobs"],
            reference_logprobs=data["reference_policy_logprobs"],
            values=data["values"],
        )
        data["advantages"] = targets.advantages
        data["returns"] = targets.returns
        t2 = time.perf_counter()
        policy_epochs, value_epochs = [], []
        for epoch in range(int(algo.ppo_epochs)):
            perm = epoch_permutation(int(master_config.seed), step, epoch, data.size)
            shuffled = data.select_indices(perm)
            policy_epochs.append(
                policy.train(BatchedDataDict({k: shuffled[k] for k in PPO_POLICY_TRAIN_KEYS}), policy_loss_fn)
            )
            value_epochs.append(
                value.train(BatchedDataDict({k: shuffled[k] for k in PPO_VALUE_TRAIN_KEYS}), value_loss_fn)
            )
        t_train = time.perf_counter() - t2
        counters["step"] = step
        counters["consumed_samples"] += batch.size
        metrics = ppo_step_metrics(
            scores=batch["rewards"],
            targets=targets,
            values=data["values"],
            token_mask=data["token_mask"],
            truncated=batch["truncated"],
            sample_mask=sample_mask,
            policy_epochs=policy_epochs,
            value_epochs=value_epochs,
        )
        metrics.update(
            {
                "consumed_samples": counters["consumed_samples"],
                "time/generation_s": t_gen,
                "time/forward_s": t_fwd,
                "time/train_s": t_train,
            }
        )
        if should_validate(step, val_period=int(algo.val_period), max_steps=max_steps):
            t3 = time.perf_counter()
            acc = _evaluate()
            counters["val_accuracy"] = acc
            metrics["val_accuracy"] = acc
            metrics["time/val_s"] = time.perf_counter() - t3
            logger.info(
                f"step {step}: reward {metrics['reward_mean']:.3f}, loss {metrics['loss']:.4f}, "
                f"value loss {metrics['value_loss']:.4f}, explained variance "
                f"{metrics['explained_variance']:.3f}, held-out accuracy {acc:.3f}"
            )
        logger.log_step(step, metrics)
        if checkpointer.should_save(step, final=step == max_steps):
            checkpointer.save(
                step,
                lambda: {
                    "trainer_state_version": TRAINER_STATE_VERSION,
                    "algorithm": "ppo",
                    "counters": dict(counters),
                    "policy": policy.state_dict(),
                    "value": value.state_dict(),
                    "loader": train_loader.state_dict(),
                    "driver_rng": capture_rng_state(),
                },
            )
    logger.close()
    return dict(counters)
