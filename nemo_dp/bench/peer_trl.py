"""``bench=peer_trl``: nemo_dp's GRPO and TRL's ``GRPOTrainer`` side by side, in one run.

Both train the same model on the same prompts, reward and settings within one core budget
(nemo_dp: ``policy.dp_size`` workers x ``policy.torch_threads`` on a private Ray; TRL: in this
process, afterwards).  Per precision it reports steady-state seconds per step, samples per second,
rewards, and each phase's GFLOP/s (``nemo_dp.bench.flops``) against the host's matmul peak.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nemo_dp.bench import bench_fail
from nemo_dp.bench.flops import ModelShape, cpu_info, matmul_gflops, phase_flops
from nemo_dp.bench.peer_report import PHASES, peer_table, print_peer_report, target_checks

__all__ = ["PRECISIONS", "SIDES", "PeerTrlBenchConfig", "nemo_train_overrides", "run_peer_trl_bench"]

#: ``policy.precision`` values the bench can compare.
PRECISIONS: tuple[str, ...] = ("32-true", "bf16-mixed", "bf16-true")
#: The two trainers; a ``data_planes`` entry other than ``disabled`` adds a nemo_dp column.
SIDES: tuple[str, ...] = ("nemo_dp", "trl")
_DATA_PLANES: tuple[str, ...] = ("disabled", "tq", "ray")


@dataclass
class PeerTrlBenchConfig:
    """``bench`` for ``bench=peer_trl`` (schema of ``conf_bench/bench/peer_trl.yaml``)."""

    name: str = "peer_trl"
    precisions: list[str] = field(default_factory=lambda: ["32-true", "bf16-mixed"])
    sides: list[str] = field(default_factory=lambda: list(SIDES))
    data_planes: list[str] = field(default_factory=lambda: ["disabled"])
    digits: int = 1
    num_train_prompts: int = 80
    prompts_per_step: int = 16
    group_size: int = 4
    max_new_tokens: int = 12
    max_seq_len: int = 64
    kl_coef: float = 0.04
    clip_eps: float = 0.2
    lr: float = 1.0e-5
    temperature: float = 1.0
    warmup_steps: int = 2
    measured_steps: int = 3
    cores: int = 2
    nemo_dp_size: int = 2
    train_overrides: list[str] = field(default_factory=list)
    matmul_shape: list[int] = field(default_factory=lambda: [2048, 576, 1536])
    matmul_seconds: float = 1.0
    trl_niceness: int = 15
    num_cpus: int = 2
    seed: int = 42
    output_file: str = "bench_peer_trl.json"

    def __post_init__(self) -> None:
        for key, legal in (("precisions", PRECISIONS), ("sides", SIDES), ("data_planes", _DATA_PLANES)):
            values = list(getattr(self, key))
            if not values or len(set(values)) != len(values) or any(v not in legal for v in values):
                bench_fail(key, f"need distinct values of {list(legal)}, got {values}")
        for key in ("digits", "num_train_prompts", "prompts_per_step", "max_new_tokens", "max_seq_len",
                    "measured_steps", "cores", "nemo_dp_size", "num_cpus"):
            if int(getattr(self, key)) < 1:
                bench_fail(key, f"must be >= 1, got {getattr(self, key)}")
        if self.group_size < 2:
            bench_fail("group_size", f"must be >= 2 (group-relative advantages), got {self.group_size}")
        if self.warmup_steps < 1:
            bench_fail("warmup_steps", f"must be >= 1 (the first step is never steady state), got {self.warmup_steps}")
        if self.cores % self.nemo_dp_size:
            bench_fail("nemo_dp_size", f"must divide bench.cores={self.cores}, got {self.nemo_dp_size}")
        if self.num_train_prompts < self.prompts_per_step:
            bench_fail("num_train_prompts", f"must be >= bench.prompts_per_step={self.prompts_per_step}")
        if self.kl_coef < 0 or self.clip_eps < 0 or self.lr <= 0 or self.temperature <= 0:
            bench_fail("kl_coef", f"need kl_coef >= 0, clip_eps >= 0, lr > 0, temperature > 0; got "
                  f"{self.kl_coef}, {self.clip_eps}, {self.lr}, {self.temperature}")
        if len(self.matmul_shape) != 3 or min(self.matmul_shape) < 1:
            bench_fail("matmul_shape", f"need [m, k, n] >= 1, got {self.matmul_shape}")
        if not self.matmul_seconds > 0:
            bench_fail("matmul_seconds", f"must be > 0, got {self.matmul_seconds}")
        if not 0 <= self.trl_niceness <= 19:
            bench_fail("trl_niceness", f"must be in [0, 19], got {self.trl_niceness}")
        if not self.output_file or "/" in self.output_file:
            bench_fail("output_file", f"must be a plain file name, got {self.output_file!r}")

    @property
    def samples_per_step(self) -> int:
        """Rows per optimizer step (prompts x group size)."""
        return self.prompts_per_step * self.group_size


def nemo_train_overrides(bench: PeerTrlBenchConfig, precision: str, data_plane: str) -> list[str]:
    """Overrides of ``conf/config.yaml`` that make nemo_dp's GRPO run the bench's settings.

    The run is one GRPO phase without warm start, validating only after its extra last step
    (which is not measured), one optimizer step per rollout, and advantages normalised like
    TRL's (group mean baseline, group std), so both sides optimise the same objective. The
    bench's ``train_overrides`` come last, so they win.
    """
    return [
        "~recipe",
        "algorithm=grpo",
        f"data_plane={data_plane}",
        "algorithm.val_at_start=false",
        "algorithm.val_period=0",
        "algorithm.val_samples=8",
        "checkpointing.enabled=false",
        "logger.plot=false",
        "logger.progress_bar=false",
        f"seed={bench.seed}",
        f"env.digits={bench.digits}",
        "env.operators=[+]",
        "env.format=chat",
        "env.reward=math",
        f"algorithm.max_steps={bench.warmup_steps + bench.measured_steps + 1}",
        "algorithm.warm_start.enabled=false",
        f"algorithm.num_train_prompts={bench.num_train_prompts}",
        f"algorithm.num_prompts_per_step={bench.prompts_per_step}",
        f"algorithm.num_generations_per_prompt={bench.group_size}",
        "algorithm.use_leave_one_out_baseline=false",
        "algorithm.normalize_rewards=true",
        f"algorithm.loss.reference_policy_kl_penalty={bench.kl_coef}",
        f"algorithm.loss.ratio_clip_min={bench.clip_eps}",
        f"algorithm.loss.ratio_clip_max={bench.clip_eps}",
        "algorithm.loss.token_level_loss=true",
        f"policy.train_global_batch_size={bench.samples_per_step}",
        # One training pass per rank over its share, as TRL trains its one batch in one pass.
        f"policy.train_micro_batch_size={bench.samples_per_step // bench.nemo_dp_size}",
        f"policy.dp_size={bench.nemo_dp_size}",
        f"policy.torch_threads={bench.cores // bench.nemo_dp_size}",
        f"policy.precision={precision}",
        f"policy.model.max_seq_len={bench.max_seq_len}",
        f"policy.generation.max_new_tokens={bench.max_new_tokens}",
        f"policy.generation.temperature={bench.temperature}",
        f"policy.optimizer.lr={bench.lr}",
        "policy.optimizer.schedule=constant",
        "policy.optimizer.warmup_steps=0",
        *bench.train_overrides,
    ]


def _steady(rows: list[dict[str, Any]], warmup: int, measured: int) -> list[dict[str, Any]]:
    picked = [r for r in rows if warmup < int(r["step"]) <= warmup + measured]
    if len(picked) != measured:
        raise RuntimeError(
            f"bench peer_trl: measured {len(picked)} steps, expected bench.measured_steps={measured} "
            f"(steps logged: {[r['step'] for r in rows]})"
        )
    return picked


def summarize_side(
    rows: list[dict[str, Any]],
    bench: PeerTrlBenchConfig,
    *,
    shape: ModelShape,
    prompt_len: float,
    logprob_forwards: int,
) -> dict[str, Any]:
    """Steady-state figures of one side from its per-step rows.

    Args:
        rows: ``{"step", "step_time_s", "time/<phase>_s", "reward_mean",
            "mean_response_length"}`` per optimizer step.
        prompt_len: Mean prompt length in tokens.
        logprob_forwards: Forwards per row in this side's log-prob phase.

    Returns:
        ``step_s`` (median), ``samples_per_s``, per phase mean seconds ``<phase>_s`` and
        ``other_s`` (the mean step less the phases), FLOPs
        ``<phase>_gflop`` and rate ``<phase>_gflops``, the ``rewards`` of every step, the mean
        response length, and ``logprob_forwards``.
    """
    steady = _steady(rows, bench.warmup_steps, bench.measured_steps)
    step_s = statistics.median(float(r["step_time_s"]) for r in steady)
    response_len = statistics.fmean(max(1.0, float(r["mean_response_length"])) for r in steady)
    flops = phase_flops(
        shape,
        samples=bench.samples_per_step,
        prompt_len=prompt_len,
        response_len=response_len,
        logprob_forwards=logprob_forwards,
    ).as_dict()
    out: dict[str, Any] = {
        "step_s": step_s,
        "samples_per_s": bench.samples_per_step / step_s,
        "mean_response_length": response_len,
        "logprob_forwards": logprob_forwards,
        "rewards": [float(r["reward_mean"]) for r in rows],
        "step_times_s": [float(r["step_time_s"]) for r in rows],
    }
    for phase in PHASES:
        seconds = statistics.fmean(float(r[f"time/{phase}_s"]) for r in steady)
        out[f"{phase}_s"] = seconds
        out[f"{phase}_gflop"] = flops[phase] / 1e9
        out[f"{phase}_gflops"] = flops[phase] / 1e9 / seconds if seconds > 0 else None
    # Against the mean step (the phases are means too): the median step can be shorter than
    # the phases' sum when one measured step still ran slow.
    mean_step_s = statistics.fmean(float(r["step_time_s"]) for r in steady)
    out["other_s"] = mean_step_s - sum(out[f"{p}_s"] for p in PHASES)
    return out


def _nemo_logprob_forwards(record: dict[str, Any], kl_coef: float) -> int:
    """Forwards nemo_dp's log-prob phase ran per row, from the step's metrics.

    A step whose ``prev_logprobs_source`` is the training forward ran no separate policy
    forward; the reference forward runs when the KL coefficient is above 0.
    """
    from nemo_dp.algorithms.grpo_common import TRAIN_FORWARD

    reused = record.get("prev_logprobs_source") == TRAIN_FORWARD
    return (0 if reused else 1) + (1 if kl_coef > 0 else 0)


def _run_nemo(train_cfg: DictConfig, ray_env: dict[str, str], run_dir: Path) -> tuple[list[dict[str, Any]], dict]:
    from nemo_dp.bench.steps import timed_phase_run

    marks, _ = timed_phase_run(train_cfg, ray_env, run_dir, rss_interval_s=0.05)
    rows = []
    last_record: dict[str, Any] = {}
    for (_, t0, _, _), (step, t1, _, record) in zip(marks, marks[1:]):
        rows.append(
            {
                "step": step,
                "step_time_s": t1 - t0,
                "time/generation_s": float(record["time/generation_s"]),
                "time/logprobs_s": float(record["time/logprobs_s"]),
                "time/train_s": float(record["time/train_s"]),
                "reward_mean": float(record["reward_mean"]),
                "mean_response_length": float(record["mean_response_length"]),
            }
        )
        last_record = record
    return rows, last_record


def _model_dir(train_cfg: DictConfig) -> str:
    from nemo_dp.models.hf.settings import hf_settings

    return str(Path(hf_settings(train_cfg.policy).model_name_or_path).expanduser().resolve())


def _mean_prompt_len(train_cfg: DictConfig, problems: list[Any]) -> float:
    """Mean token length of the problems as the policy sees them (chat template, bos)."""
    from nemo_dp.data.chat import Message, encode_prompt_text, render_prompt
    from nemo_dp.training import make_tokenizer

    tok = make_tokenizer(train_cfg)
    lengths = [len(encode_prompt_text(render_prompt((Message("user", p.prompt),), tok), tok)) for p in problems]
    return statistics.fmean(lengths)


def host_peaks(bench: PeerTrlBenchConfig) -> dict[str, float]:
    """Matmul GFLOP/s of the bench's shape in float32 and bfloat16, on the budget and on one core."""
    m, k, n = bench.matmul_shape
    out = {}
    for dtype in ("float32", "bfloat16"):
        out[f"{dtype}_budget"] = matmul_gflops(m, k, n, dtype, bench.cores, min_seconds=bench.matmul_seconds)
        out[f"{dtype}_1core"] = matmul_gflops(m, k, n, dtype, 1, min_seconds=bench.matmul_seconds)
    return out


