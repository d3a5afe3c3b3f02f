"""What ``grpo_sync`` and ``ppo_sync`` share: the entry check, store rollouts and held-out evaluation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from nemo_dp.algorithms.context import PhaseLogger, TrainContext
from nemo_dp.algorithms.grpo_step import StepRows
from nemo_dp.algorithms.trainer_common import context_evaluator
from nemo_dp.config.trainer_lookup import validate_trainer_selection
from nemo_dp.data_plane.registry import cross_process_options
from nemo_dp.data_plane.schema import TASK_TRAIN, TASK_VAL, VAL_PARTITION

__all__ = ["check_sync_entry", "problem_rows", "make_store_evaluator", "StorePathHooks"]


def problem_rows(problems: list[Any], group: int, tokenizer: Any) -> tuple[list[list[int]], list[str]]:
    """``(prompt token ids, answers)``, each problem repeated ``group`` times."""
    prompts = [tokenizer.encode_prompt(p.prompt) for p in problems for _ in range(group)]
    answers = [p.answer for p in problems for _ in range(group)]
    return prompts, answers


def make_store_evaluator(
    policy: Any, val_problems: list[Any], *, tokenizer: Any, env: Any, master_config: Any, logger: PhaseLogger
) -> Callable[[], float]:
    """Like :func:`~nemo_dp.algorithms.trainer_common.make_evaluator`, but through a throw-away validation partition.

    The partition is dropped even on failure; only printed responses come back to the driver.
    The returned function raises ``ValueError`` when there are no held-out problems.
    """
    num_print = int(master_config.logger.num_val_examples_to_print)

    def _evaluate() -> float:
        n = len(val_problems)
        if n == 0:
            raise ValueError("evaluate: no held-out problems")
        policy.prepare_val_partition(n, partition_id=VAL_PARTITION)
        try:
            prompts, answers = problem_rows(list(val_problems), 1, tokenizer)
            out = policy.generate_to_dataplane(
                prompts,
                [0] * n,
                sample_ids=[f"val{k}_g0" for k in range(n)],
                answers=answers,
                greedy=True,
                tokenizer=tokenizer,
                env=env,
                partition_id=VAL_PARTITION,
                task_name=TASK_VAL,
                return_responses=num_print > 0,
            )
            policy.finish_step(out.meta)
        finally:
            policy.drop_partition(VAL_PARTITION)
        responses = out.responses or []
        for p, r in list(zip(val_problems, responses))[:num_print]:
            logger.info(f"  {p.prompt}{r!r} (expected {p.answer!r})")
        return float(out.carry["rewards"].mean())

    return _evaluate


def check_sync_entry(policy: Any, master_config: Any, target: str, legacy: str) -> None:
    """Refuse to start the synchronous data-plane trainer ``target`` where it does not apply.

    Raises:
        ValueError: The config selects another trainer (``legacy`` is named), or the policy has no ``dp_cfg``.
    """
    entry = target.rpartition(":")[2]
    selection = validate_trainer_selection(master_config)
    if selection.target != target:
        raise ValueError(
            f"{entry} needs a data plane that carries rows between processes "
            f"({cross_process_options()}); this config selects {selection.target} - use the legacy trainer "
            f"{legacy} (select_sync_trainer picks it)"
        )
    if not hasattr(policy, "dp_cfg"):
        raise ValueError(
            f"{entry} needs a data-plane policy exposing dp_cfg (TQPolicy), got "
            f"{type(policy).__name__}; build the policy with "
            "nemo_dp.data_plane.factory.make_policy_factory(cfg.data_plane)"
        )


class StorePathHooks:
    """The hooks of a batch path whose rows live in the data plane (``self.policy`` a ``TQPolicy``)."""

    policy: Any
    tokenizer: Any
    env: Any

    def make_evaluator(self, ctx: TrainContext) -> Callable[[], float]:
        return context_evaluator(ctx, make_store_evaluator)

    def end_step(self) -> None:
        self.policy.drop_partition()

    def _rollout(self, problems: Sequence[Any], seeds: list[int], group: int, prefix: str) -> StepRows:
        """Sample ``group`` responses per problem into the training partition; ids ``<prefix>_p<problem>_g<i>``."""
        problems = list(problems)
        ids = [f"{prefix}_p{j}_g{i}" for j in range(len(problems)) for i in range(group)]
        prompts, answers = problem_rows(problems, group, self.tokenizer)
        out = self.policy.generate_to_dataplane(
            prompts, seeds, sample_ids=ids, answers=answers, greedy=False, tokenizer=self.tokenizer, env=self.env,
            task_name=TASK_TRAIN,
        )
        return StepRows(out.meta, out.carry)
