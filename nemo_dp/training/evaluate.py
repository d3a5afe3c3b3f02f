"""Greedy held-out evaluation of a saved checkpoint, in-process (no Ray), with the run's own config and
reward; nothing loaded executes code, and remote model code is refused."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

from nemo_dp.algorithms.rollout import decode_responses, mean_reward
from nemo_dp.data.arithmetic import Problem
from nemo_dp.data.jsonl import read_rl_jsonl
from nemo_dp.data.sources import build_val_problems
from nemo_dp.environments import answer_extractor, make_environment, resolve_reward
from nemo_dp.models.builders import build_model, build_tokenizer, cfg_get, load_pretrained_model, load_saved_tokenizer
from nemo_dp.models.generation import generate
from nemo_dp.models.precision import resolve_precision
from nemo_dp.models.protocol import CausalLM, Tokenizer
from nemo_dp.training.checkpoint_discovery import (
    RUN_CONFIG_FILE,
    classify_checkpoint_dir,
    find_run_dir,
    latest_checkpoint,
    list_step_dirs,
    step_of,
)
from nemo_dp.training.phases import plan_phases
from nemo_dp.training.resume import check_checkpoint_dir
from nemo_dp.utils.checkpoint import CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_VERSION, load_training_checkpoint
from nemo_dp.utils.checkpoint_io import read_manifest

__all__ = [
    "EvalOptions",
    "EvaluateConfig",
    "CheckpointRef",
    "resolve_checkpoint",
    "phase_config",
    "load_policy_model",
    "EvalSet",
    "eval_problems",
    "evaluate_checkpoint",
]

#: Top-level checkpoint key (and directory) of the policy's state.
POLICY_KEY = "policy"
_KEY = "checkpoint"


@dataclass
class EvalOptions:
    """``eval``: what to evaluate on and how.

    Attributes:
        jsonl: A user jsonl of ``{"prompt" | "messages", "answer"}`` lines; ``None``: the held-out problems.
        num_samples: Only the first this many; ``None``: the phase's ``val_samples`` (or the whole file).
        batch_size: ``None`` batches exactly as the trainer's validation does (same greedy batches).
        max_new_tokens: ``None`` takes the run's ``policy.generation.max_new_tokens``.
    """

    jsonl: Optional[str] = None
    num_samples: Optional[int] = None
    batch_size: Optional[int] = None
    max_new_tokens: Optional[int] = None
    output_file: str = "predictions.jsonl"

    def __post_init__(self) -> None:
        for name in ("num_samples", "batch_size", "max_new_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"eval.{name}: must be >= 1 or null, got {value}")
        if not self.output_file or Path(self.output_file).name != self.output_file:
            raise ValueError(f"eval.output_file: must be a plain file name, got {self.output_file!r}")


@dataclass
class EvaluateConfig:
    """Root schema of ``conf/evaluate.yaml`` (``step``/``phase`` ``None``: the latest).

    ``run_overrides`` are ``key=value`` changes to the run's config before anything is built (a
    relative tokenizer path that does not hold here); each key must exist in it.
    """

    checkpoint: str = "???"
    step: Optional[int] = None
    phase: Optional[str] = None
    run_overrides: list[str] = field(default_factory=list)
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
    """One located ``step_<N>`` directory, its run directory and the run's config (``run_overrides`` applied)."""

    path: Path
    phase: str
    step: int
    run_dir: Path
    run_cfg: DictConfig
    run_overrides: tuple[str, ...] = ()

    @property
    def run_config_file(self) -> Path:
        return self.run_dir / RUN_CONFIG_FILE


_ABSENT = object()


def _apply_overrides(run_cfg: DictConfig, overrides: Sequence[str], source: Path) -> DictConfig:
    for item in overrides:
        key, sep, _ = str(item).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"run_overrides: {item!r} is not of the form key=value")
        if OmegaConf.select(run_cfg, key.strip(), default=_ABSENT) is _ABSENT:
            raise ValueError(f"run_overrides: {key.strip()!r} is not a key of {source}")
    if not overrides:
        return run_cfg
    merged = OmegaConf.merge(run_cfg, OmegaConf.from_dotlist([str(o) for o in overrides]))
    assert isinstance(merged, DictConfig)
    return merged


