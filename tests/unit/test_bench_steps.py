"""The step benchmarks' shared runner, without running a trainer: every bench composes valid
training configs, the measured window is exactly ``measured_steps`` long, and the store-call
breakdown is read from the logged keys exactly (``_Traffic`` below stands in for the Ray traffic
probe where only the store probe is under test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_dp.bench.steps import (
    GRPO_STEP,
    PPO_STEP,
    SFT_STEP,
    StepBench,
    StepClock,
    _mean_row,
    _measured,
    rl_step_row,
    sft_step_row,
)
from nemo_dp.bench.store_calls import print_store_breakdown, store_breakdown, store_op_columns

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("spec", [GRPO_STEP, PPO_STEP, SFT_STEP], ids=lambda s: s.name)
def test_each_step_bench_composes_valid_training_configs(spec: StepBench) -> None:
    from hydra import compose, initialize_config_dir

    from nemo_dp.config import register_configs, validate_config
    from nemo_dp.algorithms.selection import describe_selection

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


# A logged record with the observability layer's per-op keys on all three sites.
_STORE_RECORD = {
    "data_plane/step/wall_ms": 9.0,
    "data_plane/step/put/calls": 1.0,
    "data_plane/step/put/rows": 128.0,
    "data_plane/step/put/mb": 0.25,
    "data_plane/step/put/wall_ms": 4.0,
    "data_plane/step/put/mean_ms": 4.0,  # not part of the breakdown
    "data_plane/step/clear/calls": 1.0,
    "data_plane/step/clear/wall_ms": 5.0,
    "data_plane/workers/step/max_rank_wall_ms": 30.0,
    "data_plane/workers/max_rank/rank": 1.0,
    "data_plane/workers/max_rank/get_data/calls": 2.0,
    "data_plane/workers/max_rank/get_data/rows": 128.0,
    "data_plane/workers/max_rank/get_data/mb": 1.5,
    "data_plane/workers/max_rank/get_data/wall_ms": 20.0,
    "data_plane/critic_workers/max_rank/put/calls": 1.0,
}


def test_store_op_columns_flatten_every_site_and_scale_bytes() -> None:
    cols = store_op_columns(_STORE_RECORD)
    assert cols == {
        "store/driver/put/calls": 1.0,
        "store/driver/put/rows": 128.0,
        "store/driver/put/bytes": 250_000.0,
        "store/driver/put/ms": 4.0,
        "store/driver/clear/calls": 1.0,
        "store/driver/clear/ms": 5.0,
        "store/slowest_worker/get_data/calls": 2.0,
        "store/slowest_worker/get_data/rows": 128.0,
        "store/slowest_worker/get_data/bytes": 1_500_000.0,
        "store/slowest_worker/get_data/ms": 20.0,
        "store/slowest_critic_worker/put/calls": 1.0,
    }
    assert store_op_columns({"time/train_s": 1.0}) == {}  # legacy: no store counters
    traffic = {"ray_received_bulk_bytes": 0, "ray_received_per_row_bytes": 0,
               "ray_received_pickled_bytes": 0, "ray_sent_bulk_bytes": 0, "ray_sent_per_row_bytes": 0}
    row = sft_step_row(3, 1.0, traffic, {"time/train_s": 0.5, **_STORE_RECORD})
    assert row["store/slowest_worker/get_data/calls"] == 2.0


def test_mean_row_counts_an_op_missing_from_a_step_as_zero() -> None:
    mean = _mean_row([{"step": 1, "a": 2.0, "store/driver/clear/calls": 2.0}, {"step": 2, "a": 4.0}])
    assert mean == {"a": 3.0, "store/driver/clear/calls": 1.0}


def test_store_breakdown_groups_by_site_and_op_and_skips_legacy(capsys: pytest.CaptureFixture) -> None:
    runs = [
        {"samples_per_step": 128, "data_plane": "disabled", "mean": {"step_time_s": 1.0}},
        {"samples_per_step": 128, "data_plane": "tq", "mean": {"step_time_s": 1.2, **store_op_columns(_STORE_RECORD)}},
    ]
    (entry,) = store_breakdown(runs, "samples_per_step")
    assert entry["data_plane"] == "tq" and entry["samples_per_step"] == 128
    assert entry["sites"]["driver"]["put"] == {"calls": 1.0, "rows": 128.0, "bytes": 250_000.0, "ms": 4.0}
    assert entry["sites"]["driver"]["clear"] == {"calls": 1.0, "rows": 0.0, "bytes": 0.0, "ms": 5.0}
    assert entry["totals"]["driver"] == {"calls": 2.0, "ms": 9.0}
    assert entry["totals"]["slowest_worker"] == {"calls": 2.0, "ms": 20.0}
    print_store_breakdown("grpo_step", "samples_per_step", [entry])
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split()[2:5] == ["slowest_worker", "get_data", "2.0"] for line in lines), lines
    print_store_breakdown("grpo_step", "samples_per_step", [])
    assert "no store counters" in capsys.readouterr().out


class _Traffic:
    def take(self) -> dict[str, int]:
        return {}


def test_step_clock_fills_store_counters_only_when_the_trainer_did_not(tmp_path: Path) -> None:
    probes: list[float] = []

    def probe(step_time_s: float) -> dict[str, float]:
        probes.append(step_time_s)
        return {"data_plane/step/wall_ms": 1.0, "data_plane/step/get/calls": 3.0}

    clock = StepClock(tmp_path, metrics_file="m.jsonl", plot_file="p.png", plot=False, progress_bar=False,
                      label="t", traffic=_Traffic(), store_probe=probe)
    clock.start(2, 0)
    assert probes == [1.0]  # the window before the first step is dropped
    clock.log_step(1, {"loss": 0.5})  # an SFT-like record: the probe fills the counters in
    assert clock.marks[-1][3]["data_plane/step/get/calls"] == 3.0 and len(probes) == 2
    clock.log_step(2, {"loss": 0.4, "data_plane/step/wall_ms": 7.0})  # the trainer logged them
    assert clock.marks[-1][3]["data_plane/step/wall_ms"] == 7.0 and len(probes) == 2
    clock.close()


def test_tq_async_selects_the_asynchronous_trainer_and_only_for_grpo() -> None:
    from hydra import compose, initialize_config_dir

    from nemo_dp.bench.steps import GrpoStepBenchConfig, PpoStepBenchConfig
    from nemo_dp.config import register_configs, validate_config
    from nemo_dp.algorithms.selection import describe_selection

    register_configs(REPO / "recipes")
    bench = GrpoStepBenchConfig(backends=["tq", "tq_async"], samples_per_step=[16])
    with initialize_config_dir(str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=GRPO_STEP.train_overrides(bench, "tq_async", 16))
        validate_config(cfg)
    assert describe_selection(cfg)["trainer"] == "nemo_dp.algorithms.grpo_async:grpo_train_async"
    assert cfg.data_plane.observability.enabled is True
    with pytest.raises(ValueError, match=r"bench.backends: need distinct options of \['disabled', 'tq', 'ray'\]"):
        PpoStepBenchConfig(backends=["tq_async"])
