"""The run layer: ``run_phase`` trains one phase, ``run_phases`` a whole run."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from nemo_dp.algorithms.context import PhaseCheckpointer, PhaseLogger, TrainContext, TrainHooks
from nemo_dp.algorithms.inputs import TrainerInputs
from nemo_dp.config.algorithm_registry import algorithm, resolve_target
from nemo_dp.algorithms.selection import describe_selection, make_policy_factory, select_sync_trainer
from nemo_dp.training.checkpointer import Checkpointer, checkpoint_finalizer, remove_stale_temp_dirs
from nemo_dp.training.phases import Phase, RunStart, plan_phases, plan_run_start
from nemo_dp.training.resume import run_settings
from nemo_dp.training.run_logger import RunLogger
from nemo_dp.training.trackers import build_trackers, check_trackers_available, flatten_run_summary

__all__ = [
    "make_tokenizer",
    "build_inputs",
    "make_policy",
    "phase_logger",
    "phase_checkpointer",
    "phase_health",
    "run_phase",
    "run_phases",
    "final_accuracy",
]

def make_tokenizer(cfg: Any) -> Any:
    """The run's tokenizer (the one place that decides it), from the ``policy`` group's builder."""
    from nemo_dp.models.builders import build_tokenizer

    return build_tokenizer(cfg.policy)


def build_inputs(cfg: Any, tokenizer: Any | None = None) -> TrainerInputs:
    """The loader, held-out problems and environment of a phase's root config (``AlgorithmSpec.input_builder``).

    Raises:
        ValueError: ``algorithm.name`` is not a registered algorithm (naming the legal names).
    """
    builder = resolve_target(algorithm(str(cfg.algorithm.name)).input_builder)
    return builder(cfg, tokenizer)


def make_policy(cfg: Any, tokenizer: Any, *, env_vars: dict[str, str] | None = None) -> Any:
    """A plain ``Policy`` (data plane disabled) or the data-plane factory's policy; ``env_vars`` is the
    workers' environment (``ray_session`` / ``init_ray`` output)."""
    from nemo_dp.distributed.worker_group import RayCluster
    from nemo_dp.models.policy import Policy

    resources = OmegaConf.select(cfg, "cluster.policy_resources", default=None)
    kwargs = {
        "cluster": RayCluster(env_vars=dict(env_vars or {}), worker_resources=dict(resources or {})),
        "config": cfg.policy,
        "vocab_size": tokenizer.vocab_size,
        "pad_id": tokenizer.pad_id,
        "eos_id": tokenizer.eos_id,
        "seed": int(cfg.seed),
    }
    factory = make_policy_factory(cfg.data_plane)
    return Policy(**kwargs) if factory is None else factory(**kwargs)


def phase_logger(phase: Phase, run_dir: Path, logger_cfg: Any, tracker: Any = None, health: Any = None) -> RunLogger:
    """The ``RunLogger`` of a phase under ``run_dir`` (the ``logger`` config group), feeding ``tracker``
    and the ``health`` detector every record."""
    return RunLogger(
        Path(run_dir) / phase.out_subdir,
        metrics_file=str(logger_cfg.metrics_file),
        plot_file=str(logger_cfg.plot_file),
        plot=bool(logger_cfg.plot),
        progress_bar=bool(logger_cfg.progress_bar),
        label=phase.label,
        tracker=tracker,
        health=health,
    )


def phase_health(phase: Phase) -> Any:
    """The training-health detector of a phase: a ``ZeroAdvantageDetector`` for GRPO, else ``None``."""
    from nemo_dp.training.health import ZeroAdvantageDetector

    if str(phase.cfg.algorithm.name) != "grpo":
        return None
    return ZeroAdvantageDetector(
        warm_start_enabled=bool(OmegaConf.select(phase.cfg, "algorithm.warm_start.enabled", default=False)),
        dynamic_sampling_enabled=bool(OmegaConf.select(phase.cfg, "algorithm.dynamic_sampling.enabled", default=False)),
    )


def phase_checkpointer(phase: Phase, ckpt_root: Path, ckpt_cfg: Any, start: RunStart | None = None) -> Checkpointer:
    """The ``Checkpointer`` of a phase under ``ckpt_root/<phase name>``; with ``start``, every checkpoint
    records what it belongs to (``checkpoint_meta.json``) and carries a file manifest."""
    finalize = None
    if start is not None:
        finalize = checkpoint_finalizer(
            algorithm=str(phase.cfg.algorithm.name),
            phase=phase.name,
            model_shape=start.model_shape,
            data_plane=start.data_plane,
            run_id=start.run_id,
            settings=run_settings(phase.cfg),
        )
    return Checkpointer(
        Path(ckpt_root) / phase.name,
        enabled=bool(ckpt_cfg.enabled),
        save_period=int(ckpt_cfg.save_period),
        keep_last=int(ckpt_cfg.keep_last),
        finalize=finalize,
    )


