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


def run_parity(out_dir: Path, warm_ckpt: Path) -> dict[str, Any]:
    """Run the four (algorithm, data plane) combinations from the shared warm start.

    Returns:
        ``{"runs": {name: {"records", "checksums", "policy_class", "trainer"}}}``.
    """
    from nemo_dp.config import validate_config
    from nemo_dp.training import make_tokenizer
    from nemo_dp.utils.checkpoint import load_training_checkpoint
    from tests.e2e.phase_runs import compose_run, train_from_state
    from tests.e2e.ray_cluster import script_ray

    runs = _runs()
    base = compose_run(runs["grpo_ray"])
    validate_config(base)
    tok = make_tokenizer(base)
    state = load_training_checkpoint(warm_ckpt)["policy"]
    with script_ray(base.data_plane) as env:
        return {"runs": {n: train_from_state(compose_run(o), tok, env, state, out_dir / n) for n, o in runs.items()}}


@pytest.fixture(scope="module")
def parity(tmp_path_factory: pytest.TempPathFactory, warm_start_checkpoint: Path) -> dict[str, Any]:
    from tests.e2e.conftest import script_result

    out = tmp_path_factory.mktemp("ray_store_parity")
    return script_result(Path(__file__).resolve(), out, str(warm_start_checkpoint))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_ray_store_trainers_agree_exactly_with_legacy(parity: dict[str, Any], algorithm: str) -> None:
    from tests.e2e.conftest import by_step
    from tests.e2e.test_grpo_parity import COMPARED as GRPO_COMPARED
    from tests.e2e.test_ppo_parity import COMPARED as PPO_COMPARED

    compared = GRPO_COMPARED if algorithm == "grpo" else PPO_COMPARED
    legacy = parity["runs"][f"{algorithm}_disabled"]
    ray = parity["runs"][f"{algorithm}_ray"]
    assert legacy["policy_class"] == "Policy" and ray["policy_class"] == "TQPolicy"
    assert legacy["trainer"] == f"nemo_dp.algorithms.{algorithm}.{algorithm}_train"
    assert ray["trainer"] == f"nemo_dp.algorithms.{algorithm}_sync.{algorithm}_train_sync"
    a, b = by_step(legacy["records"], compared), by_step(ray["records"], compared)
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
    sys.path.insert(0, str(REPO_ROOT))
    from tests.e2e.conftest import json_script_main

    json_script_main(lambda out, argv: run_parity(out, Path(argv[0])), "reward_mean")


@pytest.mark.timeout(300)
def test_launcher_trains_grpo_over_the_ray_store(tmp_path: Path) -> None:
    """``launch.py data_plane=ray`` selects the data-plane pair through the registries."""
    from tests.e2e.conftest import launch_data_plane_grpo

    _, records = launch_data_plane_grpo(tmp_path, "ray", "ray_store")
    for rec in records.values():
        assert rec["data_plane/workers/step/bytes_written_mb"] > 0.0


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
