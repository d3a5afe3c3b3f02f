"""The image-dataset process: VLM SFT and GRPO trained from a user's image jsonl files, one Ray.

Run as a script: ``python vlm_image_data.py OUT_DIR MODEL_DIR``; writes ``OUT_DIR/image_data.json``.
It writes a few PNGs (the built-in visual task's renderer) and ``sft.jsonl`` / ``rl.jsonl`` /
``val.jsonl`` chat files whose image parts name them relative to the file, then runs, through
the run layer the launcher uses (as ``vlm_parity.py`` does), on ``policy=hf_vlm`` with
``env.sft_data`` / ``env.rl_data`` / ``env.val_data`` set and a user's reward function that
checks each row's image path (``REWARD_FILE``):

1. VLM SFT (``SFT_STEPS`` steps) on ``disabled`` and ``tq``, each from the checkpoint's weights;
2. VLM GRPO (``GRPO_STEPS`` steps) on ``disabled`` and ``tq``, each from the legacy SFT's final
   policy state.

Each config goes through ``validate_datasets`` (the check before Ray) first.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]

SFT_STEPS = 2
GRPO_STEPS = 2
NUM_ROWS = 8


#: The runs' reward function: mixed rewards from an untrained model (the response length's
#: parity), and a check that every scored row reaches it with its resolved image path.
REWARD_FILE = """
from pathlib import Path


def parity(completions, prompts, answer, **kwargs):
    for turns in prompts:
        image = turns[0]["content"][0]["image"]
        assert Path(image).is_absolute() and Path(image).is_file(), image
    return [float(len(c[0]["content"]) % 2) for c in completions]
