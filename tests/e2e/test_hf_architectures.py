"""Every HF architecture ``make_tiny`` writes trains through the run layer from its directory.

For each of Llama, Qwen2 and GPT-2: a ``save_pretrained`` directory (the session's tiny
checkpoint of ``test_hf_parity.MICRO_DIMS``) is the ``policy.model_name_or_path`` of one SFT
step and then one GRPO step (generation through that architecture's own KV cache, log-probs,
the reference policy, a clipped policy-gradient update), ``dp_size=2``, through
``nemo_dp.training.run_phase`` exactly as the launcher trains.  Checked: each step's metrics
are finite, and each phase's checkpoint has a ``policy/`` directory that
``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` read as is (the
model of the saved architecture, the run's tokenizer).

All six runs share one Ray session (a subprocess running this file as a script).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ARCHS: tuple[str, ...] = ("llama", "qwen2", "gpt2")
#: transformers ``config.model_type`` of each architecture.
MODEL_TYPES: dict[str, str] = {"llama": "llama", "qwen2": "qwen2", "gpt2": "gpt2"}

#: Settings of every run besides ``test_hf_parity.HF_POLICY``.
COMMON: tuple[str, ...] = (
    "~recipe",
    "data_plane=disabled",
    "seed=3",
    "algorithm.max_steps=1",
    "algorithm.val_period=0",
    "algorithm.val_samples=8",
    "checkpointing.enabled=true",
    "checkpointing.save_period=1",
    "checkpointing.keep_last=1",
    "logger.plot=false",
    "logger.progress_bar=false",
)
PHASES: dict[str, tuple[str, ...]] = {
    "sft": ("algorithm=sft", "algorithm.num_train_samples=8"),
    "grpo": (
        "algorithm=grpo",
        "algorithm.num_prompts_per_step=2",
        "algorithm.num_generations_per_prompt=4",
        "algorithm.num_train_prompts=16",
        "algorithm.val_at_start=false",
        "algorithm.warm_start.enabled=false",
    ),
}


def _compose(model_dir: Path, phase: str) -> Any:
    from tests.e2e.phase_runs import compose_run
    from tests.e2e.test_hf_parity import HF_POLICY

    return compose_run([*COMMON, *HF_POLICY, f"policy.model_name_or_path={model_dir}", *PHASES[phase]])


def run_architectures(out_dir: Path, model_dirs: dict[str, Path]) -> dict[str, Any]:
    """One SFT step, then one GRPO step, per architecture, in one Ray session.

    Args:
        out_dir: Where each run writes metrics and checkpoints.
        model_dirs: ``{arch: save_pretrained directory}``.

    Returns:
        ``{"<arch>_<phase>": {"records": [...], "checkpoint": "<step dir>"}}``.
    """
    from nemo_dp.config import validate_config
    from nemo_dp.models.builders import validate_policy
    from nemo_dp.training import main_phase, make_policy, make_tokenizer, phase_checkpointer, phase_logger, run_phase
    from nemo_dp.training.checkpoint_discovery import latest_checkpoint
    from nemo_dp.utils.metrics import read_metrics
    from tests.e2e.ray_cluster import script_ray

    first = _compose(model_dirs[ARCHS[0]], "sft")
    result: dict[str, Any] = {}
    with script_ray(first.data_plane) as env:
        for arch in ARCHS:
            cfgs = {phase: _compose(model_dirs[arch], phase) for phase in PHASES}
            validate_policy(cfgs["sft"].policy)
            tok = make_tokenizer(cfgs["sft"])
            # The policy depends only on the policy / data-plane / seed keys: one per
            # architecture serves its SFT step and then its GRPO step.
            policy = make_policy(cfgs["sft"], tok, env_vars=env)
            try:
                for name, cfg in cfgs.items():
                    validated = validate_config(cfg)
                    phase = main_phase(cfg)
                    run_dir = out_dir / arch / name
                    run_phase(
                        phase,
                        policy,
                        tokenizer=tok,
                        logger=phase_logger(phase, run_dir, validated.logger),
                        checkpointer=phase_checkpointer(phase, run_dir / "checkpoints", cfg.checkpointing),
                    )
                    ckpt = latest_checkpoint(run_dir / "checkpoints" / phase.name)
                    result[f"{arch}_{name}"] = {
                        "records": read_metrics(run_dir / "metrics.jsonl"),
                        "checkpoint": None if ckpt is None else str(ckpt),
                    }
            finally:
                policy.shutdown()
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from tests.e2e.conftest import script_result
    from tests.e2e.test_hf_parity import micro_checkpoint, session_cache

    cache = session_cache(tmp_path_factory)
    dirs = json.dumps({arch: str(micro_checkpoint(cache, arch)) for arch in ARCHS})
    return script_result(Path(__file__).resolve(), tmp_path_factory.mktemp("hf_archs"), dirs)


def _finite_numbers(record: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("arch", ARCHS)
def test_one_step_from_a_save_pretrained_directory(runs: dict[str, Any], arch: str, phase: str) -> None:
    transformers = pytest.importorskip("transformers")
    run = runs[f"{arch}_{phase}"]
    steps = [r for r in run["records"] if int(r["step"]) == 1]
    assert len(steps) == 1, run["records"]
    record = steps[0]
    for key in ("loss", "grad_norm", "lr"):
        assert key in record, (arch, phase, sorted(record))
    numbers = _finite_numbers(record)
    assert all(math.isfinite(v) for v in numbers.values()), {k: v for k, v in numbers.items() if not math.isfinite(v)}
    if phase == "sft":
        assert record["grad_norm"] > 0  # gradients flowed through the architecture
    else:
        # It generated through its own KV cache and scored the rows (from random weights the
        # rewards are all 0, so the first policy-gradient step is exactly zero: not checked).
        assert record["mean_response_length"] > 0 and "reward_mean" in record

    assert run["checkpoint"] is not None and Path(run["checkpoint"]).name == "step_00000001"
    exported = Path(run["checkpoint"]) / "policy"
    model = transformers.AutoModelForCausalLM.from_pretrained(str(exported), local_files_only=True)
    assert model.config.model_type == MODEL_TYPES[arch]
    tok = transformers.AutoTokenizer.from_pretrained(str(exported), local_files_only=True)
    assert tok.eos_token == "<|im_end|>" and len(tok) <= model.get_output_embeddings().weight.shape[0]
    ids = tok("3+4=", return_tensors="pt").input_ids
    assert model(input_ids=ids).logits.shape[-1] == model.get_output_embeddings().weight.shape[0]


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    from tests.e2e.conftest import json_script_main

    def _run(out: Path, argv: list[str]) -> dict[str, Any]:
        return run_architectures(out, {arch: Path(p) for arch, p in json.loads(argv[0]).items()})

    json_script_main(_run, "loss")
