"""The one training entry point: ``python launchers/launch.py [recipe=...] [overrides...]``.

Order of work, so that a bad configuration fails before any process starts:

1. Hydra composes ``conf/config.yaml`` (recipes from ``recipes/`` are registered as the
   ``recipe`` group, so ``recipe=grpo_arith`` works from any working directory); struct mode
   rejects unknown keys and wrong types naming the key.
2. ``validate_config`` runs every range rule and checks the (algorithm, data_plane) pair through
   the factory's lookup; ``preflight`` checks the CPU budget and output paths.
3. The trainer of every phase comes only from ``select_sync_trainer`` and the policy constructor
   only from ``make_policy_factory`` (``None`` -> the plain ``Policy``); this file never looks at
   the data-plane choice itself.
4. Ray starts (``ray_session``: own lifetime per job, torn down in ``finally``, so ``--multirun``
   jobs are isolated), the phases run, the run directory receives the resolved config,
   ``metrics.jsonl``, checkpoints, the training-curve plot and ``summary.json``.

An RL run (GRPO, PPO) with ``algorithm.warm_start.enabled`` first runs an SFT phase (selected
through the same factory lookup with an SFT view of the config) on the same policy.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_REPO_ROOT = Path(__file__).resolve().parents[1]
if str(_REPO_ROOT) not in sys.path:  # running from a checkout without an installed package
    sys.path.insert(0, str(_REPO_ROOT))

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from nemo_dp.config import preflight, register_configs, validate_config, warm_start_config  # noqa: E402

CONF_DIR = _REPO_ROOT / "conf"
RECIPES_DIR = _REPO_ROOT / "recipes"

register_configs(RECIPES_DIR)


@dataclass
class Phase:
    """One training phase of a run.

    Attributes:
        name: Short name (checkpoint sub-root and output sub-directory).
        label: Human label for log lines and the progress bar.
        cfg: The root config the phase's trainer receives.
        out_subdir: Output sub-directory ('' = the run directory itself).
    """

    name: str
    label: str
    cfg: DictConfig
    out_subdir: str


def plan_phases(cfg: DictConfig) -> list[Phase]:
    """The phases a config asks for: an optional SFT warm start, then the main algorithm.

    Args:
        cfg: The composed root config.

    Returns:
        The phases in execution order.
    """
    name = str(cfg.algorithm.name)
    phases: list[Phase] = []
    if "warm_start" in cfg.algorithm and bool(cfg.algorithm.warm_start.enabled):
        phases.append(Phase("warm_start", "SFT warm start", warm_start_config(cfg), "warm_start"))
    phases.append(Phase(name, name.upper(), cfg, ""))
    return phases


def trainer_inputs(pcfg: DictConfig, tokenizer: Any) -> Any:
    """The loader, held-out problems and reward environment of one phase.

    The datasets are rendered with the policy's tokenizer, so ``env.format=chat`` and
    ``messages`` prompts go through its chat template.

    Args:
        pcfg: The phase's root config.
        tokenizer: The policy's tokenizer.

    Returns:
        A ``TrainerInputs``.
    """
    from nemo_dp.algorithms.trainer_common import TrainerInputs
    from nemo_dp.data.datasets import EpochLoader
    from nemo_dp.data.sources import build_train_dataset, build_val_problems
    from nemo_dp.environments.registry import make_environment

    algo = pcfg.algorithm
    if algo.name == "sft":
        batch_size, shuffle = int(pcfg.policy.train_global_batch_size), bool(algo.shuffle)
    else:
        batch_size, shuffle = int(algo.num_prompts_per_step), True
    loader = EpochLoader(build_train_dataset(pcfg, tokenizer), batch_size=batch_size, seed=int(pcfg.seed), shuffle=shuffle)
    return TrainerInputs(
        train_loader=loader, val_problems=build_val_problems(pcfg, tokenizer), env=make_environment(pcfg.env)
    )


def run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Validate, preflight, start Ray, run every phase, tear down.

    Args:
        cfg: The composed root config.
        run_dir: The job's output directory.

    Returns:
        The run summary (also written to ``run_dir/summary.json``).
    """
    from nemo_dp.algorithms.trainer_common import Checkpointer, RunLogger, load_start_state
    from nemo_dp.data_plane.factory import describe_selection, make_policy_factory, select_sync_trainer
    from nemo_dp.data_plane.registry import ray_start_args
    from nemo_dp.distributed.ray_init import ray_session
    from nemo_dp.distributed.worker_group import RayCluster
    from nemo_dp.models.builders import build_tokenizer, prepare_policy, validate_policy
    from nemo_dp.models.policy import Policy

    t_start = time.perf_counter()
    validated = validate_config(cfg)
    prepare_policy(cfg.policy)
    validate_policy(cfg.policy)
    preflight(validated, run_dir)
    phases = plan_phases(cfg)

    desc = describe_selection(cfg)
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    print(f"run directory: {run_dir}", flush=True)
    print(
        f"algorithm: {cfg.algorithm.name} | data plane: {choices.get('data_plane', '?')} "
        f"({desc['backend']}) | recipe: {choices.get('recipe', None)}",
        flush=True,
    )
    # Every phase's trainer is selected (and imported) now, before Ray starts.
    trainers = []
    for phase in phases:
        phase_desc = describe_selection(phase.cfg)
        print(
            f"phase {phase.label}: trainer {phase_desc['trainer']} | policy factory "
            f"{phase_desc['policy_factory']}",
            flush=True,
        )
        trainers.append(select_sync_trainer(phase.cfg, label=phase.label))
    policy_factory = make_policy_factory(cfg.data_plane)

    (run_dir / "resolved_config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    tokenizer = build_tokenizer(cfg.policy)
    ckpt_root = run_dir / validated.checkpointing.checkpoint_dir
    resume_root = validated.checkpointing.resume_from
    start_states = [
        load_start_state(None if resume_root is None else Path(resume_root) / p.name) for p in phases
    ]
    # A later phase's checkpoint already contains everything the earlier phases produced.
    first = max((i for i, s in enumerate(start_states) if s is not None), default=0)

    summary: dict[str, Any] = {"run_dir": str(run_dir), "phases": {}}
    with ray_session(
        address=validated.cluster.address,
        num_cpus=validated.cluster.num_cpus,
        **ray_start_args(cfg.data_plane),
    ) as worker_env:
        policy_kwargs = {
            "cluster": RayCluster(env_vars=dict(worker_env)),
            "config": cfg.policy,
            "vocab_size": tokenizer.vocab_size,
            "pad_id": tokenizer.pad_id,
            "eos_id": tokenizer.eos_id,
            "seed": int(cfg.seed),
        }
        policy = Policy(**policy_kwargs) if policy_factory is None else policy_factory(**policy_kwargs)
        try:
            for i, (phase, trainer) in enumerate(zip(phases, trainers)):
                if i < first:
                    print(f"phase {phase.label}: skipped (resuming a later phase)", flush=True)
                    continue
                pcfg = phase.cfg
                inputs = trainer_inputs(pcfg, tokenizer)
                logger = RunLogger(
                    run_dir / phase.out_subdir,
                    metrics_file=validated.logger.metrics_file,
                    plot_file=validated.logger.plot_file,
                    plot=validated.logger.plot,
                    progress_bar=validated.logger.progress_bar,
                    label=phase.label,
                )
                checkpointer = Checkpointer(
                    ckpt_root / phase.name,
                    enabled=validated.checkpointing.enabled,
                    save_period=validated.checkpointing.save_period,
                    keep_last=validated.checkpointing.keep_last,
                )
                t0 = time.perf_counter()
                result = trainer(
                    policy,
                    pcfg,
                    train_loader=inputs.train_loader,
                    val_problems=inputs.val_problems,
                    tokenizer=tokenizer,
                    env=inputs.env,
                    logger=logger,
                    checkpointer=checkpointer,
                    start_state=start_states[i],
                )
                result = dict(result)
                result["wall_time_s"] = time.perf_counter() - t0
                summary["phases"][phase.name] = result
                acc = result.get("val_accuracy")
                acc_text = "n/a" if acc is None else f"{acc:.3f}"
                print(
                    f"Held-out exact-match accuracy after {phase.label}: {acc_text} "
                    f"({len(inputs.val_problems)} problems, {result['step']} steps, "
                    f"{result['wall_time_s']:.1f} s)",
                    flush=True,
                )
        finally:
            policy.shutdown()

    accs = [summary["phases"][p.name].get("val_accuracy") for p in phases if p.name in summary["phases"]]
    if len(phases) == 2 and len(accs) == 2 and None not in accs:
        summary["accuracy_gain"] = accs[1] - accs[0]
        print(
            f"{phases[1].label} changed held-out accuracy by {summary['accuracy_gain']:+.3f} "
            f"({accs[0]:.3f} -> {accs[1]:.3f})",
            flush=True,
        )
    summary["wall_time_s"] = time.perf_counter() - t_start
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"done in {summary['wall_time_s']:.1f} s; outputs in {run_dir}", flush=True)
    return summary


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def main(cfg: DictConfig) -> float | None:
    """Hydra entry point (one call per job, also under ``--multirun``); returns the final held-out accuracy."""
    return run(cfg, Path(HydraConfig.get().runtime.output_dir))["phases"][str(cfg.algorithm.name)].get("val_accuracy")


if __name__ == "__main__":
    main()
