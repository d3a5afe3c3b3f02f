"""The VLM parity process: SFT and GRPO on the tiny Qwen2-VL over every data plane, one Ray.

Run as a script: ``python vlm_parity.py OUT_DIR MODEL_DIR``; writes ``OUT_DIR/vlm.json``
(``runs``: the parity runs; ``image_runs``: the image-data runs).
Why one process: each run is a few steps, and a Python + Ray + worker-group start costs more
than the steps, so every run goes through the run layer the launcher uses
(``nemo_dp.training.run_phase``: trainer from ``select_sync_trainer``, policy from
``make_policy``) on Hydra-composed configs, and one policy per data-plane choice serves all of
its runs (weights, optimizer and RNG reloaded before each).

1. VLM SFT (``SFT_STEPS`` steps, a high learning rate so the model learns to answer with one
   digit) on ``disabled``, ``local``, ``tq`` and ``ray``, each from the checkpoint's weights;
2. VLM GRPO (``GRPO_STEPS`` steps) on ``disabled``, ``tq``, ``ray`` and asynchronous GRPO over
   ``tq`` (``max_staleness=0``), each from the legacy SFT run's final policy state, so the
   rewards of a group are mixed;
3. the same two phases on a user's image jsonl files and reward function (``vlm_image_data.py``)
   on ``disabled`` and ``tq``.

Every worker-group dispatch of every run is counted with the bench's ``RayTraffic`` probe
(tensor and ``PackedTensor`` bytes crossing the driver <-> worker boundary, both ways).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]

SFT_STEPS = 12
GRPO_STEPS = 2

#: Settings every run shares (the algorithm and the data plane vary).
VLM_BASE: tuple[str, ...] = (
    "~recipe",
    "policy=hf_vlm",
    "env=visual",
    "seed=3",
    "policy.dp_size=2",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=4",
    "policy.logprob_batch_size=8",
    "policy.generation_batch_size=8",
    "policy.optimizer.warmup_steps=0",
    "policy.generation.max_new_tokens=2",
    "algorithm.val_samples=8",
    "algorithm.val_period=0",
    "checkpointing.enabled=false",
    "logger.plot=false",
    "logger.progress_bar=false",
)

SFT_RUNS: dict[str, tuple[str, ...]] = {
    f"sft_{dp}": (
        "algorithm=sft",
        f"data_plane={dp}",
        f"algorithm.max_steps={SFT_STEPS}",
        "algorithm.num_train_samples=96",
        "policy.optimizer.lr=1.0e-2",
    )
    for dp in ("disabled", "local", "tq", "ray")
}

_GRPO: tuple[str, ...] = (
    "algorithm=grpo",
    f"algorithm.max_steps={GRPO_STEPS}",
    "algorithm.num_prompts_per_step=4",
    "algorithm.num_generations_per_prompt=4",
    "algorithm.num_train_prompts=32",
    "algorithm.val_at_start=true",
    "algorithm.warm_start.enabled=false",
    "policy.optimizer.lr=1.0e-3",
)
GRPO_RUNS: dict[str, tuple[str, ...]] = {
    "grpo_disabled": (*_GRPO, "data_plane=disabled"),
    "grpo_tq": (*_GRPO, "data_plane=tq"),
    "grpo_ray": (*_GRPO, "data_plane=ray"),
    "grpo_tq_async": (
        *_GRPO,
        "data_plane=tq",
        "algorithm.async_rollout.enabled=true",
        "algorithm.async_rollout.max_staleness=0",
        "algorithm.async_rollout.num_rollout_workers=1",
    ),
}


def _compose(overrides: Sequence[str]) -> Any:
    from tests.compose import compose_run

    return compose_run(overrides)


def _run(name: str, overrides: Sequence[str], out_dir: Path, env: dict[str, str], policies: dict[str, Any],
         state: Any, *, check_data: bool = False) -> tuple[dict[str, Any], Any]:
    from nemo_dp.bench.probes import RayTraffic
    from nemo_dp.config import validate_config
    from nemo_dp.data.validation import validate_datasets
    from nemo_dp.data_plane.factory import select_sync_trainer
    from nemo_dp.training import main_phase, make_policy, make_tokenizer
    from tests.e2e.phase_runs import train_phase

    cfg = _compose(overrides)
    validated = validate_config(cfg)
    phase = main_phase(cfg)
    trainer = select_sync_trainer(cfg, label=phase.label)
    dp = str(cfg.data_plane.impl) if bool(cfg.data_plane.enabled) else "disabled"
    tok = make_tokenizer(cfg)
    datasets = validate_datasets(validated, tok).lines() if check_data else []
    if dp not in policies:
        policy = make_policy(cfg, tok, env_vars=env)
        policies[dp] = (policy, RayTraffic(policy.worker_group), policy.state_dict())
    policy, traffic, initial = policies[dp]
    policy.load_state_dict(state if state is not None else initial)
    run_dir = out_dir / name
    traffic.take()
    records = train_phase(phase, policy, tok, run_dir, validated.logger, trainer)
    return {
        "records": records,
        "checksums": policy.weights_checksums(),
        "policy_class": type(policy).__name__,
        "trainer": f"{trainer.__module__}:{trainer.__name__}",
        "label": phase.label,
        "traffic": traffic.take(),
        "datasets": datasets,
    }, policy.state_dict()


def _sft_then_grpo(
    base: Sequence[str],
    sft_runs: dict[str, tuple[str, ...]],
    grpo_runs: dict[str, tuple[str, ...]],
    out_dir: Path,
    env: dict[str, str],
    policies: dict[str, Any],
    *,
    check_data: bool = False,
) -> dict[str, Any]:
    """The SFT runs from the checkpoint's weights, then the GRPO runs from the legacy SFT's."""
    runs: dict[str, Any] = {}
    warm = None
    for name, overrides in sft_runs.items():
        runs[name], final = _run(name, [*base, *overrides], out_dir, env, policies, None, check_data=check_data)
        if name == "sft_disabled":
            warm = final
    for name, overrides in grpo_runs.items():
        runs[name], _ = _run(name, [*base, *overrides], out_dir, env, policies, warm, check_data=check_data)
    return runs


def main(out_dir: Path, model_dir: Path) -> None:
    """Run every SFT and GRPO run on one Ray, the parity runs then the image-data runs (each
    data plane's policy serves both); write ``OUT_DIR/vlm.json``."""
    from nemo_dp.distributed.ray_init import shutdown_ray
    from tests.e2e.ray_cluster import init_script_ray
    from nemo_dp.models.hf.make_tiny_vlm import ensure_tiny_vlm_checkpoint
    from tests.e2e import vlm_image_data as image_data

    ensure_tiny_vlm_checkpoint(model_dir.parent, name=model_dir.name)
    env = init_script_ray(_compose(["~recipe", "data_plane=tq"]).data_plane)
    policies: dict[str, Any] = {}
    result: dict[str, Any] = {}
    try:
        base = [*VLM_BASE, f"policy.model_name_or_path={model_dir}"]
        result["runs"] = _sft_then_grpo(base, SFT_RUNS, GRPO_RUNS, out_dir, env, policies)
        shared = [o for o in base if o != "env=visual" and not o.startswith("algorithm.val_samples=")]
        image_base = [*shared, *image_data.data_overrides(image_data.write_dataset(out_dir / "data"))]
        result["image_runs"] = _sft_then_grpo(
            image_base, image_data.SFT_RUNS, image_data.GRPO_RUNS, out_dir / "image_data", env, policies,
            check_data=True,
        )
    finally:
        for policy, _, _ in policies.values():
            policy.shutdown()
        shutdown_ray()
    (out_dir / "vlm.json").write_text(json.dumps(result, indent=1))

if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    main(target, Path(sys.argv[2]))
