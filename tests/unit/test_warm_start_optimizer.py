"""The SFT warm start trains with its own ``algorithm.warm_start`` learning-rate schedule.

The policy workers are built once per run from the main phase's ``policy`` config, so a phase
that wants another warm-up than ``policy.optimizer.warmup_steps`` must say so when it resets the
optimizer.  These tests build a ``PolicyWorker`` in-process (no Ray) and check the learning
rate it applies step by step, after a phase reset and after a checkpoint round trip, and that
the warm start's derived config carries the warm-start keys the SFT trainers pass on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir

from nemo_dp.algorithms.loss_functions import NLLLoss
from nemo_dp.config import register_configs
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.models.policy.worker import PolicyWorker
from nemo_dp.training.phases import plan_phases
from tests.unit.test_checkpoint_format import policy_worker, tiny_policy

REPO = Path(__file__).resolve().parents[2]

CFG = tiny_policy(lr=1e-4, weight_decay=0.0, beta2=0.98, warmup_steps=20, schedule="constant")


def _worker() -> tuple[PolicyWorker, Any]:
    return policy_worker(CFG)


def _lrs(w: PolicyWorker, tok: Any, steps: int) -> list[float]:
    prompts = [tok.encode_prompt(f"{a}+{b}=") for a, b in [(1, 2), (30, 4), (5, 66), (7, 8)]]
    out = []
    for step in range(steps):
        g = w.generate({"prompts": prompts, "seeds": [step * 10 + i for i in range(4)]}, False)
        batch = BatchedDataDict({"input_ids": g["input_ids"], "input_lengths": g["input_lengths"],
                                 "token_mask": g["token_mask"], "sample_mask": torch.ones(4)})
        out.append(w.train(batch, NLLLoss())["per_step"][0]["lr"])
    return out


def test_phase_warmup_overrides_the_policy_config_and_a_later_reset_restores_it() -> None:
    w, tok = _worker()
    w.reset_optimizer(3e-3, decay_steps=10, warmup_steps=4)
    assert _lrs(w, tok, 5) == pytest.approx([3e-3 * 1 / 4, 3e-3 * 2 / 4, 3e-3 * 3 / 4, 3e-3, 3e-3])
    # The next phase (GRPO) resets without a warm-up of its own: the policy config's 20 applies.
    w.reset_optimizer(1e-4, decay_steps=10)
    assert _lrs(w, tok, 2) == pytest.approx([1e-4 * 1 / 20, 1e-4 * 2 / 20])


def test_phase_warmup_survives_a_checkpoint_round_trip() -> None:
    w, tok = _worker()
    w.reset_optimizer(3e-3, decay_steps=10, warmup_steps=4)
    _lrs(w, tok, 2)
    state = {k: v for k, v in w.get_state(include_weights=True).items() if k not in ("rng", "rank")}
    fresh, _ = _worker()
    fresh.load_state(state, rng=None)
    assert _lrs(fresh, tok, 2) == pytest.approx([3e-3 * 3 / 4, 3e-3])
    # A checkpoint written before the warm-up was recorded resumes with the config's.
    old = {k: v for k, v in state.items() if k != "warmup_steps"}
    legacy, _ = _worker()
    legacy.load_state(old, rng=None)
    assert _lrs(legacy, tok, 1) == pytest.approx([3e-3 * 3 / 20])


def test_warm_start_phase_config_carries_the_warm_start_schedule() -> None:
    register_configs(REPO / "recipes")
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=[
            "recipe=arith_main", "algorithm.warm_start.warmup_steps=7", "algorithm.warm_start.lr=2e-3",
        ])
    warm, main = plan_phases(cfg)
    assert (warm.name, main.name) == ("warm_start", "grpo")
    assert warm.cfg.policy.optimizer.warmup_steps == 7 and warm.cfg.policy.optimizer.lr == 2e-3
    assert main.cfg.policy.optimizer.warmup_steps == 20 and main.cfg.policy.optimizer.lr == 1e-4
