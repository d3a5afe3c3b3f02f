"""Experiment trackers, read back with each library's own reader.

TensorBoard events are read with TensorBoard's ``EventAccumulator``, the MLflow store with
``MlflowClient``, the offline W&B run with wandb's own transaction-log reader
(``wandb leet inspect --json``).  No Ray; the W&B and MLflow cases start the real libraries.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from nemo_dp.config.logging import MlflowConfig, TensorBoardConfig, WandbConfig
from nemo_dp.training.trackers import (
    TRACKING_EXTRA,
    TrackerGroup,
    TrackerUnavailableError,
    build_trackers,
    check_trackers_available,
    default_mlflow_uri,
    enabled_trackers,
    flatten_run_summary,
    numeric_metrics,
)

RESOLVED: dict[str, Any] = {
    "algorithm": {"name": "grpo", "loss": {"reference_policy_kl_penalty": 0.01}},
    "policy": {"optimizer": {"lr": 0.001}, "model": {"n_layers": 1}},
    "seed": 42,
}
STEPS: list[dict[str, Any]] = [
    {"loss": 1.5, "reward_mean": 0.25, "data_plane/step/wall_ms": 12.0, "note": "text", "flag": True},
    {"loss": 0.75, "reward_mean": 0.5, "data_plane/step/wall_ms": 11.0, "val_accuracy": 0.125},
]


def _logger_cfg(**enabled: bool) -> Any:
    return OmegaConf.create(
        {
            "tensorboard": {"enabled": enabled.get("tensorboard", False), "log_dir": "tensorboard"},
            "wandb": {
                "enabled": enabled.get("wandb", False),
                "project": "nemo_dp_test",
                "entity": None,
                "name": None,
                "group": None,
                "tags": ["unit"],
                "mode": "offline",
                "dir": ".",
            },
            "mlflow": {"enabled": enabled.get("mlflow", False), "tracking_uri": None, "experiment": "unit", "run_name": None},
        }
    )


def _drive(group: TrackerGroup) -> None:
    """The calls a two-phase run makes: config, warm-start steps, main steps, summary, close."""
    group.log_config(RESOLVED)
    warm = group.with_prefix("warm_start")
    warm.log_metrics(1, {"loss": 3.0})
    warm.log_metrics(2, {"loss": 2.0})
    main = group.with_prefix("")
    for step, record in enumerate(STEPS, start=1):
        main.log_metrics(step, {"step": step, **record})
    group.log_summary({"val_accuracy": 0.125, "warm_start/val_accuracy": 0.0625})
    group.close("success")


def test_numeric_metrics_keeps_numbers_only() -> None:
    rec = {"step": 3, "loss": 1, "x": 0.5, "nan": "nan", "s": "abc", "b": True, "n": None}
    out = numeric_metrics(rec)
    assert list(out) == ["loss", "x", "nan"]
    assert out["loss"] == 1.0 and out["x"] == 0.5 and out["nan"] != out["nan"]


def test_tensorboard_events_read_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    group = build_trackers(_logger_cfg(tensorboard=True), tmp_path)
    assert len(group) == 1
    _drive(group)
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()

    def series(tag: str) -> list[tuple[int, float]]:
        return [(e.step, e.value) for e in acc.Scalars(tag)]

    assert series("loss") == [(1, 1.5), (2, 0.75)]
    assert series("data_plane/step/wall_ms") == [(1, 12.0), (2, 11.0)]
    assert series("warm_start/loss") == [(1, 3.0), (2, 2.0)]
    assert series("final/val_accuracy") == [(0, 0.125)]
    assert series("final/warm_start/val_accuracy") == [(0, 0.0625)]
    assert "note" not in acc.Tags()["scalars"] and "flag" not in acc.Tags()["scalars"]
    config_text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "lr: 0.001" in config_text and "reference_policy_kl_penalty: 0.01" in config_text
    status = acc.Tensors("status/text_summary")[0].tensor_proto.string_val[0].decode()
    assert status == "success"


def test_mlflow_store_read_back(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    group = build_trackers(_logger_cfg(mlflow=True), tmp_path)
    _drive(group)
    assert (tmp_path / "mlflow.db").is_file()
    client = MlflowClient(tracking_uri=default_mlflow_uri(tmp_path))
    experiment = client.get_experiment_by_name("unit")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.info.run_name == tmp_path.name
    assert run.data.params["policy.optimizer.lr"] == "0.001"
    assert run.data.params["algorithm.loss.reference_policy_kl_penalty"] == "0.01"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.5), (2, 0.75)]
    wall = client.get_metric_history(run.info.run_id, "data_plane/step/wall_ms")
    assert sorted((m.step, m.value) for m in wall) == [(1, 12.0), (2, 11.0)]
    assert run.data.metrics["final/val_accuracy"] == 0.125
    assert run.data.metrics["warm_start/loss"] == 2.0
    assert "note" not in run.data.metrics
    local = client.download_artifacts(run.info.run_id, "resolved_config.yaml", str(tmp_path / "dl"))
    assert OmegaConf.to_container(OmegaConf.load(local)) == RESOLVED


def _wandb_records(run_file: Path) -> list[dict[str, Any]]:
    """Every record of a ``run-*.wandb`` file, decoded by wandb's own reader."""
    wandb_cli = Path(sys.executable).parent / "wandb"
    out = subprocess.run(
        [str(wandb_cli), "leet", "inspect", "--json", str(run_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def test_wandb_offline_run_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    group = build_trackers(_logger_cfg(wandb=True), tmp_path)
    _drive(group)
    run_files = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1, list((tmp_path / "wandb").iterdir())
    records = _wandb_records(run_files[0])
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["project"] == "nemo_dp_test" and run["display_name"] == tmp_path.name
    config: dict[str, Any] = {}
    for r in records:
        if r["type"] == "config":
            config.update(r["config"].get("update", {}))
    assert config["policy"] == {"optimizer": {"lr": 0.001}, "model": {"n_layers": 1}}
    rows = [r["history"]["item"] for r in records if r["type"] == "history"]
    warm = [(row["step"], row["warm_start/loss"]) for row in rows if "warm_start/loss" in row]
    main = [(row["step"], row["loss"], row["data_plane/step/wall_ms"]) for row in rows if "loss" in row]
    assert warm == [(1, 3.0), (2, 2.0)]
    assert main == [(1, 1.5, 12.0), (2, 0.75, 11.0)]
    assert all("note" not in row for row in rows)
    summary: dict[str, Any] = {}
    for r in records:
        if r["type"] == "summary":
            summary.update(r["summary"].get("update", {}))
    assert summary["final/val_accuracy"] == 0.125
    assert next(r["exit"] for r in records if r["type"] == "exit").get("exit_code", 0) == 0


def test_trackers_combine_and_disabled_write_nothing(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert enabled_trackers(_logger_cfg()) == []
    empty = build_trackers(_logger_cfg(), tmp_path / "none")
    _drive(empty)
    assert not (tmp_path / "none").exists() or not any((tmp_path / "none").iterdir())
    both = build_trackers(_logger_cfg(tensorboard=True, mlflow=True), tmp_path / "both")
    assert [type(t).__name__ for t in both] == ["TensorBoardTracker", "MlflowTracker"]
    _drive(both)
    acc = EventAccumulator(str(tmp_path / "both" / "tensorboard"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("loss")] == [1.5, 0.75]
    assert (tmp_path / "both" / "mlflow.db").is_file()
    assert not (tmp_path / "both" / "wandb").exists()


def test_missing_package_is_named_with_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    check_trackers_available(_logger_cfg(wandb=True, mlflow=True))  # all installed here
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` sees when absent
    check_trackers_available(_logger_cfg(tensorboard=True))  # wandb not enabled: fine
    with pytest.raises(TrackerUnavailableError) as info:
        check_trackers_available(_logger_cfg(wandb=True))
    message = str(info.value)
    assert "logger.wandb.enabled=true" in message and "'wandb' package" in message
    assert TRACKING_EXTRA in message


class _Recorder:
    """A stand-in tracker that isolates TrackerGroup's forwarding and close semantics."""

    def __init__(self, fail_close: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail_close = fail_close

    def log_config(self, resolved: Any) -> None:
        self.calls.append(("config", dict(resolved)))

    def log_metrics(self, step: int, record: Any) -> None:
        self.calls.append(("metrics", (step, dict(record))))

    def log_summary(self, summary: Any) -> None:
        self.calls.append(("summary", dict(summary)))

    def close(self, status: str = "success") -> None:
        self.calls.append(("close", status))
        if self.fail_close:
            raise OSError("disk full")


def test_group_closes_every_member_even_when_one_fails() -> None:
    a, b = _Recorder(fail_close=True), _Recorder()
    group = TrackerGroup([a, b])  # type: ignore[list-item]
    group.with_prefix("warm_start").log_metrics(4, {"step": 4, "loss": 1.0})
    with pytest.raises(OSError, match="disk full"):
        group.close("failed")
    for r in (a, b):
        assert r.calls == [("metrics", (4, {"warm_start/loss": 1.0})), ("close", "failed")]
    with pytest.raises(ValueError, match="status"):
        TrackerGroup().close("done")


def test_flatten_run_summary() -> None:
    summary = {
        "run_dir": "/x",
        "phases": {
            "warm_start": {"val_accuracy": 0.25, "step": 3, "checkpoint": "/x/c"},
            "grpo": {"val_accuracy": 0.5, "step": 4, "wall_time_s": 2.0},
        },
        "accuracy_gain": 0.25,
        "wall_time_s": 9.0,
    }
    assert flatten_run_summary(summary, "grpo") == {
        "warm_start/val_accuracy": 0.25,
        "warm_start/step": 3.0,
        "val_accuracy": 0.5,
        "step": 4.0,
        "wall_time_s": 9.0,
        "accuracy_gain": 0.25,
    }
    with pytest.raises(KeyError, match="ppo"):
        flatten_run_summary(summary, "ppo")


def test_config_rules_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"logger\.wandb\.mode.*legal values"):
        WandbConfig(mode="cloud")
    with pytest.raises(ValueError, match=r"logger\.tensorboard\.log_dir"):
        TensorBoardConfig(log_dir="/abs/tb")
    with pytest.raises(ValueError, match=r"logger\.wandb\.dir"):
        WandbConfig(dir="../elsewhere")
    with pytest.raises(ValueError, match=r"logger\.mlflow\.experiment"):
        MlflowConfig(experiment="")


def test_logger_cfg_of_the_tests_matches_the_schemas() -> None:
    """The blocks these tests build are exactly the schema defaults (unknown keys would raise)."""
    node = _logger_cfg()
    for key, schema in (("tensorboard", TensorBoardConfig), ("wandb", WandbConfig), ("mlflow", MlflowConfig)):
        merged = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), node[key]))
        expected = schema(project="nemo_dp_test", tags=["unit"]) if key == "wandb" else schema()
        if key == "mlflow":
            expected = schema(experiment="unit")
        assert merged == expected, key
