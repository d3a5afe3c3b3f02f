"""Phase planning of a run (an optional SFT warm start, then the main algorithm) and where it starts:
:func:`plan_run_start` decides on the driver and writes nothing; :meth:`RunStart.commit` writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_dp.config import warm_start_config
from nemo_dp.training.checkpointer import load_checkpoint_state
from nemo_dp.training.resume import (
    InitFromPlan,
    ResumePlan,
    model_shape_of,
    resolve_init_from,
    resolve_resume,
    run_settings,
)
from nemo_dp.training.run_dir import RunDirDecision, claim_run_dir, continue_history
from nemo_dp.utils.checkpoint import REQUIRED_FILES

__all__ = [
    "Phase",
    "main_phase",
    "warm_start_phase",
    "plan_phases",
    "RunStart",
    "run_model_shape",
    "plan_run_start",
]


@dataclass
class Phase:
    """One training phase: short ``name`` (checkpoint sub-root), ``label`` for log lines, the root ``cfg``
    its trainer receives and its output sub-directory (``""`` = the run directory itself)."""

    name: str
    label: str
    cfg: Any
    out_subdir: str


def main_phase(cfg: Any) -> Phase:
    """The phase of the root config's own algorithm, writing into the run directory itself."""
    name = str(cfg.algorithm.name)
    return Phase(name, _label(cfg, name.upper()), cfg, "")


def warm_start_phase(cfg: Any) -> Phase:
    """The SFT warm-start phase of an RL config (enabled or not), writing into ``warm_start/``.

    Raises:
        ValueError: The algorithm has no warm start.
    """
    return Phase("warm_start", _label(cfg, "SFT warm start"), warm_start_config(cfg), "warm_start")


def _label(cfg: Any, base: str) -> str:
    """``base``, prefixed with ``VLM`` when the policy reads images (``VLM GRPO``, ``VLM SFT``)."""
    from nemo_dp.models.builders import policy_takes_images

    return f"VLM {base}" if policy_takes_images(cfg.policy) else base


def plan_phases(cfg: Any) -> list[Phase]:
    """The phases a config asks for, in order: an optional SFT warm start, then the main algorithm.

    Raises:
        ValueError: ``algorithm=ppo`` with a vision-language policy (PPO's critic is a text value model).
    """
    from nemo_dp.models.builders import policy_takes_images

    if str(cfg.algorithm.name) == "ppo" and policy_takes_images(cfg.policy):
        raise ValueError(
            f"algorithm=ppo: not supported with policy={cfg.policy.kind} (a vision-language policy has no "
            "PPO critic); use algorithm=grpo or algorithm=sft"
        )
    phases: list[Phase] = []
    if "warm_start" in cfg.algorithm and bool(cfg.algorithm.warm_start.enabled):
        phases.append(warm_start_phase(cfg))
    phases.append(main_phase(cfg))
    return phases


def run_model_shape(cfg: Any, tokenizer: Any) -> dict[str, int]:
    """The model shape a checkpoint records: ``policy.model``'s integers, ``vocab_size`` and, for a
    HuggingFace policy, ``config.json``'s sizes prefixed ``hf.``."""
    import json

    shape = model_shape_of(cfg.policy.model, vocab_size=int(tokenizer.vocab_size))
    path = getattr(cfg.policy, "model_name_or_path", None)
    config_json = None if path is None else Path(str(path)) / "config.json"
    if config_json is not None and config_json.is_file():
        raw = json.loads(config_json.read_text(encoding="utf-8"))
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "intermediate_size", "vocab_size", "n_embd", "n_layer", "n_head"):
            value = raw.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                shape[f"hf.{key}"] = value
    return dict(sorted(shape.items()))


@dataclass
class RunStart:
    """Where a run starts, decided on the driver before anything is written: the resolved ``resume``
    (``None``: fresh) or ``init_from`` (a fresh run's only), one loaded state (or ``None``) per phase,
    the index of the first phase to run and log lines describing the decisions."""

    phases: list[Phase]
    model_shape: dict[str, int]
    data_plane: str
    resume: ResumePlan | None
    init_from: InitFromPlan | None
    decision: RunDirDecision
    start_states: list[dict[str, Any] | None]
    first: int
    lines: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.decision.run_id

    def commit(self, run_dir: Path, metrics_file: str) -> list[str]:
        """Perform the run-directory decision and continue a resumed run's metrics; return log lines."""
        lines = list(self.decision.commit())
        lines.append(self.decision.message)
        if self.resume is not None and self.resume.run_dir is not None:
            reports = continue_history(
                source_run_dir=self.resume.run_dir,
                run_dir=run_dir,
                phase_subdirs=[p.out_subdir for p in self.phases],
                resume_phase_index=self.resume.phase_index,
                resume_step=self.resume.step,
                metrics_file=metrics_file,
            )
            lines.extend(report.describe() for report in reports)
        return lines


def plan_run_start(cfg: Any, validated: Any, run_dir: Path, tokenizer: Any) -> RunStart:
    """Resolve resume / init_from and claim the run directory (writes nothing).

    Raises:
        nemo_dp.training.resume.ResumeError: ``resume_from`` / ``init_from`` holds no usable
            checkpoint for this run, or one of another algorithm, phase, model shape or data plane.
        nemo_dp.training.run_dir.RunDirError: ``run_dir`` holds another run's outputs.
        nemo_dp.utils.manifest.CheckpointCorruptError: A checkpoint file is damaged (by path).
    """
    from nemo_dp.data_plane.registry import backend_for_config

    phases = plan_phases(cfg)
    ck = validated.checkpointing
    shape = run_model_shape(cfg, tokenizer)
    kind = backend_for_config(validated.data_plane).kind  # the backend kind checkpoints record
    lines: list[str] = []
    plan = None
    if ck.resume_from is not None:
        plan = resolve_resume(
            ck.resume_from,
            phase_names=[p.name for p in phases],
            algorithm=str(cfg.algorithm.name),
            phase_algorithms={p.name: str(p.cfg.algorithm.name) for p in phases},
            data_plane=kind,
            model_shape=shape,
            checkpoint_dir_name=ck.checkpoint_dir,
            required_files=REQUIRED_FILES,
            phase_settings={p.name: run_settings(p.cfg) for p in phases},
        )
        lines.append(plan.describe())
    init = None
    init_from = getattr(cfg.policy, "init_from", None)
    if init_from is not None:
        if plan is not None:
            lines.append(
                f"init_from: policy.init_from={init_from} ignored: the run resumes from "
                f"{plan.checkpoint}, whose weights win"
            )
        else:
            init = resolve_init_from(
                str(init_from), model_shape=shape, checkpoint_dir_name=ck.checkpoint_dir, required_files=REQUIRED_FILES
            )
            lines.append(init.describe())
    decision = claim_run_dir(
        run_dir,
        checkpoint_dir=ck.checkpoint_dir,
        metrics_file=str(validated.logger.metrics_file),
        resume=plan,
        phase_names=[p.name for p in phases],
        overwrite=bool(ck.overwrite),
    )
    paths = [None if plan is None else plan.start_checkpoint(p.name) for p in phases]
    start_states = [None if path is None else load_checkpoint_state(path) for path in paths]
    return RunStart(
        phases=phases,
        model_shape=shape,
        data_plane=kind,
        resume=plan,
        init_from=init,
        decision=decision,
        start_states=start_states,
        first=0 if plan is None else plan.phase_index,
        lines=lines,
    )
