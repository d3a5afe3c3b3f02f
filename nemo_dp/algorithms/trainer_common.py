"""Pieces every trainer shares around its step loop: counters, resume, evaluation schedule, checkpoint state."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from nemo_dp.algorithms.context import PhaseCheckpointer, PhaseLogger, TrainContext
from nemo_dp.utils.seeding import capture_rng_state, restore_rng_state

__all__ = [
    "DriverPathHooks",
    "TRAINER_STATE_VERSION",
    "restore_trainer_state",
    "start_counters",
    "make_evaluator",
    "context_evaluator",
    "validate_at_start",
    "open_step_loop",
    "finish_step",
    "record_validation",
    "step_time_metrics",
    "trainer_state",
    "save_if_due",
    "sample_seeds",
    "rollout_shape",
    "should_validate",
]

#: Version of the trainer-state layout inside a training checkpoint.
TRAINER_STATE_VERSION = 1


class DriverPathHooks:
    """Default batch-path hooks: no-ops and the held-out evaluation on the driver."""

    def make_evaluator(self, ctx: TrainContext) -> Callable[[], float]:
        return context_evaluator(ctx)

    def start_run(self) -> None:
        pass

    def begin_step(self, *args: Any) -> None:
        pass

    def end_step(self) -> None:
        pass

    def step_metrics(self, *args: Any) -> dict[str, Any]:
        return {}


def sample_seeds(base_seed: int, step: int, iteration: int, n: int) -> list[int]:
    """``n`` distinct seeds in ``[0, 2**63)``, a pure function of (run seed, 1-based step, rollout iteration, row).

    Raises:
        ValueError: If ``n`` or ``iteration`` is too large for the seed layout.
    """
    if n > 1_000_000 or iteration >= 1_000:
        raise ValueError(f"sample_seeds: n={n} / iteration={iteration} exceed the seed layout")
    base = ((base_seed * 1_000_003 + step) * 1_000 + iteration) * 1_000_000
    return [(base + i) % (2**63) for i in range(n)]


def rollout_shape(algo: Any) -> tuple[int, int, int]:
    """``(max_steps, responses per prompt, rows per step)`` of a GRPO / PPO ``algorithm`` node."""
    group = int(algo.num_generations_per_prompt)
    return int(algo.max_steps), group, int(algo.num_prompts_per_step) * group


def should_validate(step: int, *, val_period: int, max_steps: int) -> bool:
    """Whether to evaluate after ``step``: every ``val_period`` steps (0 = never) and at ``max_steps``."""
    return step == max_steps or (val_period > 0 and step % val_period == 0)


def restore_trainer_state(
    start_state: dict[str, Any], *, algorithm: str, policy: Any, train_loader: Any
) -> dict[str, Any]:
    """Load a checkpoint's policy, loader and driver RNG state; return its counters.

    Raises:
        ValueError: If the checkpoint is from another algorithm or trainer-state version.
    """
    where = start_state.get("checkpoint_path", "<in-memory state>")
    if start_state["trainer_state_version"] != TRAINER_STATE_VERSION:
        raise ValueError(
            f"checkpoint {where}: trainer_state_version {start_state['trainer_state_version']} "
            f"is not supported (expected {TRAINER_STATE_VERSION})"
        )
    if start_state["algorithm"] != algorithm:
        raise ValueError(
            f"checkpoint {where}: written by algorithm {start_state['algorithm']!r}, cannot resume "
            f"algorithm {algorithm!r} (checkpointing.resume_from)"
        )
    policy.load_state_dict(start_state["policy"])
    train_loader.load_state_dict(start_state["loader"])
    restore_rng_state(start_state["driver_rng"])
    return dict(start_state["counters"])


def start_counters(
    ctx: TrainContext, algorithm: str, restore_extra: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """The counters ``{step, consumed_samples, val_accuracy, initial_val_accuracy}`` of a fresh run or a resume.

    On resume (``ctx.start_state``) this runs :func:`restore_trainer_state`, then ``restore_extra(start_state)``,
    and logs it.
    """
    start_state = ctx.start_state
    counters: dict[str, Any] = {"step": 0, "consumed_samples": 0, "val_accuracy": None, "initial_val_accuracy": None}
    if start_state is not None:
        counters.update(
            restore_trainer_state(start_state, algorithm=algorithm, policy=ctx.policy, train_loader=ctx.train_loader)
        )
        if restore_extra is not None:
            restore_extra(start_state)
        ctx.logger.info(f"resumed from {start_state['checkpoint_path']} at step {counters['step']}")
    return counters


def make_evaluator(
    policy: Any, val_problems: list[Any], *, tokenizer: Any, env: Any, master_config: Any, logger: PhaseLogger
) -> Callable[[], float]:
    """A function returning held-out greedy exact-match accuracy; logs the configured number of examples."""
    from nemo_dp.algorithms.rollout import evaluate

    num_print = int(master_config.logger.num_val_examples_to_print)

    def _evaluate() -> float:
        ev = evaluate(policy, val_problems, tokenizer=tokenizer, env=env, num_examples_to_print=num_print)
        for line in ev["examples"]:
            logger.info(f"  {line}")
        return float(ev["val_accuracy"])

    return _evaluate


def context_evaluator(
    ctx: TrainContext, factory: Callable[..., Callable[[], float]] = make_evaluator
) -> Callable[[], float]:
    """``factory`` (:func:`make_evaluator` or the store's) over ``ctx``'s policy, held-out problems and logger."""
    return factory(
        ctx.policy, ctx.val_problems, tokenizer=ctx.tokenizer, env=ctx.env, master_config=ctx.cfg, logger=ctx.logger
    )


def validate_at_start(
    counters: dict[str, Any], evaluate_fn: Callable[[], float], *, algo: Any, num_problems: int, logger: PhaseLogger
) -> None:
    """Evaluate a fresh run at step 0 when ``algo.val_at_start`` (sets ``initial_val_accuracy``)."""
    if counters["step"] == 0 and bool(algo.val_at_start):
        acc = evaluate_fn()
        counters["initial_val_accuracy"] = acc
        logger.info(f"step 0: held-out accuracy {acc:.3f} ({num_problems} problems)")
        logger.log_step(0, {"val_accuracy": acc})


def open_step_loop(ctx: TrainContext, path: Any, counters: dict[str, Any], max_steps: int) -> Callable[[], float]:
    """Start the logger, run the step-0 evaluation when asked, start ``path``'s run; return the evaluator."""
    ctx.logger.start(max_steps, int(counters["step"]))
    evaluate = path.make_evaluator(ctx)
    validate_at_start(counters, evaluate, algo=ctx.cfg.algorithm, num_problems=len(ctx.val_problems), logger=ctx.logger)
    path.start_run()
    return evaluate


def step_time_metrics(counters: Mapping[str, Any], timings: tuple[float, float, float]) -> dict[str, Any]:
    """``consumed_samples`` and the seconds spent in generation, log-probs (forwards) and training."""
    t_gen, t_lp, t_train = timings
    return {
        "consumed_samples": counters["consumed_samples"],
        "time/generation_s": t_gen,
        "time/logprobs_s": t_lp,
        "time/train_s": t_train,
    }


def finish_step(
    ctx: TrainContext,
    step: int,
    max_steps: int,
    metrics: dict[str, Any],
    counters: dict[str, Any],
    evaluate: Callable[[], float],
    path_metrics: Callable[[], dict[str, Any]],
    state_fn: Callable[[], dict[str, Any]],
    detail: Callable[[], str] | None = None,
) -> None:
    """End a GRPO / PPO step: evaluate when due, add ``path_metrics()``, log, checkpoint when due.

    ``detail`` makes the text logged between loss and accuracy (ending in ``", "``); called only when evaluating.
    """
    if should_validate(step, val_period=int(ctx.cfg.algorithm.val_period), max_steps=max_steps):
        acc = record_validation(counters, metrics, evaluate)
        ctx.logger.info(
            f"step {step}: reward {metrics['reward_mean']:.3f}, loss {metrics['loss']:.4f}, "
            f"{detail() if detail else ''}held-out accuracy {acc:.3f}"
        )
    metrics.update(path_metrics())
    ctx.logger.log_step(step, metrics)
    save_if_due(ctx.checkpointer, step, max_steps, state_fn)


def record_validation(counters: dict[str, Any], metrics: dict[str, Any], evaluate_fn: Callable[[], float]) -> float:
    """Evaluate; record the accuracy in ``counters`` and ``metrics`` (with ``time/val_s``) and return it."""
    t0 = time.perf_counter()
    acc = evaluate_fn()
    counters["val_accuracy"] = acc
    metrics["val_accuracy"] = acc
    metrics["time/val_s"] = time.perf_counter() - t0
    return acc


def trainer_state(
    algorithm: str, counters: Mapping[str, Any], policy_state: Any, loader_state: Any, *, value_state: Any = None
) -> dict[str, Any]:
    """The checkpointed trainer state, keys in the order every trainer writes them; captures the driver RNG now.

    ``value_state`` is the critic's state dict (PPO), ``None`` without a critic.
    """
    state: dict[str, Any] = {
        "trainer_state_version": TRAINER_STATE_VERSION,
        "algorithm": algorithm,
        "counters": dict(counters),
        "policy": policy_state,
    }
    if value_state is not None:
        state["value"] = value_state
    state["loader"] = loader_state
    state["driver_rng"] = capture_rng_state()
    return state


def save_if_due(
    checkpointer: PhaseCheckpointer, step: int, max_steps: int, state_fn: Callable[[], dict[str, Any]]
) -> None:
    """Save ``step``'s checkpoint when the schedule asks; ``state_fn`` is called only then."""
    if checkpointer.should_save(step, final=step == max_steps):
        checkpointer.save(step, state_fn)
