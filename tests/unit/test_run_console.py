"""Clean failures (issue 14 problem 5), each reproduced with a real Hydra app in a subprocess.

The app below is a real ``@hydra.main`` entry point wrapped by ``hydra_task`` exactly as the
launcher is; it fails the way a launcher run fails (a configuration error before start, a crash
after start, SIGTERM while training).  No Ray: the pieces Ray adds (worker lines with colour
codes, a SIGTERM handler installed by ``ray.init``) are reproduced by the app itself.
"""

from __future__ import annotations

import json
import shutil
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nemo_dp.training.hydra_task import silence_known_noise
from nemo_dp.training.log_capture import AnsiStrippingFormatter, _LineSink, strip_ansi
from nemo_dp.training.run_record import RunRecord, remove_unstarted_run_dir, write_failure_summary

APP = textwrap.dedent(
    """
    import logging, signal, sys, time
    from pathlib import Path

    import hydra

    from nemo_dp.training.hydra_task import hydra_task
    from nemo_dp.training.sigterm import sigterm_as_interrupt
    from nemo_dp.utils.metrics import MetricsLogger


    @hydra.main(config_path=None, config_name=None, version_base=None)
    @hydra_task
    def main(cfg, record):
        print("run directory: " + str(record.run_dir), flush=True)
        if cfg.mode == "config_error":
            raise ValueError("policy.model.d_model: must be divisible by policy.model.n_heads=3, got 8")
        if cfg.mode == "bug":
            raise KeyError("a bug, not a configuration error")
        (record.run_dir / "resolved_config.yaml").write_text("mode: x\\n")
        record.mark_started()
        # What ray.init does to SIGTERM (exit at once); the launcher re-enters the converter.
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(15))
        if cfg.mode == "sigterm_during_ray_init":
            Path(cfg.ready).write_text("ready")
            while True:
                time.sleep(0.05)
        with sigterm_as_interrupt():
            metrics = MetricsLogger(record.run_dir / "metrics.jsonl")
            record.track_metrics(metrics.path, record.run_dir / "training_curves.png")
            record.summary = {"phases": {}}
            for step in (1, 2, 3):
                metrics.log(step, {"loss": 1.0 / step, "reward_mean": 0.1 * step})
            print("\\x1b[36m(PolicyWorker pid=123)\\x1b[0m generated 8 rows", flush=True)
            sys.stderr.write("GRPO:  10%|#    | 1/10\\rGRPO:  30%|###  | 3/10\\n")
            logging.getLogger("nemo_dp.test").warning("\\x1b[31mstore is slow\\x1b[0m")
            if cfg.mode == "crash":
                raise RuntimeError("storage unit died")
            if cfg.mode == "crash_after_checkpoint":
                record.checkpoint_root = record.run_dir / "checkpoints"
                record.phase_names = ["warm_start", "grpo"]
                for phase, step in (("warm_start", 3), ("grpo", 1), ("grpo", 2)):
                    ckpt = record.checkpoint_root / phase / f"step_{step:08d}"
                    ckpt.mkdir(parents=True)
                    (ckpt / "manifest.json").write_text("{}")
                    (ckpt / "state.json").write_text("{}")
                raise RuntimeError("storage unit died")
            if cfg.mode == "sigterm":
                try:
                    Path(cfg.ready).write_text("ready")
                    while True:
                        time.sleep(0.05)
                finally:
                    (record.run_dir / "teardown_done").write_text("yes")


    if __name__ == "__main__":
        main()
    """
)


def _app(tmp_path: Path) -> Path:
    path = tmp_path / "app.py"
    path.write_text(APP)
    return path


def _run(
    tmp_path: Path, mode: str, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, str(_app(tmp_path)), f"+mode={mode}", f"hydra.run.dir={tmp_path / 'run'}", *extra],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=240,
    )


