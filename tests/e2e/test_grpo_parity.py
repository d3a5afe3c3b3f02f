"""PARITY: the legacy GRPO trainer and the data-plane trainer compute the same run.

With the same seed and config, ``data_plane=disabled`` (``grpo_train`` on a plain ``Policy``)
and ``data_plane=tq`` (``grpo_train_sync`` on a ``TQPolicy`` over TransferQueue) must give
identical per-step rewards, losses, KL penalties and gradient norms (and held-out accuracy),
with and without dynamic sampling, on ``dp_size=2``.  The comparison is **exact** (``==`` on
the float values written to ``metrics.jsonl``), with no tolerance: both paths run the same
generation sub-batches with the same per-row seeds, the same planner places the same rows on
the same ranks and microbatches, losses are normalised by the same global counts and
gradients are all-reduced in the same order, so any difference is a bug.

Both trainers start from the same weights: the session's shared legacy SFT warm start makes the
1-digit addition rewards non-trivial, so groups with mixed rewards exist and dynamic sampling
really drops, regenerates and slices.

The runs execute in the session's parity process (``parity_session`` in ``conftest.py``: the
warm start and every parity run in one subprocess with one Ray, see ``warm_start.py``), through
the run layer the launcher uses (``nemo_dp.training.run_phase``: trainer from
``select_sync_trainer``, policy from ``make_policy`` over ``make_policy_factory``) on
Hydra-composed configs.  ``run_grpo`` here also runs the asynchronous parity runs
(``test_grpo_async_parity.py``) on the same ``TQPolicy``; a run whose composed config equals an
earlier run's is that run (its synchronous reference is this file's ``tq_ds0``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import PARITY_RUN, PARITY_TIMEOUT_S, by_step, parity_result
from tests.e2e.phase_runs import compose_run

#: Tiny settings shared by every run (the data-plane choice and dynamic sampling vary).
PARITY_OVERRIDES: tuple[str, ...] = (
    *PARITY_RUN,
    "seed=11",
    "algorithm.num_prompts_per_step=4",
    "algorithm.num_generations_per_prompt=4",
    "algorithm.dynamic_sampling.max_gen_batches=8",
)

#: Metrics that must be exactly equal step for step.
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

#: The four (data plane, dynamic sampling) combinations, as overrides of ``PARITY_OVERRIDES``.
RUNS: dict[str, tuple[str, ...]] = {
    f"{dp}_ds{int(dynamic)}": (f"data_plane={dp}", f"algorithm.dynamic_sampling.enabled={str(dynamic).lower()}")
    for dp in ("disabled", "tq")
    for dynamic in (False, True)
}


def compose_grpo(extra: tuple[str, ...]) -> Any:
    """The Hydra-composed config of ``PARITY_OVERRIDES`` plus ``extra``."""
    return compose_run([*PARITY_OVERRIDES, *extra])


def run_grpo(out_dir: Path, state: Any, env: dict[str, str], runs: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """Run GRPO ``runs`` from the warm start's policy ``state`` on the caller's Ray.

    One policy per data-plane choice serves all of its runs (weights, optimizer and RNG are
    reloaded from ``state`` before each), which saves worker-group and TransferQueue start-ups.
    A run whose composed config equals an earlier run's is not run again: it is that run.

    Args:
        out_dir: Where each run writes its ``metrics.jsonl`` (and async ledger).
        state: The warm start's ``policy`` state.
        env: The worker environment ``init_ray`` returned.
        runs: Run name -> overrides of ``PARITY_OVERRIDES``, in run order.

    Returns:
        ``{"runs": {name: {"records", "ledger", "checksums", "policy_class", "trainer",
        "live_partitions", "same_as"}}}``.
    """
    from omegaconf import OmegaConf

    from nemo_dp.algorithms.async_ledger import read_ledger
    from nemo_dp.config import validate_config
    from nemo_dp.data_plane.factory import select_sync_trainer
    from nemo_dp.models.policy.rollout_worker import partition_for_batch
    from nemo_dp.training import main_phase, make_policy, make_tokenizer
    from tests.e2e.phase_runs import train_phase

    result: dict[str, Any] = {"runs": {}}
    done: list[tuple[Any, str]] = []  # (composed config as a container, run name)
    policies: dict[str, Any] = {}
    try:
        for name, extra in runs.items():
            cfg = compose_grpo(extra)
            container = OmegaConf.to_container(cfg, resolve=True)
            same = next((n for c, n in done if c == container), None)
            if same is not None:
                result["runs"][name] = {**result["runs"][same], "same_as": same}
                continue
            done.append((container, name))
            validated = validate_config(cfg)
            trainer = select_sync_trainer(cfg)
            dp = str(cfg.data_plane.impl) if bool(cfg.data_plane.enabled) else "disabled"
            tok = make_tokenizer(cfg)
            if dp not in policies:
                policies[dp] = make_policy(cfg, tok, env_vars=env)
            policy = policies[dp]
            policy.load_state_dict(state)
            phase = main_phase(cfg)
            run_dir = out_dir / name
            records = train_phase(phase, policy, tok, run_dir, validated.logger, trainer)
            ledger = run_dir / "async_ledger.jsonl"
            client = getattr(policy, "dp_client", None)
            result["runs"][name] = {
                "records": records,
                "ledger": read_ledger(ledger) if ledger.exists() else None,
                "checksums": policy.weights_checksums(),
                "policy_class": type(policy).__name__,
                "trainer": f"{trainer.__module__}:{trainer.__name__}",
                "live_partitions": None if client is None else list(client.list_sample_ids(partition_for_batch(1))),
                "same_as": None,
            }
    finally:
        for policy in policies.values():
            policy.shutdown()
    return result


parity = parity_result("grpo")


@pytest.mark.timeout(PARITY_TIMEOUT_S)
@pytest.mark.parametrize("dynamic", [False, True], ids=["plain", "dynamic_sampling"])
def test_legacy_and_data_plane_trainers_agree_exactly(parity: dict[str, Any], dynamic: bool) -> None:
    legacy = parity["runs"][f"disabled_ds{int(dynamic)}"]
    tq = parity["runs"][f"tq_ds{int(dynamic)}"]
    assert legacy["policy_class"] == "Policy" and tq["policy_class"] == "TQPolicy"
    assert legacy["same_as"] is None and tq["same_as"] is None  # two runs, not one run twice
    a, b = by_step(legacy["records"], COMPARED), by_step(tq["records"], COMPARED)
    assert sorted(a) == sorted(b) == [0, 1, 2, 3, 4, 5]
    for step in range(1, 6):
        for key in ("loss", "kl_penalty", "grad_norm", "reward_mean"):
            assert key in a[step], f"legacy step {step} has no {key}"
        assert a[step] == b[step], f"step {step} differs:\nlegacy {a[step]}\ntq     {b[step]}"
    assert a[0] == b[0]  # held-out accuracy before training
    # Same final weights on both paths (and replicas agree within each).
    assert legacy["checksums"] == tq["checksums"]
    assert len(set(tq["checksums"])) == 1
    # The run is not trivial: it learns from non-zero advantages and the KL moves.
    assert any(a[s]["advantage_abs_mean"] > 0 for s in range(1, 6))
    assert any(a[s]["kl_penalty"] != 0 for s in range(2, 6))
    if dynamic:
        # Dynamic sampling really dropped groups and generated more than one batch somewhere.
        assert any(a[s]["dynamic_sampling_num_gen_batches"] > 1 for s in range(1, 6))
    else:
        assert all(a[s]["dynamic_sampling_num_gen_batches"] == 1 for s in range(1, 6))


@pytest.mark.timeout(PARITY_TIMEOUT_S)
def test_data_plane_run_logs_only_legacy_keys_plus_timings(parity: dict[str, Any]) -> None:
    """Observability is off in the parity config: the tq run's records carry no extra keys."""
    for dynamic in (0, 1):
        legacy = parity["runs"][f"disabled_ds{dynamic}"]["records"]
        tq = parity["runs"][f"tq_ds{dynamic}"]["records"]
        assert len(legacy) == len(tq) == 6, (len(legacy), len(tq))
        for ra, rb in zip(legacy, tq, strict=True):
            assert ra["step"] == rb["step"]
            assert set(ra) == set(rb), (ra["step"], sorted(set(ra) ^ set(rb)))


@pytest.mark.timeout(300)
def test_launcher_trains_grpo_over_tq_with_store_metrics(tmp_path: Path) -> None:
    """``launch.py data_plane=tq`` selects the pair through the factory, logs store metrics."""
    from tests.e2e.conftest import launch_data_plane_grpo

    proc, records = launch_data_plane_grpo(tmp_path, "tq", "transfer_queue")
    assert "[GRPO] step 1: data plane" in proc.stdout  # the per-step store line
    for rec in records.values():
        assert rec["data_plane/step/bytes_read_mb"] == 0.0
        assert "data_plane/step/frac_of_step" in rec and "data_plane/now/bytes_outstanding_mb" in rec
