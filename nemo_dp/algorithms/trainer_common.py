"""Pieces every trainer (legacy or data-plane, SFT or GRPO) shares around its step loop.

The trainers' common call signature takes a ``logger`` (``RunLogger``: metrics.jsonl, a tqdm
progress bar with live key metrics, readable log lines, the end-of-run plot) and a
``checkpointer`` (``Checkpointer``: periodic atomic checkpoints under the phase's root, keeping
the last few), and ``build_trainer_inputs`` builds the loader / held-out problems / environment
from the config.  Keeping them here means a data-plane trainer binding the same signature gets
the same logging, checkpointing and data without importing a legacy trainer.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_dp.algorithms.loss_functions import ClippedPGLossFn
from nemo_dp.data.arithmetic import ArithmeticTask, Problem
from nemo_dp.data.datasets import EpochLoader, RLPromptDataset, SFTDataset
from nemo_dp.environments.arithmetic_env import ArithmeticEnv
from nemo_dp.utils.checkpoint import (
    checkpoint_dir_for_step,
    latest_checkpoint,
    load_training_checkpoint,
    save_training_checkpoint,
)
from nemo_dp.utils.metrics import MetricsLogger
from nemo_dp.utils.seeding import capture_rng_state, restore_rng_state

__all__ = [
    "TRAINER_STATE_VERSION",
    "RunLogger",
    "Checkpointer",
    "TrainerInputs",
    "build_trainer_inputs",
    "load_start_state",
    "restore_trainer_state",
    "start_counters",
    "make_evaluator",
    "clipped_pg_loss_fn",
    "validate_at_start",
    "record_validation",
    "trainer_state",
    "sample_seeds",
    "should_validate",
]

#: Version of the trainer-state layout inside a training checkpoint.
TRAINER_STATE_VERSION = 1

# Key metrics shown live on the progress bar (when present in a step's record).
#: Shown on the progress bar when a step's record carries them (store metrics appear only when a
#: trainer logs them, i.e. with observability enabled on the data-plane path).
_BAR_KEYS: tuple[str, ...] = (
    "loss",
    "reward_mean",
    "val_accuracy",
    "grad_norm",
    "async/generated_samples",
    "async/samples_per_s",
    "data_plane/step/wall_ms",
    "data_plane/now/bytes_outstanding_mb",
)


class RunLogger:
    """Metrics file, progress bar, log lines and the final plot of one training phase.

    Args:
        out_dir: Directory for ``metrics_file`` and ``plot_file``.
        metrics_file: Metrics jsonl file name.
        plot_file: PNG file name (written by :meth:`close` when ``plot``).
        plot: Write the plot at the end.
        progress_bar: Show a tqdm bar over steps (on stderr).
        label: Phase label for log lines (``"SFT"``, ``"GRPO"``, ``"SFT warm start"``).
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        metrics_file: str,
        plot_file: str,
        plot: bool,
        progress_bar: bool,
        label: str,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.out_dir / metrics_file
        self.plot_path = self.out_dir / plot_file
        self.metrics = MetricsLogger(self.metrics_path)
        self.plot = plot
        self.progress_bar = progress_bar
        self.label = label
        self._bar: Any = None
        self._last: dict[str, float] = {}

    def start(self, total_steps: int, start_step: int) -> None:
        """Open the progress bar (and drop metrics of steps a resumed run will redo).

        Args:
            total_steps: Last step of the phase.
            start_step: Steps already done (0 for a fresh run).
        """
        self.metrics.truncate_after(start_step)
        if self.progress_bar:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps,
                initial=start_step,
                desc=self.label,
                unit="step",
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.5,
            )

    def info(self, message: str) -> None:
        """Print one log line (above the progress bar).

        Args:
            message: The line.
        """
        line = f"[{self.label}] {message}"
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Append the step's record to metrics.jsonl and update the bar.

        Args:
            step: The step number (0 = before training).
            metrics: Scalar metrics.

        Returns:
            The record written.
        """
        record = self.metrics.log(step, metrics)
        for key in _BAR_KEYS:
            if key in record and isinstance(record[key], (int, float)):
                self._last[key] = float(record[key])
        if self._bar is not None:
            if step > self._bar.n:
                self._bar.update(step - self._bar.n)
            self._bar.set_postfix({k: f"{v:.4g}" for k, v in self._last.items()}, refresh=False)
        return record

    def close(self) -> Path | None:
        """Close the bar and write the plot.

        Returns:
            The plot path, or ``None`` when plotting is off or nothing was logged.
        """
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if not self.plot or not self.metrics_path.exists() or self.metrics_path.stat().st_size == 0:
            return None
        from nemo_dp.utils.plotting import plot_training_curves

        return plot_training_curves(self.metrics_path, self.plot_path)


class Checkpointer:
    """Atomic checkpoints of one training phase under ``root`` (``step_<N>`` directories).

    Args:
        root: Checkpoint root of the phase.
        enabled: Save at all.
        save_period: Save every this many steps (0 = only at the end).
        keep_last: Keep this many newest checkpoints.
    """

    def __init__(self, root: str | Path, *, enabled: bool, save_period: int, keep_last: int) -> None:
        self.root = Path(root)
        self.enabled = enabled
        self.save_period = save_period
        self.keep_last = keep_last

    def should_save(self, step: int, *, final: bool) -> bool:
        """Whether to save after ``step``.

        Args:
            step: The step just finished.
            final: It is the phase's last step.

        Returns:
            True when enabled and ``final`` or on a ``save_period`` boundary.
        """
        if not self.enabled:
            return False
        return final or (self.save_period > 0 and step % self.save_period == 0)

    def save(self, step: int, state_fn: Callable[[], dict[str, Any]]) -> Path:
        """Write the checkpoint for ``step`` and prune old ones.

        Args:
            step: The step just finished.
            state_fn: Builds the state dict (only called when saving).

        Returns:
            The checkpoint directory.
        """
        path = save_training_checkpoint(checkpoint_dir_for_step(self.root, step), state_fn())
        self.prune()
        return path

    def prune(self) -> None:
        """Delete all but the ``keep_last`` newest committed checkpoints under ``root``."""
        steps = sorted(p for p in self.root.iterdir() if p.is_dir() and p.name.startswith("step_"))
        committed = [p for p in steps if (p / "manifest.json").is_file() and "." not in p.name]
        for old in committed[: max(0, len(committed) - self.keep_last)]:
            shutil.rmtree(old, ignore_errors=True)


def load_start_state(root: str | Path | None) -> dict[str, Any] | None:
    """The latest checkpoint's state under ``root``, or ``None``.

    Args:
        root: A checkpoint root (may be ``None`` or not exist).

    Returns:
        The loaded state dict, or ``None`` when there is nothing to resume.
    """
    if root is None:
        return None
    latest = latest_checkpoint(root)
    if latest is None:
        return None
    state = load_training_checkpoint(latest)
    state["checkpoint_path"] = str(latest)
    return state


@dataclass
class TrainerInputs:
    """What a trainer consumes besides the policy and the config.

    Attributes:
        train_loader: Resumable loader of SFT pairs (SFT) or problems (GRPO).
        val_problems: Held-out problems for greedy exact-match evaluation.
        env: The reward environment.
    """

    train_loader: EpochLoader[Any]
    val_problems: list[Problem]
    env: ArithmeticEnv


def build_trainer_inputs(master_config: Any) -> TrainerInputs:
    """Build the loader, held-out problems and environment for ``master_config.algorithm``.

    The loader yields ``policy.train_global_batch_size`` pairs per batch for SFT and
    ``algorithm.num_prompts_per_step`` problems per batch for GRPO and PPO.

    Args:
        master_config: Validated root config (``algorithm.name`` in ``sft``/``grpo``/``ppo``).

    Returns:
        The inputs.

    Raises:
        ValueError: On an unknown algorithm name.
    """
    from nemo_dp.data.jsonl import load_rl_jsonl

    env_cfg = master_config.env
    algo = master_config.algorithm
    task = ArithmeticTask(int(env_cfg.digits), tuple(env_cfg.operators), int(env_cfg.seed))
    if env_cfg.val_jsonl is not None:
        val_problems = list(load_rl_jsonl(str(env_cfg.val_jsonl)))[: int(algo.val_samples)]
    else:
        val_problems = task.eval_problems(int(algo.val_samples))
    if algo.name == "sft":
        if env_cfg.sft_jsonl is not None:
            dataset: Any = SFTDataset.from_jsonl(str(env_cfg.sft_jsonl))
        else:
            dataset = SFTDataset.from_arithmetic(task, int(algo.num_train_samples))
        shuffle = bool(algo.shuffle)
        batch_size = int(master_config.policy.train_global_batch_size)
    elif algo.name in ("grpo", "ppo"):
        if env_cfg.rl_jsonl is not None:
            dataset = RLPromptDataset.from_jsonl(str(env_cfg.rl_jsonl))
        else:
            dataset = RLPromptDataset.from_arithmetic(task, int(algo.num_train_prompts))
        shuffle = True
        batch_size = int(algo.num_prompts_per_step)
    else:
        raise ValueError(f"algorithm.name: no inputs for {algo.name!r}; legal values: ['sft', 'grpo', 'ppo']")
    loader = EpochLoader(dataset, batch_size=batch_size, seed=int(master_config.seed), shuffle=shuffle)
    return TrainerInputs(train_loader=loader, val_problems=val_problems, env=ArithmeticEnv())


def sample_seeds(base_seed: int, step: int, iteration: int, n: int) -> list[int]:
    """Per-sample sampling seeds, a pure function of (run seed, step, rollout iteration, row).

    Args:
        base_seed: The run seed.
        step: Training step (1-based).
        iteration: Rollout iteration within the step (dynamic sampling).
        n: Number of rows.

    Returns:
        ``n`` distinct non-negative seeds below 2**63.

    Raises:
        ValueError: If ``n`` or ``iteration`` is too large for the seed layout.
    """
    if n > 1_000_000 or iteration >= 1_000:
        raise ValueError(f"sample_seeds: n={n} / iteration={iteration} exceed the seed layout")
    base = ((base_seed * 1_000_003 + step) * 1_000 + iteration) * 1_000_000
    return [(base + i) % (2**63) for i in range(n)]


def should_validate(step: int, *, val_period: int, max_steps: int) -> bool:
    """Validation schedule: every ``val_period`` steps and at the last step.

    Args:
        step: The step just finished.
        val_period: Period (0 = only at the end).
        max_steps: Last step.

    Returns:
        Whether to evaluate after ``step``.
    """
    return step == max_steps or (val_period > 0 and step % val_period == 0)


def restore_trainer_state(
    start_state: dict[str, Any], *, algorithm: str, policy: Any, train_loader: Any
) -> dict[str, Any]:
    """Load a checkpoint's policy, loader and driver RNG state; return its counters.

    Args:
        start_state: A loaded training checkpoint written by a trainer of ``algorithm``.
        algorithm: Expected ``algorithm.name``.
        policy: The policy to restore into.
        train_loader: The loader to restore into.

    Returns:
        The checkpoint's ``counters`` dict (``step`` etc.).

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
    start_state: dict[str, Any] | None,
    *,
    algorithm: str,
    policy: Any,
    train_loader: Any,
    logger: RunLogger,
    restore_extra: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The trainer counters of a fresh run, or those restored from ``start_state``.

    On resume this restores policy, loader and driver RNG (``restore_trainer_state``), then
    calls ``restore_extra(start_state)`` (anything else the trainer checkpoints) and logs the
    resume line.  A fresh run's model/optimizer setup is left to the caller.

    Args:
        start_state: A loaded checkpoint, or ``None`` for a fresh run.
        algorithm: Expected ``algorithm.name`` of the checkpoint.
        policy: The policy to restore into.
        train_loader: The loader to restore into.
        logger: For the resume line.
        restore_extra: Optional extra restore step, run before the resume line.

    Returns:
        ``{"step", "consumed_samples", "val_accuracy", "initial_val_accuracy"}``.
    """
    counters: dict[str, Any] = {
        "step": 0,
        "consumed_samples": 0,
        "val_accuracy": None,
        "initial_val_accuracy": None,
    }
    if start_state is not None:
        counters.update(
            restore_trainer_state(start_state, algorithm=algorithm, policy=policy, train_loader=train_loader)
        )
        if restore_extra is not None:
            restore_extra(start_state)
        logger.info(f"resumed from {start_state['checkpoint_path']} at step {counters['step']}")
    return counters


def make_evaluator(
    policy: Any, val_problems: list[Any], *, tokenizer: Any, env: Any, master_config: Any, logger: RunLogger
) -> Callable[[], float]:
    """Held-out greedy exact-match evaluation on the driver (``rollout.evaluate``).

    Args:
        policy: The policy facade.
        val_problems: Held-out problems.
        tokenizer: The tokenizer.
        env: The reward environment.
        master_config: Root config (``logger.num_val_examples_to_print``).
        logger: Prints the example lines.

    Returns:
        A function returning the held-out accuracy.
    """
    from nemo_dp.algorithms.rollout import evaluate

    num_print = int(master_config.logger.num_val_examples_to_print)

    def _evaluate() -> float:
        ev = evaluate(policy, val_problems, tokenizer=tokenizer, env=env, num_examples_to_print=num_print)
        for line in ev["examples"]:
            logger.info(f"  {line}")
        return float(ev["val_accuracy"])

    return _evaluate


def validate_at_start(
    counters: dict[str, Any],
    evaluate_fn: Callable[[], float],
    *,
    algo: Any,
    num_problems: int,
    logger: RunLogger,
) -> None:
    """Step-0 evaluation of a fresh run when ``algorithm.val_at_start`` (logged as step 0).

    Args:
        counters: The trainer counters (``initial_val_accuracy`` is set).
        evaluate_fn: Returns the held-out accuracy.
        algo: ``master_config.algorithm``.
        num_problems: Number of held-out problems (for the log line).
        logger: The phase's logger.
    """
    if counters["step"] == 0 and bool(algo.val_at_start):
        acc = evaluate_fn()
        counters["initial_val_accuracy"] = acc
        logger.info(f"step 0: held-out accuracy {acc:.3f} ({num_problems} problems)")
        logger.log_step(0, {"val_accuracy": acc})


def record_validation(
    counters: dict[str, Any], metrics: dict[str, Any], evaluate_fn: Callable[[], float]
) -> float:
    """Evaluate after a step and record the accuracy and its wall time.

    Args:
        counters: The trainer counters (``val_accuracy`` is set).
        metrics: The step's metrics (``val_accuracy`` and ``time/val_s`` are added).
        evaluate_fn: Returns the held-out accuracy.

    Returns:
        The accuracy.
    """
    t0 = time.perf_counter()
    acc = evaluate_fn()
    counters["val_accuracy"] = acc
    metrics["val_accuracy"] = acc
    metrics["time/val_s"] = time.perf_counter() - t0
    return acc


def trainer_state(
    algorithm: str,
    counters: Mapping[str, Any],
    policy_state: Any,
    loader_state: Any,
    *,
    value_state: Any = None,
) -> dict[str, Any]:
    """The checkpointed trainer state (captures the driver RNG now).

    Args:
        algorithm: ``algorithm.name``.
        counters: The trainer counters (copied).
        policy_state: ``policy.state_dict()``.
        loader_state: The loader's state dict.
        value_state: The critic's state dict (PPO), or ``None`` when there is no critic.

    Returns:
        The state dict, keys in the order every trainer writes them.
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


def clipped_pg_loss_fn(algo: Any) -> ClippedPGLossFn:
    """The clipped policy-gradient loss of a GRPO / PPO ``algorithm`` node.

    Args:
        algo: ``master_config.algorithm`` (``loss.ratio_clip_min``/``ratio_clip_max``/
            ``reference_policy_kl_penalty``/``token_level_loss``).

    Returns:
        The loss function.
    """
    loss_cfg = algo.loss
    return ClippedPGLossFn(
        ratio_clip_min=float(loss_cfg.ratio_clip_min),
        ratio_clip_max=float(loss_cfg.ratio_clip_max),
        reference_policy_kl_penalty=float(loss_cfg.reference_policy_kl_penalty),
        token_level_loss=bool(loss_cfg.token_level_loss),
    )
