"""A launcher run with all three trackers on, read back with each library's own reader.

Two SFT steps over the local data plane with observability on, so that the ``data_plane/*``
metrics reach the trackers too; every numeric key of ``metrics.jsonl`` must be in TensorBoard,
MLflow and the offline W&B run with the same values, and ``final/val_accuracy`` must be the
accuracy in ``summary.json``.  A second case hides ``wandb`` from the interpreter and expects the
launcher to stop before Ray starts, naming the extra to install.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_dp.training.trackers import TRACKING_EXTRA, default_mlflow_uri, numeric_metrics
from nemo_dp.utils.metrics import read_metrics
from tests.e2e.conftest import TINY, LaunchFn

pytestmark = [
    pytest.mark.timeout(600),
    # Emitted by MLflow's own SQL store when this test's reader client opens it.
    pytest.mark.filterwarnings("ignore:.*noload.*:DeprecationWarning"),
]

SFT_TINY: tuple[str, ...] = (
    "recipe=sft_arith",
    *TINY,
    "algorithm.max_steps=2",
    "algorithm.val_period=0",
    "algorithm.num_train_samples=64",
    "logger.plot=false",
)
ALL_TRACKERS: tuple[str, ...] = (
    "logger.tensorboard.enabled=true",
    "logger.wandb.enabled=true",
    "logger.mlflow.enabled=true",
)


def _wandb_records(run_file: Path) -> list[dict]:
    wandb_cli = Path(sys.executable).parent / "wandb"
    out = subprocess.run(
        [str(wandb_cli), "leet", "inspect", "--json", str(run_file)], capture_output=True, text=True, timeout=120, check=True
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def test_all_trackers_receive_config_steps_and_final_accuracy(launch: LaunchFn, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    proc = launch(
        [*SFT_TINY, "data_plane=local", "data_plane.observability.enabled=true", *ALL_TRACKERS, f"hydra.run.dir={run}"]
    )
    assert proc.returncode == 0, f"STDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-4000:]}"
    assert "wandb:" not in proc.stdout + proc.stderr  # the banner is silenced
    records = {r["step"]: numeric_metrics(r) for r in read_metrics(run / "metrics.jsonl")}
    assert sorted(records) == [1, 2]
    assert any(k.startswith("data_plane/") for k in records[1])
    final = json.loads((run / "summary.json").read_text())["phases"]["sft"]["val_accuracy"]

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    for step, metrics in records.items():
        for key, value in metrics.items():
            events = {e.step: e.value for e in acc.Scalars(key)}
            assert events[step] == pytest.approx(value, rel=1e-6), key  # event files store float32
    assert acc.Scalars("final/val_accuracy")[0].value == pytest.approx(final, rel=1e-6)
    assert "d_model: 32" in acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()

    client = MlflowClient(tracking_uri=default_mlflow_uri(run))
    (mlrun,) = client.search_runs([client.get_experiment_by_name("nemo_dp").experiment_id])
    assert mlrun.info.status == "FINISHED" and mlrun.data.params["policy.model.d_model"] == "32"
    for key in records[1]:
        history = {m.step: m.value for m in client.get_metric_history(mlrun.info.run_id, key)}
        assert history == {step: records[step][key] for step in records if key in records[step]}, key
    assert mlrun.data.metrics["final/val_accuracy"] == final

    (run_file,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    wb = _wandb_records(run_file)
    rows = {row["step"]: row for row in (r["history"]["item"] for r in wb if r["type"] == "history")}
    for step, metrics in records.items():
        for key, value in metrics.items():
            assert rows[step][key] == value, key
    summary: dict = {}
    for r in wb:
        if r["type"] == "summary":
            summary.update(r["summary"].get("update", {}))
    assert summary["final/val_accuracy"] == final
    config: dict = {}
    for r in wb:
        if r["type"] == "config":
            config.update(r["config"].get("update", {}))
    assert config["policy"]["model"]["d_model"] == 32


def test_missing_tracker_package_fails_before_ray(launch: LaunchFn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hide = tmp_path / "hide_wandb"
    hide.mkdir()
    # Imported by site at start-up: makes `import wandb` fail as if it were not installed.
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['wandb'] = None\n")
    monkeypatch.setenv("PYTHONPATH", str(hide))
    run = tmp_path / "run"
    proc = launch([*SFT_TINY, "data_plane=disabled", "logger.wandb.enabled=true", f"hydra.run.dir={run}"], timeout=120)
    assert proc.returncode != 0
    assert "logger.wandb.enabled=true" in proc.stderr and TRACKING_EXTRA in proc.stderr
    assert "Started a local Ray instance" not in proc.stdout + proc.stderr
    assert "Running synchronous" not in proc.stdout
    assert not (run / "resolved_config.yaml").exists()