def test_configuration_error_prints_one_message_and_leaves_no_run_dir(tmp_path: Path) -> None:
    proc = _run(tmp_path, "config_error")
    assert proc.returncode == 1
    assert "policy.model.d_model: must be divisible by policy.model.n_heads=3, got 8" in proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert not (tmp_path / "run").exists()


def test_full_traceback_only_with_hydra_full_error(tmp_path: Path) -> None:
    proc = _run(tmp_path, "config_error", env={"HYDRA_FULL_ERROR": "1"})
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "ValueError: policy.model.d_model" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_bug_before_start_keeps_its_traceback(tmp_path: Path) -> None:
    proc = _run(tmp_path, "bug")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "KeyError" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_failure_after_start_writes_summary_plot_and_a_clean_log(tmp_path: Path) -> None:
    proc = _run(tmp_path, "crash")
    run = tmp_path / "run"
    assert proc.returncode == 1
    assert "RuntimeError: storage unit died" in proc.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["error"]["type"] == "RuntimeError" and summary["error"]["message"] == "storage unit died"
    assert summary["plots"] == [str(run / "training_curves.png")]
    assert (run / "training_curves.png").stat().st_size > 0
    log = (run / "app.log").read_text()
    assert "\x1b" not in log
    assert "(PolicyWorker pid=123) generated 8 rows" in log
    assert "run directory: " in log
    # The progress bar's redraws collapse to what the terminal finally showed.
    assert "GRPO:  30%|###  | 3/10" in log and "10%" not in log
    assert "store is slow" in log
    # The console itself still gets the colours.
    assert "\x1b[36m(PolicyWorker pid=123)" in proc.stdout


def test_failure_after_start_names_the_last_checkpoint_and_the_resume_command(tmp_path: Path) -> None:
    proc = _run(tmp_path, "crash")
    assert "no checkpoint was written before the run stopped" in proc.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["last_checkpoint"] is None
    shutil.rmtree(tmp_path / "run")
    proc = _run(tmp_path, "crash_after_checkpoint", "+lr=0.1")
    run = tmp_path / "run"
    last = run / "checkpoints" / "grpo" / "step_00000002"
    command = (
        f"python {tmp_path / 'app.py'} +mode=crash_after_checkpoint +lr=0.1 "
        f"checkpointing.resume_from={run} hydra.run.dir={run}"
    )
    assert f"last good checkpoint: {last}" in proc.stderr
    assert f"resume with: {command}" in proc.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["last_checkpoint"] == str(last) and summary["resume_command"] == command


