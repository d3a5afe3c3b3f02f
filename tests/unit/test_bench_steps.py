"""The step benchmarks' shared runner, without running a trainer: every bench composes valid
training configs, and the measured window is exactly ``measured_steps`` long."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_dp.bench.steps import GRPO_STEP, PPO_STEP, SFT_STEP, StepBench, _measured, rl_step_row

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("spec", [GRPO_STEP, PPO_STEP, SFT_STEP], ids=lambda s: s.name)
def test_each_step_bench_composes_valid_training_configs(spec: StepBench) -> None:
    from hydra import compose, initialize_config_dir

    from nemo_dp.config import register_configs, validate_config
    from nemo_dp.data_plane.factory import describe_selection

    register_configs(REPO / "recipes")
    bench = OmegaConf.to_object(OmegaConf.structured(spec.schema))
    steps = bench.warmup_steps + bench.measured_steps + 1
    with initialize_config_dir(str(REPO / "conf"), version_base=None):
        for size in spec.sizes(bench):
            for dp in bench.backends:
                cfg = compose("config", overrides=spec.train_overrides(bench, dp, size))
                validate_config(cfg)
                assert int(cfg.algorithm.max_steps) == steps
                assert describe_selection(cfg)["trainer"].startswith("nemo_dp.algorithms.")
    expected = {"grpo_step": "grpo", "ppo_step": "ppo", "sft_step": "sft"}[spec.name]
    assert cfg.algorithm.name == expected


def _marks(steps: list[int]) -> list[tuple[int, float, dict, dict]]:
    traffic = {k: 0 for k in ("ray_received_bulk_bytes", "ray_received_per_row_bytes",
                              "ray_received_pickled_bytes", "ray_sent_bulk_bytes", "ray_sent_per_row_bytes")}
    record = {"time/generation_s": 0.1, "time/logprobs_s": 0.2, "time/train_s": 0.3,
              "data_plane/step/bytes_read_mb": 0.5}
    return [(0, 0.0, {}, {})] + [(s, float(s), dict(traffic), dict(record)) for s in steps]


def test_the_measured_window_skips_warmup_and_the_final_step() -> None:
    bench = OmegaConf.to_object(OmegaConf.structured(GRPO_STEP.schema))  # warmup 1, measured 3
    rows = _measured(bench, GRPO_STEP, _marks([1, 2, 3, 4, 5]))
    assert [r["step"] for r in rows] == [2, 3, 4]
    assert all(r["step_time_s"] == 1.0 for r in rows)
    assert rows[0]["driver_store_read_bytes"] == 500_000 and rows[0]["driver_bulk_received_bytes"] == 500_000
    with pytest.raises(RuntimeError, match="measured 1 steps, expected bench.measured_steps=3"):
        _measured(bench, GRPO_STEP, _marks([1, 2]))


def test_rl_step_row_adds_store_reads_to_ray_returns() -> None:
    traffic = {"ray_received_bulk_bytes": 100, "ray_received_per_row_bytes": 10,
               "ray_received_pickled_bytes": 1, "ray_sent_bulk_bytes": 0, "ray_sent_per_row_bytes": 0}
    record = {"time/generation_s": 1.0, "time/logprobs_s": 1.0, "time/train_s": 1.0,
              "data_plane/step/bytes_read_mb": 0.000_001}
    row = rl_step_row(7, 2.5, traffic, record)
    assert row["driver_bulk_received_bytes"] == 101 and row["driver_tensor_received_bytes"] == 111
    assert row["step"] == 7 and row["step_time_s"] == 2.5 and row["driver_store_wall_ms"] == 0.0
