"""PARITY: ``data_plane=ray`` computes the same GRPO and PPO runs as ``data_plane=disabled``.

The data-plane trainers over the Ray object-store backend (``grpo_train_sync`` /
``ppo_train_sync`` on ``TQPolicy`` over ``RayStoreClient``) must give exactly the per-step
metrics (``==`` on the values in ``metrics.jsonl``) and the final weights of the legacy trainers,
as the TransferQueue backend does (``test_grpo_parity.py``, ``test_ppo_parity.py``, whose tiny
settings and compared metrics this test reuses, shortened to 3 steps).  GRPO runs with dynamic
sampling, so the store also sees partial clears and refills; PPO runs two epochs with a critic,
so the value columns travel through the store too.

Every run starts from the session's shared legacy SFT warm start (``warm_start_checkpoint``)
and executes in one subprocess (this file run as a script) with its own Ray, through the run
layer the launcher uses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
_SHORT = (f"algorithm.max_steps={STEPS}", f"algorithm.val_period={STEPS}")
_REPLACED = ("algorithm.max_steps=", "algorithm.val_period=")


def _overrides(base: tuple[str, ...]) -> list[str]:
    return [o for o in base if not o.startswith(_REPLACED)] + list(_SHORT)


def _runs() -> dict[str, list[str]]:
    from tests.e2e.test_grpo_parity import PARITY_OVERRIDES as GRPO
    from tests.e2e.test_ppo_parity import PARITY_OVERRIDES as PPO
    from tests.e2e.test_ppo_parity import PPO_OVERRIDES

    grpo = [*_overrides(GRPO), "algorithm.dynamic_sampling.enabled=true"]
    ppo = [*_overrides(PPO), *PPO_OVERRIDES]
    return {
        "grpo_disabled": [*grpo, "data_plane=disabled"],
        "grpo_ray": [*grpo, "data_plane=ray"],
        "ppo_disabled": [*ppo, "data_plane=disabled"],
        "ppo_ray": [*ppo, "data_plane=ray"],
    }


def _compose(overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir

    from nemo_dp.config import register_configs

    register_configs(REPO_ROOT / "recipes")
    with initialize_config_dir(str(REPO_ROOT / "conf"), version_base=None):
        return compose("config", overrides=overrides)


def run_parity(out_dir: Path, warm_ckpt: Path) -> dict[str, Any]:
    """Run the four (algorithm, data plane) combinations from the shared warm start.

    Returns:
        ``{"runs": {name: {"records", "checksums", "policy_class", "trainer"}}}``.
    """
    from nemo_dp.config import validate_config
    from nemo_dp.distributed.ray_init import shutdown_ray
    from tests.e2e.ray_cluster import init_script_ray
    from nemo_dp.training import make_tokenizer
    from nemo_dp.utils.checkpoint import load_training_checkpoint
    from tests.e2e.phase_runs import train_from_state

    runs = _runs()
    base = _compose(runs["grpo_ray"])
    validate_config(base)
    tok = make_tokenizer(base)
    state = load_training_checkpoint(warm_ckpt)["policy"]
    env = init_script_ray(base.data_plane)
    result: dict[str, Any] = {"runs": {}}
    try:
        for name, overrides in runs.items():
            result["runs"][name] = train_from_state(_compose(overrides), tok, env, state, out_dir / name)
    finally:
        shutdown_ray()
    return result


@pytest.fixture(scope="module")
def parity(tmp_path_factory: pytest.TempPathFactory, warm_start_checkpoint: Path) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("ray_store_parity")
    from tests.e2e.conftest import run_json_script

    argv = [str(out), str(warm_start_checkpoint)]
    return run_json_script(Path(__file__).resolve(), argv, out / "parity.json", timeout=600)


def _by_step(records: list[dict[str, Any]], compared: tuple[str, ...]) -> dict[int, dict[str, Any]]:
    return {int(r["step"]): {k: r[k] for k in compared if k in r} for r in records}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_ray_store_trainers_agree_exactly_with_legacy(parity: dict[str, Any], algorithm: str) -> None:
    from tests.e2e.test_grpo_parity import COMPARED as GRPO_COMPARED
    from tests.e2e.test_ppo_parity import COMPARED as PPO_COMPARED

    compared = GRPO_COMPARED if algorithm == "grpo" else PPO_COMPARED
    legacy = parity["runs"][f"{algorithm}_disabled"]
    ray = parity["runs"][f"{algorithm}_ray"]
    assert legacy["policy_class"] == "Policy" and ray["policy_class"] == "TQPolicy"
    assert legacy["trainer"] == f"nemo_dp.algorithms.{algorithm}.{algorithm}_train"
    assert ray["trainer"] == f"nemo_dp.algorithms.{algorithm}_sync.{algorithm}_train_sync"
    a, b = _by_step(legacy["records"], compared), _by_step(ray["records"], compared)
    assert sorted(a) == sorted(b) == list(range(STEPS + 1))
    assert a[0] == b[0]  # held-out accuracy before training
    for step in range(1, STEPS + 1):
        for key in ("loss", "grad_norm", "reward_mean"):
            assert key in a[step], f"legacy step {step} has no {key}"
        assert a[step] == b[step], f"step {step} differs:\nlegacy {a[step]}\nray    {b[step]}"
    assert legacy["checksums"] == ray["checksums"]
    assert len(set(ray["checksums"])) == 1
    # Not trivial: the runs learn from non-zero advantages.
    assert any(a[s]["advantage_abs_mean"] > 0 for s in range(1, STEPS + 1))
    if algorithm == "grpo":
        assert any(a[s]["dynamic_sampling_num_gen_batches"] > 1 for s in range(1, STEPS + 1))


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO_ROOT))
    res = run_parity(target, Path(sys.argv[2]))
    (target / "parity.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: [r.get("reward_mean") for r in v["records"]] for k, v in res["runs"].items()}))


@pytest.mark.timeout(300)
def test_launcher_trains_grpo_over_the_ray_store(tmp_path: Path) -> None:
    """``launch.py data_plane=ray`` selects the data-plane pair through the registries."""
    from tests.e2e.conftest import launch_tiny_grpo

    proc, records = launch_tiny_grpo(tmp_path, "data_plane=ray", "data_plane.observability.enabled=true", steps=2)
    assert "Running synchronous GRPO training (data plane: ray_store)" in proc.stdout
    assert "trainer nemo_dp.algorithms.grpo_sync:grpo_train_sync" in proc.stdout
    assert "policy factory nemo_dp.models.policy.tq_policy:TQPolicy" in proc.stdout
    assert sorted(records) == [1, 2]
    for rec in records.values():
        # The driver registers and clears; advantages ride with the training dispatch.
        assert rec["data_plane/step/bytes_written_mb"] == 0.0
        assert rec["data_plane/workers/step/bytes_written_mb"] > 0.0
    assert "val_accuracy" in records[2]


@pytest.mark.timeout(300)
def test_launcher_trains_asynchronous_grpo_over_the_ray_store(tmp_path: Path) -> None:
    """Async GRPO's rollout actors stream rows through the ray store into the trainer."""
    from tests.e2e.conftest import launch_tiny_grpo

    proc, records = launch_tiny_grpo(tmp_path, "data_plane=ray", "algorithm.async_rollout.enabled=true", steps=3)
    assert "Running asynchronous GRPO training (data plane: ray_store)" in proc.stdout
    assert "trainer nemo_dp.algorithms.grpo_async:grpo_train_async" in proc.stdout
    assert sorted(records) == [1, 2, 3]
    # every step trained one full batch (4 prompts x 4) claimed from the store
    assert [records[s]["consumed_samples"] for s in (1, 2, 3)] == [16, 32, 48]
    assert records[3]["async/generated_samples"] >= 48