def resolve_checkpoint(
    checkpoint: str | os.PathLike[str],
    *,
    step: int | None = None,
    phase: str | None = None,
    run_overrides: Sequence[str] = (),
) -> CheckpointRef:
    """Locate the checkpoint to evaluate (any form ``resume_from`` accepts), checked as a resume checks it.

    Raises:
        FileNotFoundError: The path, the run config, the phase or the step does not exist.
        ValueError: ``step``/``phase`` contradict a ``step_<N>`` path, the run config is not
            a nemo_dp one, or an override names an unknown key.
        nemo_dp.training.resume.ResumeError: The checkpoint holds a pickle.
        nemo_dp.utils.manifest.CheckpointCorruptError: A checkpoint file is damaged (by path).
    """
    path = Path(checkpoint).expanduser().resolve()
    if not path.exists():
        raise FileNotFoundError(f"checkpoint: {str(checkpoint)!r} does not exist")
    if path.is_file():
        raise FileNotFoundError(f"checkpoint: {str(path)!r} is a file, not a checkpoint directory")
    run_dir = find_run_dir(path)
    if run_dir is None:
        raise FileNotFoundError(
            f"checkpoint: no {RUN_CONFIG_FILE} in {path} or its parents; point checkpoint= at a run's "
            f"checkpoint directory (<run dir>/checkpoints)"
        )
    run_cfg = OmegaConf.load(run_dir / RUN_CONFIG_FILE)
    if not isinstance(run_cfg, DictConfig) or "algorithm" not in run_cfg or "policy" not in run_cfg:
        raise ValueError(f"checkpoint: {run_dir / RUN_CONFIG_FILE} is not a nemo_dp run config")
    run_cfg = _apply_overrides(run_cfg, run_overrides, run_dir / RUN_CONFIG_FILE)
    if path == run_dir:  # a run directory: its checkpoints root
        root_name = str(OmegaConf.select(run_cfg, "checkpointing.checkpoint_dir", default="checkpoints"))
        path = run_dir / root_name
        if not path.is_dir():
            raise FileNotFoundError(
                f"checkpoint: run directory {run_dir} has no checkpoints ({root_name}/ is missing: "
                "checkpointing.enabled was false, or the run stopped before its first save)"
            )

    located = classify_checkpoint_dir(path, committed=True)
    if located is not None and located.step_dir is not None:  # a step directory
        found_step, found_phase = step_of(path), path.parent.name
        if step is not None and step != found_step:
            raise ValueError(f"step={step} contradicts checkpoint={path} (step {found_step})")
        if phase is not None and phase != found_phase:
            raise ValueError(f"phase={phase} contradicts checkpoint={path} (phase {found_phase!r})")
        if not (path / "manifest.json").is_file():
            raise FileNotFoundError(f"checkpoint: {path} has no manifest.json (not a committed checkpoint)")
        check_checkpoint_dir(path, key=_KEY, required_files=("manifest.json",))
        return CheckpointRef(path, found_phase, found_step, run_dir, run_cfg, tuple(map(str, run_overrides)))

    if located is not None and located.kind == "phase root":  # a phase root
        phase_root = path
        if phase is not None and phase != path.name:
            raise ValueError(f"phase={phase} contradicts checkpoint={path} (phase {path.name!r})")
    else:  # a checkpoint root holding one directory per phase
        phases = {} if located is None else located.phase_roots
        if not phases:
            raise FileNotFoundError(f"checkpoint: no committed step_<N> checkpoint under {path}")
        if phase is None:
            planned = [p.name for p in plan_phases(run_cfg)]
            ordered = [p for p in planned if p in phases] or sorted(phases)
            phase = ordered[-1]
        if phase not in phases:
            raise FileNotFoundError(
                f"phase={phase}: no checkpoint of that phase under {path}; phases: {sorted(phases)}"
            )
        phase_root = phases[phase]

    steps = dict(list_step_dirs(phase_root, committed=True))
    if step is None:
        latest = latest_checkpoint(phase_root)
        if latest is None:
            raise FileNotFoundError(f"checkpoint: no committed checkpoint with a state file in {phase_root}")
        step = step_of(latest)
    if step not in steps:
        raise FileNotFoundError(f"step={step}: no checkpoint of that step under {phase_root}; steps: {sorted(steps)}")
    check_checkpoint_dir(steps[step], key=_KEY, required_files=("manifest.json",))
    return CheckpointRef(steps[step], phase_root.name, step, run_dir, run_cfg, tuple(map(str, run_overrides)))


def phase_config(ref: CheckpointRef) -> Any:
    """The root config the checkpoint's phase trained with (a warm start is its own SFT config).

    Raises:
        ValueError: The run config plans no phase of that name.
    """
    phases = plan_phases(ref.run_cfg)
    for phase in phases:
        if phase.name == ref.phase:
            return phase.cfg
    raise ValueError(
        f"phase {ref.phase!r} of {ref.path} is not a phase of {ref.run_config_file}; its phases: "
        f"{[p.name for p in phases]}"
    )


def _policy_and_export(ref: CheckpointRef) -> tuple[Any, Path]:
    """The run's ``policy`` node (refused when it allowed remote code) and the checkpoint's ``policy/``."""
    policy_cfg = ref.run_cfg.policy
    if bool(cfg_get(policy_cfg, "trust_remote_code", False)):
        raise ValueError(
            f"policy.trust_remote_code: the run ({ref.run_config_file}) allowed the model's own Python code; "
            "evaluation loads no code, so it refuses such a model"
        )
    return policy_cfg, ref.path / POLICY_KEY


