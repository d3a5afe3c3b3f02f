"""PARITY on a HuggingFace model: every data plane computes the same run on the tiny HF Llama.

The tiny-model parity tests (``test_grpo_parity.py``, ``test_sft_parity.py``,
``test_ppo_parity.py``) prove legacy and data-plane trainers equal on ``policy=tiny``; this
file proves the same for ``policy=hf`` (a transformers ``LlamaForCausalLM`` loaded with
``from_pretrained`` from an offline checkpoint, its HF KV cache in generation, an HF critic in
PPO), ``dp_size=2``, a few steps each:

* SFT: ``data_plane=disabled`` = ``local`` = ``tq``;
* GRPO with dynamic sampling: ``disabled`` = ``tq``;
* PPO (critic = the Llama backbone plus a value head): ``disabled`` = ``tq``.

"=" means: the same keys in every logged record (the data-plane run may add only its own
observability and loader-timing keys), the same values exactly (``==`` on the floats, no tolerance) for every key that is
not a wall-clock time, and final policy weights ``torch.equal`` (compared through the sha256 of
each rank's state dict).

Cheap by construction: one 1-layer, hidden-32 Llama checkpoint (``make_tiny`` with
:data:`MICRO`) per pytest session, every run in one subprocess with one Ray and one
TransferQueue, and one policy per data plane reused across its runs (weights, optimizer and RNG
reloaded before each run).  The RL runs start from a short legacy SFT warm start (the config's
own ``warm_start`` phase through ``run_phase``) so that rewards are mixed and dynamic sampling
really drops groups.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

#: The tiniest Llama the parity needs (``make_tiny`` dims): 1 layer, hidden 32, 2 heads.
MICRO_DIMS: dict[str, int] = {
    "hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
}

#: The HF policy of this file's runs and of ``test_hf_architectures.py``: 1-digit addition,
#: two workers, tiny batches.
HF_POLICY: tuple[str, ...] = (
    "policy=hf",
    "env.digits=1",
    "policy.dp_size=2",
    "policy.model.max_seq_len=16",
    "policy.generation.max_new_tokens=4",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=4",
    "policy.logprob_batch_size=8",
    "policy.generation_batch_size=8",
    "policy.optimizer.warmup_steps=0",
)

#: Settings of every run (the algorithm, the data plane and the seed vary).
COMMON: tuple[str, ...] = (
    "~recipe",
    *HF_POLICY,
    "policy.optimizer.lr=1.0e-3",
    "checkpointing.enabled=false",
    "logger.plot=false",
    "logger.progress_bar=false",
)
SFT: tuple[str, ...] = (
    "algorithm=sft",
    "seed=5",
    "policy.train_micro_batch_size=2",
    "algorithm.max_steps=3",
    "algorithm.num_train_samples=24",
    "algorithm.val_samples=8",
    "algorithm.val_period=3",
)
#: The RL runs' warm start (and its own config): enough SFT steps at a high rate for the model
#: to answer in the task's format, so that sampled groups have mixed rewards.
WARM_START: tuple[str, ...] = (
    "algorithm.warm_start.max_steps=60",
    "algorithm.warm_start.num_train_samples=64",
    "algorithm.warm_start.lr=1.0e-2",
    "algorithm.warm_start.warmup_steps=0",
    "algorithm.warm_start.val_samples=8",
)
GRPO: tuple[str, ...] = (
    "algorithm=grpo",
    "seed=11",
    "algorithm.max_steps=2",
    "algorithm.num_prompts_per_step=4",
    "algorithm.num_generations_per_prompt=4",
    "algorithm.num_train_prompts=64",
    "algorithm.val_samples=8",
    "algorithm.val_period=2",
    "algorithm.val_at_start=false",
    "algorithm.dynamic_sampling.enabled=true",
    "algorithm.dynamic_sampling.max_gen_batches=8",
    "algorithm.warm_start.enabled=false",
    *WARM_START,
)
PPO: tuple[str, ...] = (
    "algorithm=ppo",
    "seed=13",
    "algorithm.max_steps=2",
    "algorithm.ppo_epochs=2",
    "algorithm.kl_coef=0.05",
    "algorithm.num_prompts_per_step=4",
    "algorithm.num_generations_per_prompt=2",
    "algorithm.num_train_prompts=64",
    "algorithm.val_samples=8",
    "algorithm.val_period=2",
    "algorithm.val_at_start=false",
    "algorithm.warm_start.enabled=false",
)

#: (run name, algorithm overrides, data plane, start from the warm start).
RUNS: tuple[tuple[str, tuple[str, ...], str, bool], ...] = (
    ("sft_disabled", SFT, "disabled", False),
    ("sft_local", SFT, "local", False),
    ("sft_tq", SFT, "tq", False),
    ("grpo_disabled", GRPO, "disabled", True),
    ("grpo_tq", GRPO, "tq", True),
    ("ppo_disabled", PPO, "disabled", True),
    ("ppo_tq", PPO, "tq", True),
)


#: Timings only the data-plane SFT trainer has (its colocated loaders' put and the driver's wait).
DATA_PLANE_TIMINGS: frozenset[str] = frozenset({"time/load_s", "time/load_wait_s"})


def is_timing_key(key: str) -> bool:
    """Whether a metric is a wall-clock measurement (its value differs run to run)."""
    return key.startswith("time/") or key.endswith("_time_s") or key.endswith("_wall_ms") or key == "wall_time_s"


def is_data_plane_key(key: str) -> bool:
    """Whether a metric exists only on the data-plane path (store observability, driver-held
    bytes, loader timings)."""
    return key.startswith(("data_plane/", "driver/")) or key in DATA_PLANE_TIMINGS


def micro_checkpoint(cache: Path, arch: str) -> Path:
    """The session's tiny ``arch`` checkpoint of :data:`MICRO_DIMS` under ``cache`` (built once).

    Args:
        cache: The cache directory (shared by the HF e2e files of a session).
        arch: ``llama``, ``qwen2`` or ``gpt2``.

    Returns:
        Its directory.
    """
    from nemo_dp.models.hf.make_tiny import TinyDims, ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(arch, cache, dims=TinyDims(**MICRO_DIMS), name=f"micro-{arch}")


def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session-wide cache directory of tiny HF checkpoints."""
    return tmp_path_factory.getbasetemp() / "hf_micro_cache"