@pytest.mark.parametrize("mode", ["sigterm", "sigterm_during_ray_init"])
def test_sigterm_stops_like_ctrl_c(tmp_path: Path, mode: str) -> None:
    ready = tmp_path / "ready"
    full_env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.Popen(
        [
            sys.executable,
            str(_app(tmp_path)),
            f"+mode={mode}",
            f"+ready={ready}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )
    try:
        deadline = time.monotonic() + 240
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists(), proc.communicate(timeout=30)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    run = tmp_path / "run"
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM; teardown done" in err
    assert "Traceback" not in err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "terminated"
    if mode == "sigterm":
        assert (run / "teardown_done").read_text() == "yes"
        assert summary["error"]["type"] == "TerminationRequested"
        assert (run / "training_curves.png").is_file()
    else:
        assert summary["error"]["type"] == "SystemExit"


# --- in-process pieces -----------------------------------------------------------------------


def test_strip_ansi_and_formatter() -> None:
    assert (
        strip_ansi("\x1b[1m\x1b[36m(Worker pid=1)\x1b[0m ok \x1b]0;title\x07done") == "(Worker pid=1) ok done"
    )
    import logging

    fmt = AnsiStrippingFormatter(logging.Formatter("%(levelname)s %(message)s"))
    rec = logging.LogRecord("x", logging.WARNING, __file__, 1, "\x1b[33mslow\x1b[0m", None, None)
    assert fmt.format(rec) == "WARNING slow"


def test_line_sink_keeps_complete_lines_only(tmp_path: Path) -> None:
    sink = _LineSink(tmp_path / "l.log")
    sink.feed("out", "a")
    sink.feed("err", "bar 1\rbar 2")
    sink.feed("out", "b\nc")
    sink.feed("err", "\rbar 3\n")
    sink.close()
    assert (tmp_path / "l.log").read_text() == "ab\nbar 3\nc\n"


def test_remove_unstarted_run_dir_only_removes_pre_start_files(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("a: 1")
    (run / "launch.log").write_text("run directory: x\n")
    (run / "resolved_config.yaml").write_text("a: 1")
    (run / "checkpoints" / "sft").mkdir(parents=True)  # preflight's writability probe
    keep = tmp_path / "keep"
    (keep / ".hydra").mkdir(parents=True)
    (keep / "metrics.jsonl").write_text('{"step": 1}\n')
    assert remove_unstarted_run_dir(keep, log_names=("launch.log",)) is False
    assert (keep / "metrics.jsonl").exists()
    (run / "other.log").write_text("")
    assert remove_unstarted_run_dir(run, log_names=("launch.log",)) is False
    (run / "other.log").unlink()
    (run / "checkpoints" / "sft" / "state.pt").write_bytes(b"x")
    assert remove_unstarted_run_dir(run, log_names=("launch.log",)) is False
    (run / "checkpoints" / "sft" / "state.pt").unlink()
    assert remove_unstarted_run_dir(run, log_names=("launch.log",)) is True
    assert not run.exists()
    assert remove_unstarted_run_dir(tmp_path / "absent") is False


def test_failure_summary_without_metrics(tmp_path: Path) -> None:
    record = RunRecord(run_dir=tmp_path / "run")
    record.summary = {"phases": {"warm_start": {"step": 225}}}
    record.track_metrics(tmp_path / "run" / "missing.jsonl", tmp_path / "run" / "p.png")
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        path = write_failure_summary(record, exc, status="failed")
    summary = json.loads(path.read_text())
    assert summary["phases"] == {"warm_start": {"step": 225}}
    assert summary["plots"] == [] and summary["status"] == "failed"
    assert "RuntimeError: boom" in "".join(summary["error"]["traceback_tail"])


_FX = textwrap.dedent(
    """
    import sys, torch
    from nemo_dp.training.hydra_task import silence_known_noise
    if sys.argv[1] == "silenced":
        silence_known_noise(local_ray=False)
    torch.nested.nested_tensor_from_jagged(torch.arange(6.0), torch.tensor([0, 2, 6]))
    """
)


@pytest.mark.parametrize("mode", ["plain", "silenced"])
def test_fx_tracing_notice_is_silenced_at_its_source(tmp_path: Path, mode: str) -> None:
    script = tmp_path / "fx.py"
    script.write_text(_FX)
    proc = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    noticed = "is_fx_tracing will return true" in proc.stderr
    assert noticed is (mode == "plain")


_RAY_AUTH = textwrap.dedent(
    """
    import logging, os, sys
    from nemo_dp.training.hydra_task import silence_known_noise
    done = silence_known_noise(local_ray=sys.argv[1] == "local")
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    logging.getLogger("ray").addHandler(Keep())
    # The exact function ray.init calls before starting a local cluster (no cluster starts).
    from ray._private.authentication.authentication_token_setup import enable_token_auth_by_default
    enabled = enable_token_auth_by_default()
    print(enabled, os.environ.get("RAY_AUTH_MODE"), any("Token authentication" in r for r in records))
    """
)


@pytest.mark.parametrize(
    ("mode", "expected"), [("local", "True token False"), ("untouched", "True token True")]
)
def test_ray_token_auth_notice_is_silenced_for_a_local_cluster(
    tmp_path: Path, mode: str, expected: str
) -> None:
    script = tmp_path / "auth.py"
    script.write_text(_RAY_AUTH)
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    proc = subprocess.run(
        [sys.executable, str(script), mode], capture_output=True, text=True, timeout=240, env=env
    )
    assert proc.returncode == 0, proc.stderr
    # Token authentication stays enabled either way; only the notice differs.
    assert proc.stdout.strip().splitlines()[-1] == expected


def test_silence_known_noise_never_overrides_an_explicit_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    silence_known_noise(local_ray=True)
    assert os.environ["RAY_AUTH_MODE"] == "disabled"


# --- algorithm=sft alone (issue 14 problem 6) ------------------------------------------------


def test_algorithm_sft_alone_fails_composing_and_gets_a_recipe_hint() -> None:
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    from nemo_dp.config import CONF_DIR, RECIPES_DIR, register_configs
    from nemo_dp.training.recipe_hints import recipe_algorithm, recipe_hint

    register_configs(RECIPES_DIR)
    with initialize_config_dir(version_base=None, config_dir=str(CONF_DIR)):
        with pytest.raises(ConfigCompositionException, match="num_prompts_per_step"):
            compose("config", overrides=["algorithm=sft"])
        assert compose("config", overrides=["algorithm=sft", "recipe=sft_arith"]).algorithm.name == "sft"
        assert compose("config", overrides=["algorithm=sft", "~recipe"]).algorithm.name == "sft"
    assert recipe_algorithm(RECIPES_DIR / "arith_main.yaml") == "grpo"
    assert recipe_algorithm(RECIPES_DIR / "sft_arith.yaml") == "sft"
    hint = recipe_hint(["algorithm=sft"], recipes_dir=RECIPES_DIR, default_recipe="arith_main")
    assert hint is not None and "recipe=sft_arith" in hint and "~recipe" in hint and "'arith_main'" in hint
    for ok in (["algorithm=sft", "recipe=sft_arith"], ["algorithm=sft", "~recipe"], ["algorithm=grpo"], []):
        assert recipe_hint(ok, recipes_dir=RECIPES_DIR, default_recipe="arith_main") is None


def test_recipe_hint_on_failure_prints_only_on_failure(capsys: pytest.CaptureFixture[str]) -> None:
    from nemo_dp.config import RECIPES_DIR
    from nemo_dp.training.recipe_hints import recipe_hint_on_failure

    with pytest.raises(SystemExit):
        with recipe_hint_on_failure(["algorithm=sft"], recipes_dir=RECIPES_DIR, default_recipe="arith_main"):
            raise SystemExit(1)
    assert "hint: algorithm=sft" in capsys.readouterr().err
    with recipe_hint_on_failure(["algorithm=sft"], recipes_dir=RECIPES_DIR, default_recipe="arith_main"):
        pass
    assert capsys.readouterr().err == ""


def test_a_deferred_run_log_writes_nothing_until_the_run_is_accepted(tmp_path: Path) -> None:
    import logging

    from nemo_dp.training.log_capture import capture_run_log

    log = tmp_path / "run" / "launch.log"
    with capture_run_log(log, deferred=True):
        print("refused before start", flush=True)
        logging.getLogger("nemo_dp.test").warning("a record before start")
    assert not (tmp_path / "run").exists()  # a refused run leaves no file, no directory
    with capture_run_log(log, deferred=True) as run_log:
        print("\x1b[32mline before start\x1b[0m", flush=True)
        logging.getLogger("nemo_dp.test").warning("a record before start")
        assert not log.exists()
        record = RunRecord(run_dir=tmp_path / "run", on_start=[run_log.open])
        record.mark_started()
        record.mark_started()  # once only
        print("line after start", flush=True)
    lines = log.read_text().splitlines()
    assert lines[0] == "line before start" and lines[-1] == "line after start", lines
    assert sum("a record before start" in line for line in lines) == 1, lines