#: A ``run_overrides`` entry naming one of these keys picks the tokenizer over the checkpoint's.
_TOKENIZER_KEYS: tuple[str, ...] = ("policy.tokenizer_name_or_path",)


def load_tokenizer(ref: CheckpointRef) -> Tokenizer:
    """The tokenizer the checkpoint's ``policy/`` directory holds, else (or when ``run_overrides`` name
    the tokenizer) the one built from the run's ``policy`` node.

    Raises:
        ValueError: The run allowed remote code, or the tokenizer does not load or build from here.
    """
    policy_cfg, exported = _policy_and_export(ref)
    overridden = any(str(o).partition("=")[0].strip() in _TOKENIZER_KEYS for o in ref.run_overrides)
    if exported.is_dir() and not overridden:
        try:
            saved = load_saved_tokenizer(policy_cfg, str(exported))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{exported}: cannot load the checkpoint's tokenizer: {exc}") from exc
        if saved is not None:
            return saved
    try:
        return build_tokenizer(policy_cfg)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"policy: cannot build the tokenizer of {ref.run_config_file} from {Path.cwd()}: {exc}. "
            "Relative paths in a run config are relative to the directory it trained in: run from "
            "there, or pass run_overrides='[policy.<key>=<directory>]'"
        ) from exc


def load_policy_model(ref: CheckpointRef, tokenizer: Tokenizer) -> CausalLM:
    """The policy model a checkpoint holds (``policy/`` of format 2, else the state's weights), in eval mode
    on the CPU; no checkpoint code runs.

    Raises:
        ValueError: Another format, remote code allowed, no or unfitting policy weights, or a
            model smaller than ``tokenizer``'s vocabulary (naming the file).
    """
    manifest = read_manifest(
        ref.path, expected_format=CHECKPOINT_FORMAT, supported_versions=(1, CHECKPOINT_FORMAT_VERSION)
    )
    policy_cfg, exported = _policy_and_export(ref)
    if POLICY_KEY in manifest.get("files", ()) and exported.is_dir():
        try:
            model = load_pretrained_model(policy_cfg, str(exported))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{exported}: cannot load the policy model: {exc}") from exc
        source = exported
    else:
        state = load_training_checkpoint(ref.path)
        try:
            weights = state[POLICY_KEY]["weights"]["model"]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{ref.path}: no policy weights (expected policy.weights.model)") from exc
        model = build_model(policy_cfg, vocab_size=tokenizer.vocab_size, seed=int(ref.run_cfg.seed))
        try:
            model.load_state_dict(weights)  # type: ignore[attr-defined]
        except RuntimeError as exc:
            raise ValueError(f"{ref.path}: weights do not fit policy of {ref.run_config_file}: {exc}") from exc
        source = ref.path
    if tokenizer.vocab_size > model.vocab_size:
        raise ValueError(
            f"{source}: the model has {model.vocab_size} output rows, fewer than the run's tokenizer "
            f"vocabulary ({tokenizer.vocab_size})"
        )
    model.eval()  # type: ignore[attr-defined]
    return model


@dataclass
class EvalSet:
    """The problems of one evaluation, where each comes from (``file:line`` or held-out index), the
    reward environment, the reward's name and its answer extractor."""

    problems: list[Problem]
    origins: list[str]
    env: Any
    reward: str
    extract: Callable[[str], Optional[str]]


def eval_problems(ref: CheckpointRef, options: EvalOptions, tokenizer: Tokenizer) -> EvalSet:
    """The problems to evaluate (without ``eval.jsonl``: the phase's held-out ones) and the run's reward
    environment that scores them.

    Raises:
        DatasetError: On a malformed jsonl (key, file, line and field named).
    """
    cfg = phase_config(ref)
    if options.jsonl is not None:
        records = read_rl_jsonl(options.jsonl, tokenizer=tokenizer, key="eval.jsonl")
        records = records[: options.num_samples]
        problems = [r.problem for r in records]
        origins = [f"{options.jsonl}:{r.line}" for r in records]
        env_cfg = cfg.env.copy()
        with open_dict(env_cfg):
            env_cfg.val_jsonl = options.jsonl
    else:
        if options.num_samples is not None:
            cfg = cfg.copy()
            with open_dict(cfg):
                cfg.algorithm.val_samples = int(options.num_samples)
        problems = build_val_problems(cfg, tokenizer)
        where = cfg.env.get("val_data") or cfg.env.get("val_jsonl") or "held-out problem"
        origins = [f"{where} #{i}" for i in range(len(problems))]
        env_cfg = cfg.env
    reward = resolve_reward(env_cfg)
    return EvalSet(problems, origins, make_environment(env_cfg), reward, answer_extractor(env_cfg))