def _compose(model_dir: Path, algorithm: tuple[str, ...], data_plane: str) -> Any:
    from tests.e2e.phase_runs import compose_run

    return compose_run([*COMMON, f"policy.model_name_or_path={model_dir}", *algorithm, f"data_plane={data_plane}"])


def _weights_digest(state: dict[str, Any]) -> str:
    """sha256 over the model state dict's names, dtypes, shapes and bytes (``torch.equal`` up
    to hash collisions, and comparable across processes)."""
    import torch

    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(-1).view(dtype=torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _rank_digests(policy: Any) -> list[str]:
    import ray

    states = ray.get([w.get_state.remote(include_weights=True) for w in policy.worker_group.workers])
    return [_weights_digest(s["model"]) for s in states]


def train_main(cfg: Any, policy: Any, tokenizer: Any, run_dir: Path) -> dict[str, Any]:
    """Train ``cfg``'s main phase on ``policy`` into ``run_dir``, with the trainer the factory picks.

    Returns:
        ``{"records", "trainer"}``: the phase's metrics records and the trainer's ``module.name``.
    """
    from nemo_dp.config import validate_config
    from nemo_dp.data_plane.factory import select_sync_trainer
    from nemo_dp.training import main_phase
    from tests.e2e.phase_runs import train_phase

    trainer = select_sync_trainer(cfg)
    records = train_phase(main_phase(cfg), policy, tokenizer, run_dir, validate_config(cfg).logger, trainer)
    return {"records": records, "trainer": f"{trainer.__module__}.{trainer.__name__}"}


def run_parity(out_dir: Path, model_dir: Path) -> dict[str, Any]:
    """Run every entry of :data:`RUNS` in one Ray session.

    Args:
        out_dir: Where each run writes its ``metrics.jsonl``.
        model_dir: The tiny HF Llama checkpoint.

    Returns:
        ``{"runs": {name: {"records", "digests", "policy_class", "trainer"}}, "warm_start": ...}``.
    """
    from nemo_dp.config import validate_config
    from nemo_dp.training import Checkpointer, make_policy, make_tokenizer, phase_logger, run_phase, warm_start_phase
    from nemo_dp.utils.metrics import read_metrics
    from tests.e2e.ray_cluster import script_ray

    base = _compose(model_dir, GRPO, "tq")
    validate_config(base)
    tok = make_tokenizer(base)
    result: dict[str, Any] = {"runs": {}}
    # One policy per data plane serves all of its runs (a policy's workers depend only on the
    # policy, data-plane and seed keys, and every run first reloads its start state).
    policies: dict[str, Any] = {}
    initial: dict[str, Any] | None = None
    warm: dict[str, Any] | None = None

    def policy_for(cfg: Any, data_plane: str) -> Any:
        if data_plane not in policies:
            policies[data_plane] = make_policy(cfg, tok, env_vars=env)
        return policies[data_plane]

    with script_ray(base.data_plane) as env:
        try:
            for name, algorithm, data_plane, from_warm in RUNS:
                cfg = _compose(model_dir, algorithm, data_plane)
                policy = policy_for(cfg, data_plane)
                if initial is None:
                    initial = policy.state_dict()  # the checkpoint's weights, fresh optimizer
                if from_warm and warm is None:
                    legacy = policy_for(_compose(model_dir, GRPO, "disabled"), "disabled")
                    legacy.load_state_dict(initial)
                    phase = warm_start_phase(_compose(model_dir, GRPO, "disabled"))
                    run_phase(
                        phase,
                        legacy,
                        tokenizer=tok,
                        logger=phase_logger(phase, out_dir / "warm_start", validate_config(cfg).logger),
                        checkpointer=Checkpointer(out_dir / "warm_ckpt", enabled=False, save_period=0, keep_last=1),
                    )
                    warm = legacy.state_dict()
                    result["warm_start"] = read_metrics(out_dir / "warm_start" / "warm_start" / "metrics.jsonl")
                policy.load_state_dict(warm if from_warm else initial)
                run = train_main(cfg, policy, tok, out_dir / name)
                result["runs"][name] = {**run, "digests": _rank_digests(policy), "policy_class": type(policy).__name__}
        finally:
            for policy in policies.values():
                policy.shutdown()
    return result


@pytest.fixture(scope="module")
def parity(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from tests.e2e.conftest import script_result

    model_dir = micro_checkpoint(session_cache(tmp_path_factory), "llama")
    return script_result(Path(__file__).resolve(), tmp_path_factory.mktemp("hf_parity"), str(model_dir))


def _by_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {int(r["step"]): r for r in records}


def assert_same_run(parity: dict[str, Any], legacy_name: str, other_name: str, steps: list[int]) -> None:
    """``other`` logged the same records as ``legacy`` (exactly, timings and data-plane
    observability aside) and ended on the same weights."""
    legacy, other = parity["runs"][legacy_name], parity["runs"][other_name]
    a, b = _by_step(legacy["records"]), _by_step(other["records"])
    assert sorted(a) == sorted(b) == steps, (legacy_name, sorted(a), other_name, sorted(b))
    for step in steps:
        ka, kb = set(a[step]), set(b[step])
        assert not ka - kb, (other_name, step, "lacks", sorted(ka - kb))
        extra = sorted(k for k in kb - ka if not is_data_plane_key(k))
        assert not extra, (other_name, step, "logs more than the data plane's own keys", extra)
        compared = sorted(k for k in ka if not is_timing_key(k))
        diff = {k: (a[step][k], b[step][k]) for k in compared if a[step][k] != b[step][k]}
        assert not diff, f"{other_name} step {step} differs from {legacy_name}: {diff}"
    assert legacy["digests"] == other["digests"], (legacy_name, other_name)
    assert len(set(other["digests"])) == 1  # the replicas agree


def assert_same_rl_run(
    parity: dict[str, Any], legacy_name: str, other_name: str, algorithm: str
) -> dict[int, dict[str, Any]]:
    """``assert_same_run`` over steps 1 and 2 of ``algorithm``'s legacy trainer (``legacy_name``)
    and its data-plane trainer (``other_name``); returns the legacy run's records by step."""
    runs = parity["runs"]
    assert runs[legacy_name]["trainer"] == f"nemo_dp.algorithms.{algorithm}.{algorithm}_train"
    assert runs[other_name]["trainer"] == f"nemo_dp.algorithms.{algorithm}_sync.{algorithm}_train_sync"
    assert_same_run(parity, legacy_name, other_name, [1, 2])
    return _by_step(runs[legacy_name]["records"])


@pytest.mark.timeout(900)
def test_hf_sft_disabled_local_and_tq_agree_exactly(parity: dict[str, Any]) -> None:
    runs = parity["runs"]
    assert runs["sft_disabled"]["trainer"] == "nemo_dp.algorithms.sft.sft_train"
    assert runs["sft_local"]["trainer"] == runs["sft_tq"]["trainer"] == "nemo_dp.algorithms.sft_sync.sft_train_sync"
    assert runs["sft_disabled"]["policy_class"] == "Policy" and runs["sft_tq"]["policy_class"] == "TQPolicy"
    for other in ("sft_local", "sft_tq"):
        assert_same_run(parity, "sft_disabled", other, [1, 2, 3])
    legacy = _by_step(runs["sft_disabled"]["records"])
    assert legacy[3]["loss"] < legacy[1]["loss"]  # it trains
    assert "val_accuracy" in legacy[3]


@pytest.mark.timeout(900)
def test_hf_grpo_legacy_and_tq_with_dynamic_sampling_agree_exactly(parity: dict[str, Any]) -> None:
    a = assert_same_rl_run(parity, "grpo_disabled", "grpo_tq", "grpo")
    # Not a trivial run: mixed rewards give non-zero advantages, dynamic sampling dropped
    # groups and generated again, and the policy moved away from its reference.
    assert all(a[s]["advantage_abs_mean"] > 0 for s in (1, 2))
    assert all(a[s]["dynamic_sampling_num_gen_batches"] > 1 for s in (1, 2)), a
    assert a[2]["kl_penalty"] != 0


@pytest.mark.timeout(900)
def test_hf_ppo_legacy_and_tq_agree_exactly(parity: dict[str, Any]) -> None:
    a = assert_same_rl_run(parity, "ppo_disabled", "ppo_tq", "ppo")
    for step in (1, 2):
        assert a[step]["value_loss_epoch0"] != a[step]["value_loss_epoch1"]  # the HF critic learns
    assert any(0.0 < a[s]["reward_mean"] < 1.0 for s in (1, 2)), a


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    from tests.e2e.conftest import json_script_main

    json_script_main(lambda out, argv: run_parity(out, Path(argv[0])), "loss")
