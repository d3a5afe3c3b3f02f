"""The bench's reporting on constructed rows: ratios and targets decide on the right side of
each threshold (no benchmark runs here, so the verdicts are checked against known values)."""

from __future__ import annotations

import pytest

from nemo_dp.bench.report import (
    LOCAL_TPUT_TARGET,
    TQ_JAGGED_TARGET,
    TQ_OVERHEAD_TARGET,
    Row,
    add_ratios,
    evaluate_targets,
    rl_comparisons,
    sft_table,
)


def _row(backend: str, op: str, median_ms: float, min_ms: float, payload: str = "dense") -> Row:
    return Row(payload=payload, size_mib=64.0, nbytes=64 << 20, rows=512, backend=backend, op=op,
               reps=3, min_ms=min_ms, median_ms=median_ms, mb_per_s=1.0, times_ms=[min_ms, median_ms])


def _targets(rows: list[Row]) -> dict[str, dict]:
    add_ratios(rows)
    return {t["target"]: t for t in evaluate_targets(rows)}


def test_local_target_verdicts_follow_the_measured_ratio() -> None:
    # memcpy 10 ms; local put at 0.8x copy speed (12.5 ms) meets, get at 0.5x (20 ms) does not;
    # the minima are the other way round.
    rows = [
        _row("memcpy", "copy", 10.0, 10.0),
        _row("local", "put", 12.5, 25.0),
        _row("local", "get", 20.0, 12.5),
    ]
    targets = _targets(rows)
    put = next(t for name, t in targets.items() if name.startswith("local put"))
    get = next(t for name, t in targets.items() if name.startswith("local get"))
    assert put["value"] == pytest.approx(0.8) and put["met"] is True
    assert put["value_min"] == pytest.approx(0.4) and put["met_min"] is False
    assert get["value"] == pytest.approx(0.5) and get["met"] is False
    assert get["value_min"] == pytest.approx(0.8) and get["met_min"] is True
    assert put["threshold"] == LOCAL_TPUT_TARGET
    # Nothing measured for TransferQueue: its verdicts are "not measured", not False.
    tq = [t for name, t in targets.items() if name.startswith("transfer_queue")]
    assert len(tq) == 4 and all(t["met"] is None and t["met_min"] is None for t in tq)


def test_tq_overhead_target_is_judged_against_the_raw_library() -> None:
    rows = [
        _row("tq_raw", "put", 10.0, 10.0),
        _row("transfer_queue", "put", 10.5, 12.0),  # 1.05x (met), min 1.2x (not met)
    ]
    targets = _targets(rows)
    t = next(t for name, t in targets.items() if name.startswith("transfer_queue adapter put") and "dense" in name)
    assert t["value"] == pytest.approx(1.05) and t["met"] is True
    assert t["value_min"] == pytest.approx(1.2) and t["met_min"] is False
    assert t["threshold"] == TQ_OVERHEAD_TARGET
    assert rows[1].time_vs_tq_raw == pytest.approx(1.05)
    assert rows[1].tput_vs_memcpy is None  # no memcpy row to compare with


def test_tq_jagged_target_asks_for_three_times_the_raw_library() -> None:
    rows = [
        _row("tq_raw", "get", 30.0, 30.0, payload="jagged"),
        _row("transfer_queue", "get", 9.0, 11.0, payload="jagged"),  # 0.30x (met), min 0.37x (not)
    ]
    targets = _targets(rows)
    t = next(t for name, t in targets.items() if name.startswith("transfer_queue adapter get") and "jagged" in name)
    assert "3x faster" in next(n for n in targets if n.startswith("transfer_queue adapter get") and "jagged" in n)
    assert t["threshold"] == pytest.approx(TQ_JAGGED_TARGET)
    assert t["value"] == pytest.approx(0.3) and t["met"] is True
    assert t["value_min"] == pytest.approx(11.0 / 30.0) and t["met_min"] is False


