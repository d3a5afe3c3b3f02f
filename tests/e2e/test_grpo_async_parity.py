"""PARITY: asynchronous GRPO with ``max_staleness=0`` computes the synchronous data-plane run.

With the same seed, config and starting weights, ``grpo_train_async`` (rollout actors separate
from the training workers, rows streamed through TransferQueue and claimed with ``claim_meta``)
at ``max_staleness=0`` must log exactly the per-step rewards, losses, KL penalties, gradient
norms and held-out accuracy of ``grpo_train_sync``, and end with the same weights.  The
comparison is ``==`` on the floats in ``metrics.jsonl``: the rollout actor generates the same
sub-batches with the same per-row seeds and the same weights, and the trainer restores the
synchronous row order before sharding, so any difference is a bug.  ``dp_size=2`` with one
rollout actor checks that the actor reproduces the training ranks' split.

A third run at ``max_staleness=1`` checks the asynchronous schedule itself: batch 1 is trained
on-policy, every later batch exactly one version stale, with the truncated importance weight in
the loss.

Every run starts from the session's shared legacy SFT warm start (``warm_start_checkpoint`` in
``conftest.py``, the same model shape and seed as here), so the 1-digit addition rewards are
mixed and the advantages non-zero.  The runs go through the run layer the launcher uses
(``nemo_dp.training.run_phase``: trainer from ``select_sync_trainer`` on a Hydra-composed config,
policy from ``make_policy``) in a subprocess (this file as a script) with its own Ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script (see the end of this file)
    sys.path.insert(0, str(REPO_ROOT))

from tests.e2e.conftest import PARITY_RUN  # noqa: E402

OVERRIDES: tuple[str, ...] = (
    *PARITY_RUN,
    "seed=11",
    "data_plane=tq",
    "algorithm.num_prompts_per_step=4",
    "algorithm.num_generations_per_prompt=4",
    "algorithm.async_rollout.num_rollout_workers=1",
)

COMPARED: tuple[str, ...] = (
    "loss",
    "pg_loss",
    "kl_penalty",
    "clip_fraction",
    "grad_norm",
    "lr",
    "reward_mean",
    "train_reward_mean",
    "advantage_abs_mean",
    "mean_response_length",
    "truncated_fraction",
    "sample_mask_mean",
    "dynamic_sampling_num_gen_batches",
    "dynamic_sampling_num_discarded_valid_samples",
    "consumed_samples",
    "val_accuracy",
)

RUNS: dict[str, tuple[str, ...]] = {
    "sync": ("algorithm.async_rollout.enabled=false",),
    "async0": ("algorithm.async_rollout.enabled=true", "algorithm.async_rollout.max_staleness=0"),
    "async1": ("algorithm.async_rollout.enabled=true", "algorithm.async_rollout.max_staleness=1"),
}


def _compose(*extra: str) -> Any:
    from hydra import compose, initialize_config_dir

    from nemo_dp.config import register_configs

    register_configs(REPO_ROOT / "recipes")
    with initialize_config_dir(str(REPO_ROOT / "conf"), version_base=None):
        return compose("config", overrides=[*OVERRIDES, *extra])


def run_parity(out_dir: Path, warm_ckpt: Path) -> dict[str, Any]:
    """Run every entry of ``RUNS`` on one ``TQPolicy`` from the shared warm start.

    Args:
        out_dir: Where each run writes its ``metrics.jsonl``.
        warm_ckpt: The shared warm start's checkpoint directory.

    Returns:
        ``{"runs": {name: {"records", "ledger", "checksums", "trainer", "live_partitions"}}}``.
    """
    from nemo_dp.algorithms.async_ledger import read_ledger
    from nemo_dp.config import validate_config
    from nemo_dp.data_plane.factory import select_sync_trainer
    from nemo_dp.data_plane.registry import ray_start_args
    from nemo_dp.distributed.ray_init import init_ray, shutdown_ray
    from nemo_dp.models.policy.rollout_worker import partition_for_batch
    from nemo_dp.training import Checkpointer, main_phase, make_policy, make_tokenizer, phase_logger, run_phase
    from nemo_dp.utils.checkpoint import load_training_checkpoint
    from nemo_dp.utils.metrics import read_metrics

    base = _compose(*RUNS["sync"])
    validate_config(base)
    tok = make_tokenizer(base)
    state = load_training_checkpoint(warm_ckpt)["policy"]
    env = init_ray(num_cpus=2, **ray_start_args(base.data_plane))
    result: dict[str, Any] = {"runs": {}}
    try:
        # One policy (and TransferQueue system) serves every run; weights, optimizer and RNG are
        # reloaded from the warm start before each.
        policy = make_policy(base, tok, env_vars=env)
        try:
            for name, extra in RUNS.items():
                cfg = _compose(*extra)
                validated = validate_config(cfg)
                trainer = select_sync_trainer(cfg)
                policy.load_state_dict(state)
                phase = main_phase(cfg)
                run_dir = out_dir / name
                run_phase(
                    phase,
                    policy,
                    tokenizer=tok,
                    logger=phase_logger(phase, run_dir, validated.logger),
                    checkpointer=Checkpointer(run_dir / "ckpt", enabled=False, save_period=0, keep_last=1),
                    trainer=trainer,
                )
                ledger = run_dir / "async_ledger.jsonl"
                result["runs"][name] = {
                    "records": read_metrics(run_dir / "metrics.jsonl"),
                    "ledger": read_ledger(ledger) if ledger.exists() else None,
                    "checksums": policy.weights_checksums(),
                    "trainer": f"{trainer.__module__}:{trainer.__name__}",
                    "live_partitions": list(policy.dp_client.list_sample_ids(partition_for_batch(1))),
                }
        finally:
            policy.shutdown()
    finally:
        shutdown_ray()
    return result


@pytest.fixture(scope="module")
def parity(tmp_path_factory: pytest.TempPathFactory, warm_start_checkpoint: Path) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("grpo_async_parity")
    env = dict(os.environ)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(out), str(warm_start_checkpoint)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=560,
    )
    assert proc.returncode == 0, f"parity run failed:\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    return json.loads((out / "parity.json").read_text())


def _by_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {int(r["step"]): {k: r[k] for k in COMPARED if k in r} for r in records}


@pytest.mark.timeout(600)
def test_async_at_staleness_zero_equals_the_synchronous_trainer(parity: dict[str, Any]) -> None:
    sync, asy = parity["runs"]["sync"], parity["runs"]["async0"]
    assert sync["trainer"] == "nemo_dp.algorithms.grpo_sync:grpo_train_sync"
    assert asy["trainer"] == "nemo_dp.algorithms.grpo_async:grpo_train_async"
    a, b = _by_step(sync["records"]), _by_step(asy["records"])
    assert sorted(a) == sorted(b) == [0, 1, 2, 3, 4, 5]
    for step in range(0, 6):
        assert a[step] == b[step], f"step {step} differs:\nsync  {a[step]}\nasync {b[step]}"
    assert sync["checksums"] == asy["checksums"]
    # Not a trivial run: non-zero advantages, the KL moves.
    assert any(a[s]["advantage_abs_mean"] > 0 for s in range(1, 6))
    assert any(a[s]["kl_penalty"] != 0 for s in range(2, 6))
    recs = {int(r["step"]): r for r in asy["records"]}
    for s in range(1, 6):
        assert recs[s]["async/staleness_hist/0"] == 16.0 and recs[s]["async/staleness_max"] == 0.0
        assert recs[s]["async/generated_samples"] == 16 * s
    # Every trained step is recorded once, 4 distinct prompts each.
    assert [r["step"] for r in asy["ledger"]] == [1, 2, 3, 4, 5]
    assert all(len(set(r["indices"])) == 4 and len(r["sample_ids"]) == 16 for r in asy["ledger"])


@pytest.mark.timeout(600)
def test_staleness_one_trains_one_version_behind_with_the_importance_weight(parity: dict[str, Any]) -> None:
    recs = {int(r["step"]): r for r in parity["runs"]["async1"]["records"]}
    assert sorted(recs) == [0, 1, 2, 3, 4, 5]
    # Batch 1 and 2 are generated by version 0: batch 1 on-policy, batch 2 (and later) one behind.
    assert recs[1]["async/staleness_hist/0"] == 16.0 and recs[1]["async/staleness_hist/1"] == 0.0
    for s in range(2, 6):
        assert recs[s]["async/staleness_hist/1"] == 16.0 and recs[s]["async/staleness_max"] == 1.0
        assert 0.0 < recs[s]["async/is_weight_mean"] <= 2.0
    assert all(recs[s]["consumed_samples"] == 16 * s for s in range(1, 6))
    # The asynchronous run trains the same prompts in the same order as the synchronous one.
    sync_ledger = parity["runs"]["async0"]["ledger"]
    assert [r["indices"] for r in parity["runs"]["async1"]["ledger"]] == [r["indices"] for r in sync_ledger]
    # Its partitions were dropped when it finished.
    assert parity["runs"]["async1"]["live_partitions"] == []


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO_ROOT))
    res = run_parity(target, Path(sys.argv[2]))
    (target / "parity.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: [r.get("reward_mean") for r in v["records"]] for k, v in res["runs"].items()}))
