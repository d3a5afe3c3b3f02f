"""A GRPO run whose advantages are all zero says so (issue 14 problem 6).

Reproduces "GRPO with no warm start runs 80 steps at reward, loss and grad norm exactly 0
without a word": the step records are built from the project's own advantage computation
(``grpo_baseline_and_std`` / ``grpo_advantages``) on the rewards such a run sees.
"""

from __future__ import annotations

import pytest
import torch

from nemo_dp.algorithms.advantages import grpo_advantages, grpo_baseline_and_std
from nemo_dp.training.health import ZeroAdvantageDetector

GROUP = 4


def _record(rewards: list[float]) -> dict[str, float]:
    r = torch.tensor(rewards, dtype=torch.float32)
    baseline, std = grpo_baseline_and_std(r, GROUP, leave_one_out=True)
    adv = grpo_advantages(r, baseline, std, normalize_std=True)
    return {"reward_mean": float(r.mean()), "advantage_abs_mean": float(adv.abs().mean()), "loss": 0.0}


ALL_WRONG = [0.0] * 8
ALL_SAME = [1.0] * 4 + [0.0] * 4  # each group uniform, groups differ
LEARNING = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]


def test_no_warm_start_all_wrong_warns_once_pointing_at_the_warm_start() -> None:
    det = ZeroAdvantageDetector(patience=3)
    out = [det.update(step, _record(ALL_WRONG)) for step in range(1, 81)]
    warnings = [(i + 1, w) for i, w in enumerate(out) if w is not None]
    assert len(warnings) == 1 and warnings[0][0] == 3
    msg = warnings[0][1]
    assert "steps 1-3: every advantage is 0" in msg
    assert "no sampled response earned any reward" in msg
    assert "algorithm.warm_start.enabled=true" in msg and "policy.init_from" in msg
    assert det.streak == 80


def test_warm_started_run_is_told_to_lengthen_it() -> None:
    det = ZeroAdvantageDetector(patience=2, warm_start_enabled=True)
    assert det.update(1, _record(ALL_WRONG)) is None
    msg = det.update(2, _record(ALL_WRONG))
    assert msg is not None and "algorithm.warm_start.max_steps" in msg


def test_zero_std_groups_point_at_dynamic_sampling() -> None:
    det = ZeroAdvantageDetector(patience=2)
    det.update(1, _record(ALL_SAME))
    msg = det.update(2, _record(ALL_SAME))
    assert msg is not None and "zero-std groups" in msg
    assert "algorithm.dynamic_sampling.enabled=true" in msg
    det2 = ZeroAdvantageDetector(patience=1, dynamic_sampling_enabled=True)
    msg2 = det2.update(1, _record(ALL_SAME))
    assert msg2 is not None and "algorithm.dynamic_sampling.max_gen_batches" in msg2


def test_a_learning_step_resets_the_streak_and_re_arms_the_warning() -> None:
    det = ZeroAdvantageDetector(patience=2)
    assert _record(LEARNING)["advantage_abs_mean"] > 0
    assert det.update(1, _record(ALL_WRONG)) is None
    assert det.update(2, _record(LEARNING)) is None
    assert det.streak == 0
    assert det.update(3, _record(ALL_WRONG)) is None
    assert det.update(4, _record(ALL_WRONG)) is not None
    assert det.update(5, _record(ALL_WRONG)) is None  # once per streak
    det.update(6, _record(LEARNING))
    det.update(7, _record(ALL_WRONG))
    assert det.update(8, _record(ALL_WRONG)) is not None


def test_records_without_advantages_are_ignored() -> None:
    det = ZeroAdvantageDetector(patience=1)
    assert det.update(0, {"val_accuracy": 0.0}) is None
    assert det.update(1, {"advantage_abs_mean": "nan"}) is None
    assert det.update(2, {"advantage_abs_mean": float("nan")}) is None
    assert det.streak == 0
    assert det.update(3, {"advantage_abs_mean": 0.0}) is not None


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="patience"):
        ZeroAdvantageDetector(patience=0)
    with pytest.raises(ValueError, match="tolerance"):
        ZeroAdvantageDetector(tolerance=-1.0)