def _run(dp: str, size: int, step_s: float, bulk: float) -> dict:
    mean = {
        "step_time_s": step_s, "driver_bulk_received_bytes": bulk, "driver_tensor_received_bytes": bulk + 10,
        "ray_received_pickled_bytes": 100.0, "ray_sent_bulk_bytes": 5.0, "driver_store_written_bytes": 7.0,
        "driver_store_wall_ms": 1.0, "workers_store_wall_ms_max_rank": 2.0,
        "time/generation_s": 0.1, "time/logprobs_s": 0.2, "time/train_s": 0.3,
    }
    return {"samples_per_step": size, "data_plane": dp, "mean": mean, "peak_rss_mb": 1.0, "rss_growth_mb": 0.5}


def test_rl_comparisons_pair_legacy_with_tq_per_size() -> None:
    results = [_run("disabled", 32, 2.0, 1000.0), _run("tq", 32, 3.0, 10.0), _run("disabled", 64, 1.0, 1.0)]
    (c,) = rl_comparisons(results, [32, 64], target_bulk_ratio=0.05)  # 64 has no tq run
    assert c["samples_per_step"] == 32
    assert c["step_time_ratio_tq_over_legacy"] == pytest.approx(1.5)
    assert c["driver_bulk_ratio_tq_over_legacy"] == pytest.approx(0.01) and c["bulk_target_met"] is True
    (strict,) = rl_comparisons(results, [32], target_bulk_ratio=0.001)
    assert strict["bulk_target_met"] is False


def test_rl_comparisons_cover_every_synchronous_data_plane_backend() -> None:
    results = [
        _run("disabled", 32, 2.0, 1000.0), _run("tq", 32, 3.0, 10.0),
        _run("tq_async", 32, 2.5, 0.0), _run("ray", 32, 1.0, 0.0),
    ]
    tq, ray = rl_comparisons(results, [32], target_bulk_ratio=0.05)
    assert (tq["data_plane"], ray["data_plane"]) == ("tq", "ray")
    assert ray["step_time_ratio_ray_over_legacy"] == pytest.approx(0.5) and ray["ray_step_time_s"] == 1.0
    assert "tq_async_step_time_s" in tq and "tq_async_step_time_s" not in ray
    assert not any(k.startswith("tq_") for k in ray)


def test_sft_table_is_relative_to_disabled_when_it_ran() -> None:
    def run(dp: str, step_s: float, held: float) -> dict:
        mean = {"step_time_s": step_s, "time/train_s": step_s / 2, "driver_held_bytes": held,
                "driver_sent_tensor_bytes": held / 2, "ray_received_pickled_bytes": held / 2}
        return {"global_batch_size": 8, "data_plane": dp, "mean": mean, "peak_rss_mb": 1.0}

    table = sft_table([run("disabled", 2.0, 1000.0), run("local", 1.0, 10.0)], [8])
    by_dp = {r["data_plane"]: r for r in table}
    assert by_dp["disabled"]["step_time_vs_disabled"] == pytest.approx(1.0)
    assert by_dp["local"]["step_time_vs_disabled"] == pytest.approx(0.5)
    assert by_dp["local"]["driver_bytes_vs_disabled"] == pytest.approx(0.01)
    (alone,) = sft_table([run("tq", 1.0, 10.0)], [8])
    assert alone["step_time_vs_disabled"] is None and alone["driver_bytes_vs_disabled"] is None


def test_async_column_is_time_per_trained_sample_against_sync() -> None:
    results = [_run("disabled", 32, 2.0, 1000.0), _run("tq", 32, 4.0, 10.0), _run("tq_async", 32, 3.0, 10.0)]
    (c,) = rl_comparisons(results, [32], target_bulk_ratio=0.05)
    assert c["tq_ms_per_trained_sample"] == pytest.approx(125.0)
    assert c["tq_async_ms_per_trained_sample"] == pytest.approx(93.75)
    assert c["per_sample_ratio_async_over_sync"] == pytest.approx(0.75)
    (without,) = rl_comparisons(results[:2], [32], target_bulk_ratio=0.05)
    assert "tq_async_step_time_s" not in without