"""


def write_dataset(data_dir: Path) -> dict[str, Path]:
    """PNGs under ``data_dir/imgs``, the SFT, RL and held-out jsonl files naming them, and the
    reward file.

    Returns:
        ``{"sft": path, "rl": path, "val": path, "reward": path}``.
    """
    from nemo_dp.data.visual_task import VisualTask

    (data_dir / "imgs").mkdir(parents=True, exist_ok=True)
    task = VisualTask("digit", seed=5)
    rows: dict[str, list[dict[str, Any]]] = {"sft": [], "rl": [], "val": []}
    for role, problems in (("rl", task.train_problems(NUM_ROWS)), ("val", task.eval_problems(4))):
        for i, p in enumerate(problems):
            name = f"imgs/{role}_{i}.png"
            p.image().save(data_dir / name)
            parts = [{"type": "image", "image": name}, {"type": "text", "text": p.question}]
            prompt = [{"role": "user", "content": parts}]
            rows[role].append({"messages": prompt, "answer": p.answer})
            if role == "rl":
                rows["sft"].append({"messages": [*prompt, {"role": "assistant", "content": p.answer}]})
    out = {"reward": data_dir / "reward.py"}
    out["reward"].write_text(REWARD_FILE, encoding="utf-8")
    for role, items in rows.items():
        out[role] = data_dir / f"{role}.jsonl"
        out[role].write_text("".join(json.dumps(r) + "\n" for r in items), encoding="utf-8")
    return out


def base_overrides(model_dir: Path, files: dict[str, Path]) -> tuple[str, ...]:
    """Settings every run shares (the algorithm and the data plane vary)."""
    return (
        "~recipe",
        "policy=hf_vlm",
        f"policy.model_name_or_path={model_dir}",
        f"env.sft_data={files['sft']}",
        f"env.rl_data={files['rl']}",
        f"env.val_data={files['val']}",
        f"env.reward={files['reward']}:parity",
        "seed=3",
        "policy.dp_size=2",
        "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=4",
        "policy.logprob_batch_size=8",
        "policy.generation_batch_size=8",
        "policy.optimizer.warmup_steps=0",
        "policy.generation.max_new_tokens=2",
        "algorithm.val_samples=4",
        "algorithm.val_period=0",
        "checkpointing.enabled=false",
        "logger.plot=false",
        "logger.progress_bar=false",
    )


SFT_RUNS: dict[str, tuple[str, ...]] = {
    f"sft_{dp}": ("algorithm=sft", f"data_plane={dp}", f"algorithm.max_steps={SFT_STEPS}", "policy.optimizer.lr=1.0e-2")
    for dp in ("disabled", "tq")
}
_GRPO: tuple[str, ...] = (
    "algorithm=grpo",
    f"algorithm.max_steps={GRPO_STEPS}",
    "algorithm.num_prompts_per_step=4",
    "algorithm.num_generations_per_prompt=4",
    "algorithm.val_at_start=true",
    "algorithm.warm_start.enabled=false",
    "policy.optimizer.lr=1.0e-3",
)
GRPO_RUNS: dict[str, tuple[str, ...]] = {f"grpo_{dp}": (*_GRPO, f"data_plane={dp}") for dp in ("disabled", "tq")}


def _compose(overrides: Sequence[str]) -> Any:
    from hydra import compose, initialize_config_dir

    from nemo_dp.config import register_configs

    register_configs(REPO_ROOT / "recipes")
    with initialize_config_dir(str(REPO_ROOT / "conf"), version_base=None):
        return compose("config", overrides=list(overrides))


def _run(
    name: str, cfg: Any, out_dir: Path, env: dict[str, str], policies: dict[str, Any], state: Any
) -> tuple[dict[str, Any], Any]:
    from nemo_dp.config import validate_config
    from nemo_dp.data.validation import validate_datasets
    from nemo_dp.data_plane.factory import select_sync_trainer
    from nemo_dp.training import main_phase, make_policy, make_tokenizer
    from tests.e2e.phase_runs import train_phase

    validated = validate_config(cfg)
    phase = main_phase(cfg)
    trainer = select_sync_trainer(cfg, label=phase.label)
    dp = str(cfg.data_plane.impl) if bool(cfg.data_plane.enabled) else "disabled"
    tok = make_tokenizer(cfg)
    report = validate_datasets(validated, tok)
    if dp not in policies:
        policy = make_policy(cfg, tok, env_vars=env)
        policies[dp] = (policy, policy.state_dict())
    policy, initial = policies[dp]
    policy.load_state_dict(state if state is not None else initial)
    records = train_phase(phase, policy, tok, out_dir / name, validated.logger, trainer)
    return {
        "records": records,
        "checksums": policy.weights_checksums(),
        "policy_class": type(policy).__name__,
        "label": phase.label,
        "datasets": report.lines(),
    }, policy.state_dict()


def main(out_dir: Path, model_dir: Path) -> None:
    """Write the dataset, run every SFT and GRPO run on one Ray; write ``OUT_DIR/image_data.json``."""
    from nemo_dp.data_plane.registry import ray_start_args
    from nemo_dp.distributed.ray_init import init_ray, shutdown_ray
    from nemo_dp.models.hf.make_tiny_vlm import ensure_tiny_vlm_checkpoint

    ensure_tiny_vlm_checkpoint(model_dir.parent, name=model_dir.name)
    base = base_overrides(model_dir, write_dataset(out_dir / "data"))
    env = init_ray(num_cpus=2, **ray_start_args(_compose([*base, "data_plane=tq"]).data_plane))
    policies: dict[str, Any] = {}
    result: dict[str, Any] = {"runs": {}}
    try:
        warm = None
        for name, overrides in SFT_RUNS.items():
            result["runs"][name], final = _run(name, _compose([*base, *overrides]), out_dir, env, policies, None)
            if name == "sft_disabled":
                warm = final
        for name, overrides in GRPO_RUNS.items():
            result["runs"][name], _ = _run(name, _compose([*base, *overrides]), out_dir, env, policies, warm)
    finally:
        for policy, _ in policies.values():
            policy.shutdown()
        shutdown_ray()
    (out_dir / "image_data.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    main(target, Path(sys.argv[2]))
