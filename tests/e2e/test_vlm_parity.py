"""PARITY: SFT and GRPO on the tiny Qwen2-VL compute the same run on every data plane.

The same seed and config with ``policy=hf_vlm env=visual`` on ``dp_size=2``: VLM SFT on
``disabled``, ``local``, ``tq`` and ``ray``, and VLM GRPO on ``disabled``, ``tq``, ``ray`` and
asynchronous GRPO over ``tq`` (``max_staleness=0``), must log exactly the same per-step
metrics (``==`` on the floats, no tolerance) and end with the same weights.  Every row carries
its image (``pixel_values`` / ``image_grid_thw`` ``PackedTensor`` columns): in the driver's
batch on the legacy path, in the store on the data-plane path, where the workers render,
encode, write and read the images themselves.  So the legacy runs receive image bytes at the
driver, and the data-plane runs receive none (nor any other bulk tensor) and send none.

A user's image jsonl files (``env.sft_data`` / ``env.rl_data`` / ``env.val_data`` naming chat
files whose image parts name PNGs relative to the file, ``vlm_image_data.py``) train alike too:
2 VLM SFT and 2 VLM GRPO steps on ``disabled`` and ``tq`` log the same metrics and end with the
same weights, and a user's reward function receives each row's conversation with its resolved
image path.

All runs execute in one subprocess with one Ray (``vlm_parity.py``), through the run layer the
launcher uses; GRPO starts from the legacy SFT run's final policy, so rewards are mixed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.conftest import REPO_ROOT, run_script, script_env

SCRIPT = REPO_ROOT / "tests" / "e2e" / "vlm_parity.py"
TIMEOUT_S = 1500  # a bound for a loaded shared machine; the runs take a few minutes on an idle one

SFT_COMPARED = ("loss", "grad_norm", "lr", "num_valid_tokens", "consumed_samples", "val_accuracy")
GRPO_COMPARED = (
    "loss", "pg_loss", "kl_penalty", "clip_fraction", "grad_norm", "lr", "reward_mean",
    "train_reward_mean", "advantage_abs_mean", "mean_response_length", "truncated_fraction",
    "sample_mask_mean", "consumed_samples", "val_accuracy",
)


@pytest.fixture(scope="module")
def vlm_result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("vlm_parity")
    model_dir = tmp_path_factory.getbasetemp() / "vlm_cache" / "tiny-qwen2-vl"
    proc = run_script(SCRIPT, [str(out), str(model_dir)], REPO_ROOT, env=script_env(), timeout=TIMEOUT_S - 60)
    assert proc.returncode == 0, (
        f"VLM parity process failed:\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    )
    return json.loads((out / "vlm.json").read_text())


@pytest.fixture(scope="module")
def vlm(vlm_result: dict[str, Any]) -> dict[str, Any]:
    return vlm_result["runs"]


def _by_step(run: dict[str, Any], keys: tuple[str, ...]) -> dict[int, dict[str, Any]]:
    return {int(r["step"]): {k: r[k] for k in keys if k in r} for r in run["records"]}


@pytest.mark.timeout(TIMEOUT_S)
def test_vlm_sft_is_identical_on_every_data_plane(vlm: dict[str, Any]) -> None:
    legacy = vlm["sft_disabled"]
    assert legacy["policy_class"] == "Policy" and legacy["label"] == "VLM SFT"
    assert legacy["trainer"] == "nemo_dp.algorithms.sft:sft_train"
    a = _by_step(legacy, SFT_COMPARED)
    assert all("loss" in a[s] and "grad_norm" in a[s] for s in range(1, 13))
    assert a[12]["loss"] < a[1]["loss"]  # it learns
    for dp in ("local", "tq", "ray"):
        run = vlm[f"sft_{dp}"]
        assert run["policy_class"] == "TQPolicy" and run["trainer"] == "nemo_dp.algorithms.sft_sync:sft_train_sync"
        assert _by_step(run, SFT_COMPARED) == a, dp
        assert run["checksums"] == legacy["checksums"], dp
    assert len(set(legacy["checksums"])) == 1


@pytest.mark.timeout(TIMEOUT_S)
def test_vlm_grpo_is_identical_on_every_data_plane(vlm: dict[str, Any]) -> None:
    legacy = vlm["grpo_disabled"]
    assert legacy["policy_class"] == "Policy" and legacy["label"] == "VLM GRPO"
    a = _by_step(legacy, GRPO_COMPARED)
    assert sorted(a) == [0, 1, 2]
    # Not trivial: mixed rewards give non-zero advantages and the update moves the weights.
    assert any(a[s]["advantage_abs_mean"] > 0 for s in (1, 2))
    assert any(a[s]["grad_norm"] > 0 for s in (1, 2))
    expected = {
        "grpo_tq": "nemo_dp.algorithms.grpo_sync:grpo_train_sync",
        "grpo_ray": "nemo_dp.algorithms.grpo_sync:grpo_train_sync",
        "grpo_tq_async": "nemo_dp.algorithms.grpo_async:grpo_train_async",
    }
    for name, trainer in expected.items():
        run = vlm[name]
        assert run["trainer"] == trainer and run["label"] == "VLM GRPO", name
        assert _by_step(run, GRPO_COMPARED) == a, name
        assert run["checksums"] == legacy["checksums"], name


@pytest.mark.timeout(TIMEOUT_S)
def test_images_never_reach_the_driver_on_the_data_plane(vlm: dict[str, Any]) -> None:
    # Legacy: the driver collates SFT images and sends them; GRPO rollouts' images come back
    # to the driver and go out again with the log-prob and train batches.
    assert vlm["sft_disabled"]["traffic"]["ray_sent_packed_bytes"] > 0
    assert vlm["grpo_disabled"]["traffic"]["ray_received_packed_bytes"] > 0
    assert vlm["grpo_disabled"]["traffic"]["ray_sent_packed_bytes"] > 0
    for name in ("sft_local", "sft_tq", "sft_ray", "grpo_tq", "grpo_ray", "grpo_tq_async"):
        traffic = vlm[name]["traffic"]
        assert traffic["ray_received_packed_bytes"] == traffic["ray_sent_packed_bytes"] == 0, (name, traffic)
    # The synchronous data-plane GRPO trainers move no bulk tensor at all through the driver
    # (the asynchronous one ships each new policy version's weights to its rollout actor; SFT's
    # held-out evaluation decodes generated token ids on the driver, without their images).
    for name in ("grpo_tq", "grpo_ray"):
        traffic = vlm[name]["traffic"]
        assert traffic["ray_received_bulk_bytes"] == traffic["ray_sent_bulk_bytes"] == 0, (name, traffic)


IMAGE_SFT_COMPARED = ("loss", "grad_norm", "lr", "num_valid_tokens", "consumed_samples", "val_accuracy")
IMAGE_GRPO_COMPARED = (
    "loss", "pg_loss", "grad_norm", "lr", "reward_mean", "train_reward_mean", "advantage_abs_mean",
    "mean_response_length", "consumed_samples", "val_accuracy",
)


@pytest.mark.timeout(TIMEOUT_S)
def test_image_jsonl_trains_sft_and_grpo_alike_on_every_path(vlm_result: dict[str, Any]) -> None:
    runs = vlm_result["image_runs"]
    for phase, keys, steps in (("sft", IMAGE_SFT_COMPARED, [1, 2]), ("grpo", IMAGE_GRPO_COMPARED, [0, 1, 2])):
        legacy, tq = runs[f"{phase}_disabled"], runs[f"{phase}_tq"]
        assert legacy["policy_class"] == "Policy" and tq["policy_class"] == "TQPolicy"
        assert legacy["label"] == tq["label"] == f"VLM {phase.upper()}"
        a = _by_step(legacy, keys)
        assert sorted(a) == steps and all("loss" in a[s] for s in steps if s), phase
        assert _by_step(tq, keys) == a, phase
        assert tq["checksums"] == legacy["checksums"], phase
    # The datasets checked before Ray are the files; GRPO's rewards are mixed, so it updates.
    assert any("sft.jsonl (env.sft_data)" in line for line in runs["sft_tq"]["datasets"])
    assert any("rl.jsonl (env.rl_data)" in line for line in runs["grpo_tq"]["datasets"])
    grpo = _by_step(runs["grpo_disabled"], IMAGE_GRPO_COMPARED)
    assert any(grpo[s]["advantage_abs_mean"] > 0 and grpo[s]["grad_norm"] > 0 for s in (1, 2))
