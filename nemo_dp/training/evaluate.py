"""Greedy held-out evaluation of a saved checkpoint, in-process on the driver (no Ray).

``launchers/evaluate.py checkpoint=<run>/checkpoints`` lands here: find the checkpoint (latest
step of the latest phase, or the one asked for), rebuild the policy model it holds from the
run's ``resolved_config.yaml``, decode greedily on the task's held-out problems (the same ones
the trainer validated on) or on a user jsonl, and write one line per problem.

Reading the checkpoint format is confined to :func:`load_policy_model`, so a new format (for
example one ``save_pretrained`` directory per checkpoint) changes one function.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from nemo_dp.algorithms.rollout import decode_responses
from nemo_dp.data.arithmetic import ArithmeticTask, Problem
from nemo_dp.models.tiny.tokenizer import EOS_TOKEN, CharTokenizer
from nemo_dp.environments.arithmetic_env import ArithmeticEnv
from nemo_dp.models.generation import generate
from nemo_dp.models.model import ModelConfig, TinyCausalLM
from nemo_dp.utils.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_FORMAT_VERSION,
    STATE_FILE,
    latest_checkpoint,
)
from nemo_dp.utils.checkpoint_io import read_manifest

__all__ = [
    "EvalOptions",
    "EvaluateConfig",
    "CheckpointRef",
    "resolve_checkpoint",
    "load_policy_model",
    "eval_problems",
    "evaluate_checkpoint",
]

RUN_CONFIG_FILE = "resolved_config.yaml"
WARM_START_PHASE = "warm_start"
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class EvalOptions:
    """``eval``: what to evaluate on and how.

    Attributes:
        jsonl: A user jsonl of ``{"prompt", "answer"}`` lines; ``None`` uses the run's own
            held-out problems.
        num_samples: Evaluate only the first this many problems; ``None`` takes the phase's
            ``val_samples`` (held-out set) or the whole file (``jsonl``).
        batch_size: Prompts decoded together.
        max_new_tokens: Most tokens per response; ``None`` takes the run's
            ``policy.generation.max_new_tokens``.
        output_file: Predictions jsonl, relative to the output directory.
    """

    jsonl: Optional[str] = None
    num_samples: Optional[int] = None
    batch_size: int = 64
    max_new_tokens: Optional[int] = None
    output_file: str = "predictions.jsonl"

    def __post_init__(self) -> None:
        if self.num_samples is not None and self.num_samples < 1:
            raise ValueError(f"eval.num_samples: must be >= 1 or null, got {self.num_samples}")
        if self.batch_size < 1:
            raise ValueError(f"eval.batch_size: must be >= 1, got {self.batch_size}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"eval.max_new_tokens: must be >= 1 or null, got {self.max_new_tokens}")
        if not self.output_file:
            raise ValueError("eval.output_file: must be a non-empty file name")


@dataclass
class EvaluateConfig:
    """Root schema of ``conf/evaluate.yaml``.

    Attributes:
        checkpoint: A run's checkpoint root (``<run>/checkpoints``), one phase's root
            (``<run>/checkpoints/sft``) or one ``step_<N>`` directory.
        step: Evaluate this step; ``None`` takes the latest.
        phase: Evaluate this phase (``sft``, ``grpo``, ``ppo``, ``warm_start``); ``None`` takes
            the run's last phase that has a checkpoint.
        eval: What to evaluate on.
        progress_bar: Show a tqdm bar over batches.
        torch_threads: Compute threads of this process.
    """

    checkpoint: str = "???"
    step: Optional[int] = None
    phase: Optional[str] = None
    eval: EvalOptions = field(default_factory=EvalOptions)
    progress_bar: bool = True
    torch_threads: int = 1

    def __post_init__(self) -> None:
        if self.step is not None and self.step < 0:
            raise ValueError(f"step: must be >= 0 or null, got {self.step}")
        if self.torch_threads < 1:
            raise ValueError(f"torch_threads: must be >= 1, got {self.torch_threads}")


@dataclass
class CheckpointRef:
    """One located checkpoint.

    Attributes:
        path: The ``step_<N>`` directory.
        phase: The phase it belongs to (the name of its parent directory).
        step: Its step.
        run_dir: The run directory holding ``resolved_config.yaml``.
        run_cfg: The run's resolved config.
    """

    path: Path
    phase: str
    step: int
    run_dir: Path
    run_cfg: DictConfig


def _committed_steps(phase_root: Path) -> dict[int, Path]:
    steps: dict[int, Path] = {}
    if phase_root.is_dir():
        for child in phase_root.iterdir():
            m = _STEP_DIR.match(child.name)
            if m and (child / "manifest.json").is_file():
                steps[int(m.group(1))] = child
    return steps


def _find_run_dir(start: Path) -> Path:
    for candidate in (start, *start.parents):
        if (candidate / RUN_CONFIG_FILE).is_file():
            return candidate
    raise FileNotFoundError(
        f"checkpoint: no {RUN_CONFIG_FILE} in {start} or its parents; point checkpoint= at a run's "
        f"checkpoint directory (<run dir>/checkpoints)"
    )


def _phase_order(run_cfg: DictConfig) -> list[str]:
    algo = run_cfg.algorithm
    order = []
    if "warm_start" in algo and bool(algo.warm_start.enabled):
        order.append(WARM_START_PHASE)
    order.append(str(algo.name))
    return order


def resolve_checkpoint(
    checkpoint: str | os.PathLike[str], *, step: int | None = None, phase: str | None = None
) -> CheckpointRef:
    """Locate the checkpoint to evaluate.

    Args:
        checkpoint: A checkpoint root, a phase root or a ``step_<N>`` directory.
        step: A given step (``None``: the latest of the phase).
        phase: A given phase (``None``: the run's last phase with a checkpoint).

    Returns:
        The located checkpoint with its run config.

    Raises:
        FileNotFoundError: If the path, the run config, the phase or the step does not exist;
            the message lists what does.
        ValueError: If ``step``/``phase`` contradict a ``step_<N>`` path.
    """
    path = Path(checkpoint).expanduser().resolve()
    if not path.exists():
        raise FileNotFoundError(f"checkpoint: {str(checkpoint)!r} does not exist")
    run_dir = _find_run_dir(path)
    run_cfg = OmegaConf.load(run_dir / RUN_CONFIG_FILE)
    if not isinstance(run_cfg, DictConfig) or "algorithm" not in run_cfg or "policy" not in run_cfg:
        raise ValueError(f"checkpoint: {run_dir / RUN_CONFIG_FILE} is not a nemo_dp run config")

    m = _STEP_DIR.match(path.name)
    if m is not None:  # a step directory
        found_step, found_phase = int(m.group(1)), path.parent.name
        if step is not None and step != found_step:
            raise ValueError(f"step={step} contradicts checkpoint={path} (step {found_step})")
        if phase is not None and phase != found_phase:
            raise ValueError(f"phase={phase} contradicts checkpoint={path} (phase {found_phase!r})")
        if not (path / "manifest.json").is_file():
            raise FileNotFoundError(f"checkpoint: {path} has no manifest.json (not a committed checkpoint)")
        return CheckpointRef(path, found_phase, found_step, run_dir, run_cfg)

    if _committed_steps(path):  # a phase root
        phase_root = path
        if phase is not None and phase != path.name:
            raise ValueError(f"phase={phase} contradicts checkpoint={path} (phase {path.name!r})")
    else:  # a checkpoint root holding one directory per phase
        phases = {child.name: child for child in sorted(path.iterdir()) if _committed_steps(child)}
        if not phases:
            raise FileNotFoundError(f"checkpoint: no committed step_<N> checkpoint under {path}")
        if phase is None:
            ordered = [p for p in _phase_order(run_cfg) if p in phases] or sorted(phases)
            phase = ordered[-1]
        if phase not in phases:
            raise FileNotFoundError(
                f"phase={phase}: no checkpoint of that phase under {path}; phases: {sorted(phases)}"
            )
        phase_root = phases[phase]

    steps = _committed_steps(phase_root)
    if step is None:
        latest = latest_checkpoint(phase_root)
        if latest is None:
            raise FileNotFoundError(f"checkpoint: no committed checkpoint with a state file in {phase_root}")
        step = int(_STEP_DIR.match(latest.name).group(1))  # type: ignore[union-attr]
    if step not in steps:
        raise FileNotFoundError(
            f"step={step}: no checkpoint of that step under {phase_root}; steps: {sorted(steps)}"
        )
    return CheckpointRef(steps[step], phase_root.name, step, run_dir, run_cfg)


def load_policy_model(ref: CheckpointRef, vocab_size: int) -> TinyCausalLM:
    """The policy model a checkpoint holds, in eval mode on the CPU.

    Reads the training-checkpoint format of ``nemo_dp.utils.checkpoint`` (manifest +
    ``state.pt``, policy weights under ``policy.weights.model``) with torch's weights-only
    unpickler, so loading runs no code; the model shape comes from the run's
    ``policy.model``.

    Args:
        ref: The located checkpoint.
        vocab_size: The tokenizer's vocabulary size.

    Returns:
        The model with the checkpoint's weights.

    Raises:
        ValueError: If the manifest names another format, the state lacks policy weights or
            the weights do not fit ``policy.model`` (the message names the file).
    """
    read_manifest(
        ref.path, expected_format=CHECKPOINT_FORMAT, supported_versions=(CHECKPOINT_FORMAT_VERSION,)
    )
    state_path = ref.path / STATE_FILE
    import numpy as np

    # The state also holds RNG snapshots (NumPy arrays); these are the only non-tensor types
    # the weights-only unpickler is allowed to rebuild.
    core = getattr(np, "_core", None) or np.core  # NumPy 2 renamed numpy.core
    numpy_types = [np.ndarray, np.dtype, core.multiarray._reconstruct, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(numpy_types):
        state = torch.load(state_path, map_location="cpu", weights_only=True)
    try:
        weights = state["policy"]["weights"]["model"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{state_path}: no policy weights (expected policy.weights.model)") from exc
    m = ref.run_cfg.policy.model
    model = TinyCausalLM(
        ModelConfig(
            vocab_size=vocab_size,
            n_layers=int(m.n_layers),
            d_model=int(m.d_model),
            n_heads=int(m.n_heads),
            max_seq_len=int(m.max_seq_len),
            dropout=float(m.dropout),
        ),
        seed=0,
    )
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise ValueError(
            f"{state_path}: weights do not fit policy.model of {ref.run_dir / RUN_CONFIG_FILE}: {exc}"
        ) from exc
    return model.eval()


def _jsonl_problems(path: str) -> tuple[list[Problem], list[int]]:
    from nemo_dp.data.jsonl import load_rl_jsonl

    problems = load_rl_jsonl(path)
    with open(path, encoding="utf-8") as fh:
        lines = [i for i, line in enumerate(fh, start=1) if line.strip()]
    return problems, lines


def eval_problems(ref: CheckpointRef, options: EvalOptions) -> tuple[list[Problem], list[str]]:
    """The problems to evaluate and where each comes from (for error messages).

    Without ``eval.jsonl`` these are the held-out problems the phase's trainer validated on:
    ``env.val_jsonl`` if the run set it, else the arithmetic task's held-out partition, first
    ``val_samples`` of them (``algorithm.warm_start.val_samples`` for a warm-start checkpoint).

    Args:
        ref: The located checkpoint (its run config).
        options: The ``eval`` options.

    Returns:
        ``(problems, origins)`` with one ``origin`` string per problem.

    Raises:
        ValueError: On a malformed jsonl (file and line named) or too few held-out problems.
    """
    cfg = ref.run_cfg
    if options.jsonl is not None:
        problems, lines = _jsonl_problems(options.jsonl)
        origins = [f"{options.jsonl}:{n}" for n in lines]
        limit = options.num_samples if options.num_samples is not None else len(problems)
    else:
        algo = cfg.algorithm
        warm = ref.phase == WARM_START_PHASE
        val_samples = int(algo.warm_start.val_samples) if warm else int(algo.val_samples)
        limit = options.num_samples if options.num_samples is not None else val_samples
        env = cfg.env
        if env.get("val_jsonl") is not None:
            problems, lines = _jsonl_problems(str(env.val_jsonl))
            origins = [f"{env.val_jsonl}:{n}" for n in lines]
        else:
            task = ArithmeticTask(int(env.digits), tuple(env.operators), int(env.seed))
            problems = task.eval_problems(limit)
            origins = [f"held-out problem {i}" for i in range(len(problems))]
    return problems[:limit], origins[:limit]


def _encode(
    problems: Sequence[Problem], origins: Sequence[str], tokenizer: CharTokenizer, max_len: int
) -> list[list[int]]:
    prompts = []
    for problem, origin in zip(problems, origins):
        try:
            ids = tokenizer.encode_prompt(problem.prompt)
        except ValueError as exc:
            raise ValueError(f"{origin}: prompt cannot be tokenised: {exc}") from exc
        if len(ids) > max_len:
            raise ValueError(
                f"{origin}: prompt of {len(ids)} tokens leaves no room for the response "
                f"(policy.model.max_seq_len minus max_new_tokens = {max_len})"
            )
        prompts.append(ids)
    return prompts


def evaluate_checkpoint(
    ref: CheckpointRef,
    options: EvalOptions,
    out_dir: str | os.PathLike[str],
    *,
    progress_bar: bool = True,
) -> dict[str, Any]:
    """Greedy exact-match accuracy of the checkpoint; predictions written as jsonl.

    Every input is checked (problems loaded and tokenised, lengths fit the model) before the
    model is loaded and before anything is written.

    Args:
        ref: The located checkpoint.
        options: The ``eval`` options.
        out_dir: Output directory (created) for ``options.output_file`` and ``eval_summary.json``.
        progress_bar: Show a tqdm bar over batches (stderr).

    Returns:
        ``{"accuracy", "num_problems", "checkpoint", "phase", "step", "predictions",
        "source"}``.

    Raises:
        ValueError: On bad input (naming the file and line or the held-out index at fault).
    """
    tokenizer = CharTokenizer()
    max_new = int(options.max_new_tokens or ref.run_cfg.policy.generation.max_new_tokens)
    problems, origins = eval_problems(ref, options)
    room = int(ref.run_cfg.policy.model.max_seq_len) - max_new
    prompts = _encode(problems, origins, tokenizer, room)
    model = load_policy_model(ref, tokenizer.vocab_size)
    env = ArithmeticEnv()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pred_path = out / options.output_file
    from tqdm import tqdm

    bar = tqdm(
        total=len(prompts), desc=f"eval {ref.phase} step {ref.step}", unit="problem",
        file=sys.stderr, disable=not progress_bar, dynamic_ncols=True, mininterval=0.5,
    )
    correct = 0.0
    tmp = pred_path.with_name(pred_path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for start in range(0, len(prompts), options.batch_size):
            chunk = prompts[start : start + options.batch_size]
            batch = generate(
                model, chunk, max_new_tokens=max_new, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id,
                greedy=True, temperature=1.0, seeds=[0] * len(chunk),
            )
            responses = decode_responses(batch, tokenizer)
            answers = [p.answer for p in problems[start : start + len(chunk)]]
            rewards = env.score(responses, answers).tolist()
            for j, (response, reward) in enumerate(zip(responses, rewards)):
                problem = problems[start + j]
                record = {
                    "prompt": problem.prompt,
                    "response": response,
                    "extracted_answer": response.split(EOS_TOKEN, 1)[0],
                    "answer": problem.answer,
                    "reward": float(reward),
                }
                fh.write(json.dumps(record) + "\n")
                correct += float(reward)
            bar.update(len(chunk))
    bar.close()
    os.replace(tmp, pred_path)
    result = {
        "accuracy": correct / len(problems),
        "num_problems": len(problems),
        "checkpoint": str(ref.path),
        "phase": ref.phase,
        "step": ref.step,
        "predictions": str(pred_path),
        "source": options.jsonl or "held-out",
    }
    (out / "eval_summary.json").write_text(json.dumps(result, indent=2))
    return result
