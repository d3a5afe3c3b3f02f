"""PARITY: the legacy PPO trainer and the data-plane PPO trainer compute the same run.

With the same seed and config, ``data_plane=disabled`` (``ppo_train``: plain ``Policy`` and
``Value``) and ``data_plane=tq`` (``ppo_train_sync``: ``TQPolicy`` and ``TQValue`` over
TransferQueue) must give identical per-step policy losses, value losses, explained variance,
rewards, KL and gradient norms for 5 steps with ``ppo_epochs=2`` on ``dp_size=2``.  The
comparison is exact (``==`` on the values written to ``metrics.jsonl``): both paths generate
the same rows with the same seeds, the critic's values reach the driver unchanged through the
store, the targets are computed by the same function at the same canonical width, each epoch's
shuffle is the same pure function of (seed, step, epoch), and both models' training is sharded,
planned, normalised and all-reduced identically.

Both runs start from the same weights: the session's shared legacy SFT warm start makes the
1-digit addition rewards non-trivial.  The runs execute in the session's parity process
(``parity_session`` in ``conftest.py``: one subprocess, one Ray), through the run layer the
launcher uses (``nemo_dp.training.run_phase``: trainer from ``select_sync_trainer``,
policy from ``make_policy`` over ``make_policy_factory``) on Hydra-composed, validated configs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import PARITY_RUN, PARITY_TIMEOUT_S, by_step, parity_result
from tests.e2e.phase_runs import compose_run

PARITY_OVERRIDES: tuple[str, ...] = (
    *PARITY_RUN,
    "seed=13",
    "algorithm.num_prompts_per_step=8",
    "algorithm.num_generations_per_prompt=2",
)
PPO_OVERRIDES: tuple[str, ...] = ("algorithm=ppo", "algorithm.ppo_epochs=2", "algorithm.kl_coef=0.05")

#: Metrics that must be exactly equal step for step.
COMPARED: tuple[str, ...] = (
    "loss",
    "pg_loss",
    "clip_fraction",
    "grad_norm",
    "lr",
    "value_loss",
    "value_clip_fraction",
    "value_grad_norm",
    "value_lr",
    "explained_variance",
    "reward_mean",
    "kl_mean",
    "returns_mean",
    "values_mean",
    "advantage_abs_mean",
    "mean_response_length",
    "truncated_fraction",
    "policy_loss_epoch0",
    "policy_loss_epoch1",
    "value_loss_epoch0",
    "value_loss_epoch1",
    "consumed_samples",
    "val_accuracy",
)


def run_ppo(out_dir: Path, state: Any, env: dict[str, str]) -> dict[str, Any]:
    """Run PPO with ``data_plane=disabled`` and ``data_plane=tq`` from the warm start's ``state``.

    Args:
        out_dir: Where each run writes its ``metrics.jsonl``.
        state: The warm start's ``policy`` state.
        env: The worker environment ``init_ray`` returned (Ray runs in the caller).

    Returns:
        ``{"runs": {"disabled"|"tq": {"records", "checksums", "policy_class", "trainer"}}}``.
    """
    from nemo_dp.training import make_tokenizer
    from tests.e2e.phase_runs import train_from_state

    result: dict[str, Any] = {"runs": {}}
    for dp in ("disabled", "tq"):
        cfg = compose_run([*PARITY_OVERRIDES, *PPO_OVERRIDES, f"data_plane={dp}"])
        result["runs"][dp] = train_from_state(cfg, make_tokenizer(cfg), env, state, out_dir / dp)
    return result


parity = parity_result("ppo")


@pytest.mark.timeout(PARITY_TIMEOUT_S)
def test_legacy_and_data_plane_ppo_agree_exactly(parity: dict[str, Any]) -> None:
    legacy, tq = parity["runs"]["disabled"], parity["runs"]["tq"]
    assert legacy["policy_class"] == "Policy" and tq["policy_class"] == "TQPolicy"
    assert legacy["trainer"] == "nemo_dp.algorithms.ppo.ppo_train"
    assert tq["trainer"] == "nemo_dp.algorithms.ppo_sync.ppo_train_sync"
    a, b = by_step(legacy["records"], COMPARED), by_step(tq["records"], COMPARED)
    assert sorted(a) == sorted(b) == [0, 1, 2, 3, 4, 5]
    assert a[0] == b[0]  # held-out accuracy before training
    for step in range(1, 6):
        for key in ("loss", "value_loss", "explained_variance", "reward_mean", "policy_loss_epoch1"):
            assert key in a[step], f"legacy step {step} has no {key}"
        assert a[step] == b[step], f"step {step} differs:\nlegacy {a[step]}\ntq     {b[step]}"
    assert legacy["checksums"] == tq["checksums"]
    assert len(set(tq["checksums"])) == 1
    # The run is not trivial: rewards are mixed, the critic learns (its loss moves between
    # epochs and its explained variance changes), and the policy drifts from the reference.
    assert any(0.0 < a[s]["reward_mean"] < 1.0 for s in range(1, 6))
    assert any(a[s]["value_loss_epoch0"] != a[s]["value_loss_epoch1"] for s in range(1, 6))
    assert len({a[s]["explained_variance"] for s in range(1, 6)}) > 1
    assert any(a[s]["kl_mean"] != 0.0 for s in range(2, 6))