def run_phase(
    phase: Phase,
    policy: Any,
    *,
    tokenizer: Any,
    logger: PhaseLogger,
    checkpointer: PhaseCheckpointer,
    start_state: dict[str, Any] | None = None,
    hooks: TrainHooks | None = None,
    trainer: Callable[[TrainContext], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Train one phase on ``policy`` (from ``start_state``, a loaded checkpoint, if given); the trainer's
    result plus ``wall_time_s`` and ``num_val_problems``."""
    if trainer is None:
        trainer = select_sync_trainer(phase.cfg, label=phase.label)
    inputs = build_inputs(phase.cfg, tokenizer)
    ctx = TrainContext(
        policy=policy,
        cfg=phase.cfg,
        train_loader=inputs.train_loader,
        val_problems=inputs.val_problems,
        tokenizer=tokenizer,
        env=inputs.env,
        logger=logger,
        checkpointer=checkpointer,
        start_state=start_state,
        hooks=hooks if hooks is not None else TrainHooks(),
    )
    t0 = time.perf_counter()
    try:
        result = dict(trainer(ctx))
    except Exception as exc:
        from nemo_dp.environments.weighted import find_reward_error

        failed = find_reward_error(exc)
        if failed is None:
            raise
        # A reward function failed (driver or worker): one message naming it, the sample and the step.
        raise failed.with_step(int(getattr(logger, "last_step", 0)) + 1) from exc
    result["wall_time_s"] = time.perf_counter() - t0
    result["num_val_problems"] = len(inputs.val_problems)
    return result


def run_phases(
    cfg: Any, validated: Any, run_dir: Path, *, hooks: TrainHooks | None = None, record: Any = None
) -> dict[str, Any]:
    """Run every phase of a validated, preflighted config into ``run_dir``; return the run summary.

    Ray lives for this call only. ``record`` (a ``RunRecord``) is marked started once Ray is up and
    the run directory is claimed, and holds the summary so far and every phase's metrics file.

    Raises:
        ValueError: A dataset, the model, ``resume_from``, ``init_from`` or the run directory is
            unusable, raised before Ray starts and before anything is written.
        ClusterConnectError: The cluster to join cannot be reached (nothing written yet).
    """
    from hydra.core.hydra_config import HydraConfig

    from nemo_dp.data.validation import validate_datasets
    from nemo_dp.environments.weighted import check_rewards
    from nemo_dp.models.builders import prepare_policy, validate_policy
    from nemo_dp.training.sigterm import sigterm_as_interrupt

    t_start = time.perf_counter()
    run_dir = Path(run_dir)
    phases = plan_phases(cfg)
    # Everything that can fail on the driver fails here, before a trainer is selected or Ray starts.
    check_trackers_available(cfg.logger)
    prepare_policy(cfg.policy)
    validate_policy(cfg.policy)
    tokenizer = make_tokenizer(cfg)
    report = validate_datasets(validated, tokenizer)
    for line in report.lines():
        print(f"data: {line}", flush=True)
    check_rewards(cfg.env, report.reward_columns())
    desc = describe_selection(cfg)
    choices = dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else {}
    print(f"run directory: {run_dir}", flush=True)
    print(
        f"algorithm: {cfg.algorithm.name} | data plane: {choices.get('data_plane', '?')} "
        f"({desc['backend']}) | recipe: {choices.get('recipe', None)}",
        flush=True,
    )
    trainers = []
    for phase in phases:
        phase_desc = describe_selection(phase.cfg)
        print(
            f"phase {phase.label}: trainer {phase_desc['trainer']} | policy factory {phase_desc['policy_factory']}",
            flush=True,
        )
        trainers.append(select_sync_trainer(phase.cfg, label=phase.label))

    start = plan_run_start(cfg, validated, run_dir, tokenizer)
    for line in start.lines:
        print(line, flush=True)
    with _ray_for(cfg, validated) as worker_env, sigterm_as_interrupt() as term:
        # Ray is up: the run is accepted, and only now does anything reach the run directory.
        for line in start.commit(run_dir, str(validated.logger.metrics_file)):
            print(line, flush=True)
        (run_dir / "resolved_config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        ckpt_root = run_dir / validated.checkpointing.checkpoint_dir
        for stale in remove_stale_temp_dirs(ckpt_root):
            print(f"removed {stale}: an interrupted checkpoint write of an earlier process", flush=True)

        summary: dict[str, Any] = {"run_dir": str(run_dir), "run_id": start.run_id, "phases": {}}
        if start.resume is not None:
            summary["resumed_from"] = str(start.resume.checkpoint)
        if start.init_from is not None:
            summary["init_from"] = str(start.init_from.checkpoint)
        if record is not None:
            record.summary = summary
            record.checkpoint_root = ckpt_root
            record.phase_names = [p.name for p in phases]
            record.mark_started()
        trackers = build_trackers(cfg.logger, run_dir)
        status = "failed"
        try:
            trackers.log_config(OmegaConf.to_container(cfg, resolve=True))
            _train_phases(
                cfg, run_dir, phases, trainers, start, tokenizer, ckpt_root, summary,
                trackers, hooks, record, validated, dict(worker_env), term,
            )
            status = "success"
        finally:
            trackers.close(status)
    summary["status"] = "completed"
    summary["final_phase"] = phases[-1].name
    summary["wall_time_s"] = time.perf_counter() - t_start
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"done in {summary['wall_time_s']:.1f} s; outputs in {run_dir}", flush=True)
    return summary


def _ray_for(cfg: Any, validated: Any) -> Any:
    from nemo_dp.data_plane.registry import ray_start_args
    from nemo_dp.distributed.ray_init import ray_session

    cluster = validated.cluster
    return ray_session(
        address=cluster.address,
        num_cpus=cluster.num_cpus,
        temp_dir=cluster.temp_dir,
        connect_timeout_s=cluster.connect_timeout_s,
        working_dir=cluster.working_dir,
        **ray_start_args(cfg.data_plane),
    )


def _train_phases(
    cfg: Any,
    run_dir: Path,
    phases: list[Phase],
    trainers: list[Any],
    start: RunStart,
    tokenizer: Any,
    ckpt_root: Path,
    summary: dict[str, Any],
    trackers: Any,
    hooks: TrainHooks | None,
    record: Any,
    validated: Any,
    worker_env: dict[str, str],
    term: Any,
) -> None:
    """Build the policy on the running Ray and run the phases into ``summary``."""
    from nemo_dp.distributed.ray_init import shutdown_ray

    first = start.first
    main_name = str(cfg.algorithm.name)
    policy = make_policy(cfg, tokenizer, env_vars=worker_env)
    try:
        if start.init_from is not None:
            from nemo_dp.utils.checkpoint import load_training_checkpoint

            weights = load_training_checkpoint(start.init_from.checkpoint)["policy"]["weights"]["model"]
            policy.load_initial_weights(weights)
            print(f"policy weights loaded from {start.init_from.checkpoint}", flush=True)
        for i, (phase, trainer) in enumerate(zip(phases, trainers, strict=True)):
            if i < first:
                print(f"phase {phase.label}: skipped (resuming a later phase)", flush=True)
                continue
            logger = phase_logger(
                phase,
                run_dir,
                validated.logger,
                tracker=trackers.with_prefix("" if phase.name == main_name else phase.name),
                health=phase_health(phase),
            )
            if record is not None:
                record.track_metrics(logger.metrics_path, logger.plot_path)
            result = run_phase(
                phase,
                policy,
                tokenizer=tokenizer,
                logger=logger,
                checkpointer=phase_checkpointer(phase, ckpt_root, validated.checkpointing, start),
                start_state=start.start_states[i],
                hooks=hooks,
                trainer=trainer,
            )
            summary["phases"][phase.name] = result
            acc = result.get("val_accuracy")
            acc_text = "n/a" if acc is None else f"{acc:.3f}"
            print(
                f"Held-out exact-match accuracy after {phase.label}: {acc_text} "
                f"({result['num_val_problems']} problems, {result['step']} steps, "
                f"{result['wall_time_s']:.1f} s)",
                flush=True,
            )
    finally:
        # A SIGTERM now is held until the workers, the data plane and Ray are down.
        with term.deferred():
            policy.shutdown()
            shutdown_ray()

    accs = [summary["phases"][p.name].get("val_accuracy") for p in phases if p.name in summary["phases"]]
    if len(phases) == 2 and len(accs) == 2 and None not in accs:
        summary["accuracy_gain"] = accs[1] - accs[0]
        print(
            f"{phases[1].label} changed held-out accuracy by {summary['accuracy_gain']:+.3f} "
            f"({accs[0]:.3f} -> {accs[1]:.3f})",
            flush=True,
        )
    trackers.log_summary(flatten_run_summary(summary, main_name))


def final_accuracy(summary: dict[str, Any]) -> float:
    """The held-out accuracy after the run summary's last phase (what a sweep maximises).

    Raises:
        ValueError: The last phase recorded no held-out accuracy.
    """
    name = summary["final_phase"]
    acc = summary["phases"][name].get("val_accuracy")
    if acc is None:
        raise ValueError(f"phase {name!r} recorded no held-out accuracy (val_accuracy is None)")
    return float(acc)
