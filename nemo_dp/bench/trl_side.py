"""TRL's ``GRPOTrainer`` on the peer bench's settings, timed per step and per phase.

``trl`` / ``datasets`` (the ``bench`` extra) are imported inside :func:`run_trl_grpo` only.  A
subclass records the phases of nemo_dp's step metrics: ``generation``, ``logprobs`` (no-grad
log-prob forwards) and ``train`` (training forward and backward, clipping, optimizer step); a
callback marks the steps.  Rewards are nemo_dp's math reward.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_dp.environments.math_reward import MathEnv

__all__ = ["TrlRunSettings", "TRL_PRECISION", "run_trl_grpo"]

#: ``policy.precision`` -> (TRL's ``bf16`` flag, dtype the model is loaded in).
TRL_PRECISION: dict[str, tuple[bool, str]] = {
    "32-true": (False, "float32"),
    "bf16-mixed": (True, "float32"),
    "bf16-true": (False, "bfloat16"),
}


@dataclass(frozen=True)
class TrlRunSettings:
    """What the TRL run shares with the nemo_dp run (set by the bench from one config).

    Attributes:
        model_dir: The ``save_pretrained`` model directory both sides load.
        prompts: User messages, one per problem (each becomes a one-turn conversation).
        answers: Reference answers, aligned with ``prompts``.
        group_size: Samples per prompt (``num_generations``).
        max_new_tokens: ``max_completion_length``.
        kl_coef: ``beta``.
        clip_eps: ``epsilon`` (symmetric ratio clip).
        lr: Learning rate (constant, no warm-up); ``adam_*`` and ``weight_decay`` are AdamW's.
        precision: ``32-true`` | ``bf16-mixed`` | ``bf16-true``.
        threads: Torch intra-op threads (the core budget).
        output_dir: TRL's output directory (nothing is saved there).
    """

    model_dir: str
    prompts: tuple[str, ...]
    answers: tuple[str, ...]
    group_size: int
    prompts_per_step: int
    max_new_tokens: int
    kl_coef: float
    clip_eps: float
    lr: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    weight_decay: float
    max_grad_norm: float
    temperature: float
    precision: str
    steps: int
    threads: int
    seed: int
    output_dir: str

    def __post_init__(self) -> None:
        if self.precision not in TRL_PRECISION:
            raise ValueError(f"TrlRunSettings.precision: got {self.precision!r}; legal values: {list(TRL_PRECISION)}")
        if len(self.prompts) != len(self.answers) or not self.prompts:
            raise ValueError(f"TrlRunSettings: {len(self.prompts)} prompts for {len(self.answers)} answers")


def _completion_text(completion: Any) -> str:
    """The text of one TRL completion (a message list for conversational data, else a str)."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content", "")) for m in completion if m.get("role") == "assistant")


def math_reward(completions: Sequence[Any], answer: Sequence[str], **_: Any) -> list[float]:
    """nemo_dp's math reward (final answer, last number) in TRL's reward-function signature.

    ``answer`` is the dataset's column for the same rows; one reward in {0.0, 1.0} per completion.
    """
    return MathEnv().score([_completion_text(c) for c in completions], list(answer)).tolist()