def _encode(
    problems: Sequence[Problem], origins: Sequence[str], tokenizer: Tokenizer, room: int, limits: str
) -> list[list[int]]:
    prompts = []
    for problem, origin in zip(problems, origins):
        try:
            ids = tokenizer.encode_prompt(problem.prompt)
        except ValueError as exc:
            raise ValueError(f"{origin}: prompt cannot be tokenised: {exc}") from exc
        if len(ids) > room:
            raise ValueError(
                f"{origin}: prompt of {len(ids)} tokens leaves no room for the response: {limits} "
                f"= {room} tokens for the prompt"
            )
        prompts.append(ids)
    return prompts


def _batches(n: int, options: EvalOptions, policy_cfg: Any) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of the prompts decoded together."""
    if options.batch_size is not None:
        return [(s, min(s + options.batch_size, n)) for s in range(0, n, options.batch_size)]
    # As the trainer's validation: dp_size contiguous shares, generation_batch_size prompts at a time.
    dp = int(cfg_get(policy_cfg, "dp_size"))
    per_worker = int(cfg_get(policy_cfg, "generation_batch_size"))
    per = -(-n // dp)
    out = []
    for r in range(dp):
        a, b = min(r * per, n), min((r + 1) * per, n)
        out.extend((s, min(s + per_worker, b)) for s in range(a, b, per_worker))
    return out


def evaluate_checkpoint(
    ref: CheckpointRef, options: EvalOptions, out_dir: str | os.PathLike[str], *, progress_bar: bool = True
) -> dict[str, Any]:
    """Greedy exact-match accuracy of the checkpoint, also written to ``out_dir/eval_summary.json``, with
    predictions in ``out_dir/<output_file>``; every input is checked before anything is written.

    Raises:
        ValueError: On bad input (naming the file and line or the held-out index at fault).
    """
    policy_cfg = ref.run_cfg.policy
    tokenizer = load_tokenizer(ref)
    max_new = int(options.max_new_tokens or policy_cfg.generation.max_new_tokens)
    data = eval_problems(ref, options, tokenizer)
    problems = data.problems
    if not problems:
        raise ValueError(f"{options.jsonl or 'the held-out set'}: no problems to evaluate")
    seq_len = int(policy_cfg.model.max_seq_len)
    room = seq_len - max_new
    new_key = "eval.max_new_tokens" if options.max_new_tokens else "policy.generation.max_new_tokens"
    limits = (
        f"policy.model.max_seq_len ({seq_len}, of {ref.run_config_file}) minus {new_key} ({max_new}); "
        f"lower eval.max_new_tokens or shorten the prompt"
    )
    prompts = _encode(problems, data.origins, tokenizer, room, limits)
    model = load_policy_model(ref, tokenizer)
    precision = resolve_precision(policy_cfg)  # the run's: greedy answers as it evaluated them

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pred_path = out / options.output_file
    from tqdm import tqdm

    bar = tqdm(
        total=len(prompts), desc=f"eval {ref.phase} step {ref.step}", unit="problem",
        file=sys.stderr, disable=not progress_bar, dynamic_ncols=True, mininterval=0.5,
    )
    rewards_all: list[float] = []
    tmp = pred_path.with_name(pred_path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            for start, end in _batches(len(prompts), options, policy_cfg):
                batch = generate(
                    model, prompts[start:end], max_new_tokens=max_new, eos_id=tokenizer.eos_id,
                    pad_id=tokenizer.pad_id, greedy=True, temperature=1.0, seeds=[0] * (end - start),
                    precision=precision,
                )
                responses = decode_responses(batch, tokenizer)
                chunk = problems[start:end]
                rewards = data.env.score(responses, [p.answer for p in chunk]).tolist()
                for problem, response, reward in zip(chunk, responses, rewards):
                    record = {
                        "prompt": problem.prompt,
                        "response": response,
                        "extracted_answer": data.extract(response),
                        "answer": problem.answer,
                        "reward": float(reward),
                    }
                    fh.write(json.dumps(record) + "\n")
                    rewards_all.append(float(reward))
                bar.update(end - start)
        os.replace(tmp, pred_path)
    finally:
        bar.close()
        tmp.unlink(missing_ok=True)
    result = {
        "accuracy": mean_reward(rewards_all),
        "num_problems": len(problems),
        "checkpoint": str(ref.path),
        "phase": ref.phase,
        "step": ref.step,
        "predictions": str(pred_path),
        "source": options.jsonl or "held-out",
        "reward": data.reward,
    }
    (out / "eval_summary.json").write_text(json.dumps(result, indent=2))
    return result
