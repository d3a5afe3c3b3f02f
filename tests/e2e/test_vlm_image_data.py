"""PARITY: a user's image jsonl files train the tiny Qwen2-VL alike on the legacy and data-plane paths.

``policy=hf_vlm`` with ``env.sft_data`` / ``env.rl_data`` / ``env.val_data`` naming chat jsonl
files whose image parts name PNGs relative to the file (``vlm_image_data.py`` writes them):
2 VLM SFT steps on ``disabled`` and ``tq``, then 2 VLM GRPO steps on both from the legacy
SFT's weights, on ``dp_size=2``, must log the same metrics (``==``) and end with the same
weights.  The rows carry image paths; the workers load and encode the images, and a user's
reward function receives each row's conversation with its resolved image path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import REPO_ROOT, run_script

SCRIPT = REPO_ROOT / "tests" / "e2e" / "vlm_image_data.py"
TIMEOUT_S = 600  # a bound for a loaded shared machine

SFT_COMPARED = ("loss", "grad_norm", "lr", "num_valid_tokens", "consumed_samples", "val_accuracy")
GRPO_COMPARED = (
    "loss", "pg_loss", "grad_norm", "lr", "reward_mean", "train_reward_mean", "advantage_abs_mean",
    "mean_response_length", "consumed_samples", "val_accuracy",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("vlm_image_data")
    model_dir = tmp_path_factory.getbasetemp() / "vlm_cache" / "tiny-qwen2-vl"
    env = dict(os.environ)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    proc = run_script(SCRIPT, [str(out), str(model_dir)], REPO_ROOT, env=env, timeout=TIMEOUT_S - 60)
    assert proc.returncode == 0, (
        f"VLM image-data process failed:\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    )
    return json.loads((out / "image_data.json").read_text())["runs"]


def _by_step(run: dict[str, Any], keys: tuple[str, ...]) -> dict[int, dict[str, Any]]:
    return {int(r["step"]): {k: r[k] for k in keys if k in r} for r in run["records"]}


@pytest.mark.timeout(TIMEOUT_S)
def test_image_jsonl_trains_sft_and_grpo_alike_on_every_path(runs: dict[str, Any]) -> None:
    for phase, keys, steps in (("sft", SFT_COMPARED, [1, 2]), ("grpo", GRPO_COMPARED, [0, 1, 2])):
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
    grpo = _by_step(runs["grpo_disabled"], GRPO_COMPARED)
    assert any(grpo[s]["advantage_abs_mean"] > 0 and grpo[s]["grad_norm"] > 0 for s in (1, 2))