def run_trl_grpo(settings: TrlRunSettings) -> dict[str, Any]:
    """Train with TRL's ``GRPOTrainer`` and time every optimizer step.

    Returns:
        ``{"steps": [{"step", "step_time_s", "time/generation_s", "time/logprobs_s",
        "time/train_s", "reward_mean", "mean_response_length"}, ...], "load_s": float,
        "trl_version": str, "args": {...}}``.
    """
    import datasets
    import torch
    import trl
    from transformers import TrainerCallback

    bf16, dtype = TRL_PRECISION[settings.precision]
    samples = settings.prompts_per_step * settings.group_size
    before_threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads)

    class _Timed(trl.GRPOTrainer):
        """GRPOTrainer that adds up the wall time of its phases (read per step by the callback)."""

        phase_s: dict[str, float]

        def _add_time(self, phase: str | None, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            """``call(*args, **kwargs)``, its wall time added to ``phase_s[phase]`` (``None``: not timed)."""
            t0 = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                if phase is not None:
                    self.phase_s[phase] += time.perf_counter() - t0

        def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
            return self._add_time("generation", super()._generate_single_turn, *args, **kwargs)

        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
            phase = None if torch.is_grad_enabled() else "logprobs"  # the training forward is part of "train"
            return self._add_time(phase, super()._get_per_token_logps_and_entropies, *args, **kwargs)

        def _prepare_inputs(self, *args: Any, **kwargs: Any) -> Any:
            return self._add_time("prepare", super()._prepare_inputs, *args, **kwargs)

        def training_step(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return self._add_time("training_step", super().training_step, *args, **kwargs)
            finally:
                self.phase_s["training_step_end"] = time.perf_counter()

    class _StepClock(TrainerCallback):
        """Per optimizer step: its wall time and the phase times the trainer added up."""

        def __init__(self) -> None:
            self.trainer: Any = None
            self.rows: list[dict[str, Any]] = []
            self._t0 = 0.0

        def _reset(self) -> None:
            self.trainer.phase_s = {"generation": 0.0, "logprobs": 0.0, "prepare": 0.0, "training_step": 0.0,
                                    "optimizer": 0.0, "training_step_end": 0.0}

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._reset()
            self._t0 = time.perf_counter()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            p = self.trainer.phase_s
            p["optimizer"] += time.perf_counter() - p["training_step_end"]  # clipping + optimizer.step

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            p = self.trainer.phase_s
            self.rows.append(
                {
                    "step": int(state.global_step),
                    "step_time_s": time.perf_counter() - self._t0,
                    "time/generation_s": p["generation"],
                    "time/logprobs_s": p["logprobs"],
                    "time/train_s": p["training_step"] - p["prepare"] + p["optimizer"],
                }
            )

    rows = [{"prompt": [{"role": "user", "content": p}], "answer": a} for p, a in zip(settings.prompts, settings.answers)]
    dataset = datasets.Dataset.from_list(rows)
    args = trl.GRPOConfig(
        output_dir=settings.output_dir,
        use_cpu=True,
        bf16=bf16,
        gradient_checkpointing=False,
        loss_type="dapo",  # nemo_dp's token-level loss: sum over the batch's tokens / their count
        beta=settings.kl_coef,
        epsilon=settings.clip_eps,
        num_iterations=1,
        num_generations=settings.group_size,
        per_device_train_batch_size=samples,
        gradient_accumulation_steps=1,
        max_completion_length=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=settings.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=settings.adam_beta1,
        adam_beta2=settings.adam_beta2,
        adam_epsilon=settings.adam_eps,
        weight_decay=settings.weight_decay,
        max_grad_norm=settings.max_grad_norm,
        max_steps=settings.steps,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
        seed=settings.seed,
        model_init_kwargs={"dtype": dtype},
    )
    clock = _StepClock()
    t_load = time.perf_counter()
    try:
        trainer = _Timed(
            model=settings.model_dir, reward_funcs=math_reward, args=args, train_dataset=dataset, callbacks=[clock]
        )
        clock.trainer = trainer
        load_s = time.perf_counter() - t_load
        trainer.train()
    finally:
        torch.set_num_threads(before_threads)
    logged = {int(r["step"]): r for r in trainer.state.log_history if "reward" in r and "step" in r}
    for row in clock.rows:
        record = logged.get(row["step"], {})
        row["reward_mean"] = float(record.get("reward", float("nan")))
        row["mean_response_length"] = float(record.get("completions/mean_length", float("nan")))
    del trainer
    return {
        "steps": clock.rows,
        "load_s": load_s,
        "trl_version": trl.__version__,
        "args": {"loss_type": args.loss_type, "beta": args.beta, "bf16": args.bf16, "num_iterations": args.num_iterations,
                 "per_device_train_batch_size": args.per_device_train_batch_size,
                 "generation_batch_size": args.generation_batch_size, "num_generations": args.num_generations,
                 "gradient_checkpointing": args.gradient_checkpointing, "use_cpu": args.use_cpu,
                 "model_dtype": dtype, "scale_rewards": args.scale_rewards},
    }


def trl_output_dir(root: Path, precision: str) -> str:
    """TRL's output directory for one precision under the bench's run directory."""
    return str(root / f"trl_{precision}")