def run_peer_trl_bench(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    """Run nemo_dp and TRL per precision on one model; print the tables; write and return the JSON.

    ``cfg.bench`` is a :class:`PeerTrlBenchConfig`; runs, TRL's output dirs and the JSON go to
    ``output_dir``.
    """
    from hydra import compose

    from nemo_dp.bench.steps import _REPO_ROOT, launcher_policy_overrides
    from nemo_dp.bench.trl_side import TrlRunSettings, run_trl_grpo, trl_output_dir
    from nemo_dp.config import register_configs, validate_config
    from nemo_dp.data.sources import arithmetic_task
    from nemo_dp.data_plane.registry import ray_start_args
    from nemo_dp.distributed.ray_init import init_ray, shutdown_ray
    from nemo_dp.models.builders import prepare_policy, validate_policy

    bench = OmegaConf.to_object(cfg.bench)
    if not isinstance(bench, PeerTrlBenchConfig):
        raise ValueError(f"bench: expected the peer_trl schema, got {type(bench).__name__}")
    register_configs(_REPO_ROOT / "recipes")
    policy_overrides = launcher_policy_overrides() or ["policy=smollm2"]

    def train_config(precision: str, data_plane: str) -> DictConfig:
        train_cfg = compose("config", overrides=[*policy_overrides, *nemo_train_overrides(bench, precision, data_plane)])
        validate_config(train_cfg)
        prepare_policy(train_cfg.policy)
        validate_policy(train_cfg.policy)
        return train_cfg

    first = train_config(bench.precisions[0], bench.data_planes[0])
    model_dir = _model_dir(first)
    shape = ModelShape.from_model_dir(model_dir)
    problems = arithmetic_task(first.env).train_problems(bench.num_train_prompts)
    prompt_len = _mean_prompt_len(first, problems)
    host = {"cpu": cpu_info(), "load_average_start": list(os.getloadavg())}
    print(f"[bench] peer_trl: host {host['cpu']['model']}, flags "
          f"{' '.join(f for f, on in host['cpu']['flags'].items() if on) or '(none of interest)'}", flush=True)
    print(f"[bench] peer_trl: measuring matmul peak {bench.matmul_shape} ...", flush=True)
    host["matmul_gflops"] = host_peaks(bench)

    sides: dict[str, dict[str, Any]] = {}
    ray_env: dict[str, str] | None = None
    try:
        if "nemo_dp" in bench.sides:
            ray_env = init_ray(num_cpus=bench.num_cpus, **ray_start_args(train_config(bench.precisions[0], "tq").data_plane))
            for precision in bench.precisions:
                for dp in bench.data_planes:
                    label = "nemo_dp" if dp == "disabled" else f"nemo_dp[{dp}]"
                    print(f"[bench] peer_trl: {label} {precision}", flush=True)
                    rows, record = _run_nemo(train_config(precision, dp), ray_env, output_dir / f"nemo_{dp}_{precision}")
                    summary = summarize_side(rows, bench, shape=shape, prompt_len=prompt_len,
                                             logprob_forwards=_nemo_logprob_forwards(record, bench.kl_coef))
                    sides[f"{label}|{precision}"] = {"side": label, "precision": precision, "steps": rows, **summary}
    finally:
        if ray_env is not None:
            shutdown_ray()
    if "trl" in bench.sides:
        # Ray runs nemo_dp's workers niced; TRL gets the same priority on a shared host
        # (lowering a niceness is never needed: it only goes up here, once, for the rest of the run).
        host["trl_niceness"] = os.nice(max(0, bench.trl_niceness - os.nice(0)))
        algo, opt = first.algorithm, first.policy.optimizer
        for precision in bench.precisions:
            print(f"[bench] peer_trl: trl {precision}", flush=True)
            settings = TrlRunSettings(
                model_dir=model_dir,
                prompts=tuple(p.prompt for p in problems),
                answers=tuple(p.answer for p in problems),
                group_size=bench.group_size,
                prompts_per_step=bench.prompts_per_step,
                max_new_tokens=int(first.policy.generation.max_new_tokens),
                kl_coef=float(algo.loss.reference_policy_kl_penalty),
                clip_eps=float(algo.loss.ratio_clip_max),
                lr=float(opt.lr),
                adam_beta1=float(opt.beta1),
                adam_beta2=float(opt.beta2),
                adam_eps=float(opt.eps),
                weight_decay=float(opt.weight_decay),
                max_grad_norm=float(first.policy.max_grad_norm),
                temperature=float(first.policy.generation.temperature),
                precision=precision,
                steps=bench.warmup_steps + bench.measured_steps,
                threads=bench.cores,
                seed=bench.seed,
                output_dir=trl_output_dir(output_dir, precision),
            )
            result = run_trl_grpo(settings)
            # With num_iterations=1 TRL takes the old log-probs from the training forward.
            forwards = 1 if bench.kl_coef > 0 else 0
            summary = summarize_side(result["steps"], bench, shape=shape, prompt_len=prompt_len,
                                     logprob_forwards=forwards)
            sides[f"trl|{precision}"] = {"side": "trl", "precision": precision, **result, **summary}
    host["load_average_end"] = list(os.getloadavg())

    table = peer_table(sides, host["matmul_gflops"])
    targets = target_checks(sides, host)
    report = {
        "bench": bench.name,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "model_dir": model_dir,
        "model_shape": shape.__dict__,
        "mean_prompt_len": prompt_len,
        "samples_per_step": bench.samples_per_step,
        "host": host,
        "sides": sides,
        "table": table,
        "targets": targets,
    }
    out_path = output_dir / bench.output_file
    out_path.write_text(json.dumps(report, indent=2, default=str))
    print_peer_report(report)
    print(f"[bench] report: {out_path}", flush=True)
    return report
