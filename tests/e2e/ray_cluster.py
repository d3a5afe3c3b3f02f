"""Real Ray clusters started with ``ray start --block`` on this machine, for the e2e tier.

``start_cluster`` starts a token-protected head (and optionally a worker node) with free ports,
its own ``--temp-dir`` and a small ``--num-cpus``; ``stop_cluster`` stops exactly the processes
it started, by PID (never ``ray stop``, which stops every Ray of the user).  ``test_cluster.py``
joins such clusters on purpose; ``conftest.shared_ray`` keeps one per pytest process that the
launcher runs of the tier join instead of each starting a private Ray.
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
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RAY_BIN = str(Path(sys.executable).with_name("ray"))

#: The variable by which a test script that starts Ray itself (``init_ray``) learns the address
#: of the e2e tier's shared cluster (``conftest.shared_ray_env`` sets it with the token).
SHARED_RAY_ADDRESS_ENV = "NEMO_DP_TEST_RAY_ADDRESS"


def init_script_ray(data_plane_cfg: object) -> dict[str, str]:
    """``init_ray`` for a test script that runs its training on one Ray (2 CPUs).

    It joins the tier's shared cluster when ``SHARED_RAY_ADDRESS_ENV`` names one, else starts
    a private Ray; either way with ``data_plane_cfg``'s worker environment.

    Args:
        data_plane_cfg: The ``data_plane`` node whose TransferQueue knobs the workers need.

    Returns:
        What ``init_ray`` returns (the workers' environment).
    """
    from nemo_dp.data_plane.registry import ray_start_args
    from nemo_dp.distributed.ray_init import init_ray

    address = os.environ.get(SHARED_RAY_ADDRESS_ENV) or None
    return init_ray(address=address, num_cpus=2, **ray_start_args(data_plane_cfg))


@contextmanager
def script_ray(data_plane_cfg: object) -> Iterator[dict[str, str]]:
    """``init_script_ray`` for a ``with`` block; Ray is shut down when the block ends, however.

    Args:
        data_plane_cfg: The ``data_plane`` node whose TransferQueue knobs the workers need.

    Yields:
        The workers' environment.
    """
    from nemo_dp.distributed.ray_init import shutdown_ray

    env = init_script_ray(data_plane_cfg)
    try:
        yield env
    finally:
        shutdown_ray()


@contextmanager
def short_tmp_dir(prefix: str) -> Iterator[Path]:
    """A new directory under /tmp for the ``with`` block, removed after it.

    Short, because Ray's socket paths under a temp dir must stay under 108 bytes.

    Args:
        prefix: The directory name's prefix.

    Yields:
        The directory.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def without_join_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the variables that pick a cluster to join and its token."""
    return {k: v for k, v in env.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now and never handed out before in this session.

    The kernel may give a just-released ephemeral port again on the next ``bind(0)``, so two
    calls for one ``ray start`` line could otherwise name the same port for two components
    (Ray refuses that line). Ports already handed out are skipped.
    """
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free port that was not handed out already")


def base_env(**extra: str) -> dict[str, str]:
    env = without_join_env(dict(os.environ))
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["HYDRA_FULL_ERROR"] = "0"
    env.update(extra)
    return env


@dataclass
class RayNode:
    """One ``ray start --block`` process and everything it spawned."""

    proc: subprocess.Popen
    temp_dir: Path
    log: Path
    pids: set[int] = field(default_factory=set)

    def remember_children(self) -> None:
        try:
            self.pids |= {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass

    def stop(self) -> None:
        """SIGTERM the ``ray start`` process (it stops its children), then any leftover child."""
        self.remember_children()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        leftovers = []
        for pid in self.pids:
            try:
                p = psutil.Process(pid)
                p.terminate()
                leftovers.append(p)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(leftovers, timeout=10)
        for p in alive:
            p.kill()


@dataclass
class RayTestCluster:
    """A cluster of :class:`RayNode` s; ``address`` is the head's GCS ``host:port``."""

    address: str
    token: str
    tmp_root: Path
    nodes: list[RayNode] = field(default_factory=list)

    @property
    def head_temp_dir(self) -> Path:
        return self.nodes[0].temp_dir

    def auth_env(self) -> dict[str, str]:
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token}

    def query(self, code: str, *, timeout: float = 90.0) -> dict:
        """Run ``code`` in a fresh driver joined to this cluster; it must set ``out`` (a dict)."""
        script = (
            "import json, ray, ray._private.state as state\n"
            f"ray.init(address={self.address!r}, include_dashboard=False, logging_level='ERROR')\n"
            "out = {}\n" + code + "\nray.shutdown()\nprint('QUERY=' + json.dumps(out))\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", script],
            env=base_env(**self.auth_env()),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, f"query failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("QUERY=")][-1]
        return json.loads(line[len("QUERY="):])

    def alive_nodes(self) -> list[dict]:
        out = self.query(
            "out['nodes'] = [{'id': n['NodeID'], 'resources': n['Resources']} "
            "for n in ray.nodes() if n['Alive']]"
        )
        return out["nodes"]


def start_node(cluster: RayTestCluster, name: str, args: list[str], ready: Path) -> RayNode:
    temp_dir = cluster.tmp_root / name / "ray"
    temp_dir.mkdir(parents=True)
    log = cluster.tmp_root / f"{name}.log"
    ports = [
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
    ]
    cmd = [
        RAY_BIN, "start", "--block", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}",
        "--num-gpus=0", "--disable-usage-stats", *ports, *args,
    ]  # fmt: skip
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env=base_env(**cluster.auth_env()),
            start_new_session=True,
        )  # fmt: skip
    node = RayNode(proc=proc, temp_dir=temp_dir, log=log)
    cluster.nodes.append(node)
    deadline = time.monotonic() + 90
    target = temp_dir / ready
    while not (target.is_file() and target.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"`ray start` for {name} did not come up:\n{log.read_text()[-4000:]}")
        time.sleep(0.5)
    node.remember_children()
    return node




def start_cluster(tmp_root: Path, *, num_cpus: int, worker_resources: dict[str, float] | None = None,
                   worker_cpus: int = 1) -> RayTestCluster:  # fmt: skip
    """Start a token-protected head (and a worker node with ``worker_resources``) under ``tmp_root``.

    The nodes started are in the returned cluster's ``nodes`` even when this raises, so that the
    caller's ``finally`` stops them.
    """
    port = free_port()
    cluster = RayTestCluster(address=f"127.0.0.1:{port}", token=uuid.uuid4().hex, tmp_root=tmp_root)
    try:
        start_node(
            cluster,
            "head",
            ["--head", f"--port={port}", f"--num-cpus={num_cpus}", "--include-dashboard=false",
             f"--ray-client-server-port={free_port()}"],  # fmt: skip
            Path("ray_current_cluster"),
        )
        if worker_resources is not None:
            start_node(
                cluster,
                "worker",
                [f"--address={cluster.address}", f"--num-cpus={worker_cpus}",
                 f"--resources={json.dumps(worker_resources)}"],  # fmt: skip
                Path("ray_current_cluster"),
            )
            deadline = time.monotonic() + 60
            while len(cluster.alive_nodes()) < 2:
                assert time.monotonic() < deadline, "the worker node never joined the head"
                time.sleep(1)
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def stop_cluster(cluster: RayTestCluster) -> None:
    for node in reversed(cluster.nodes):
        node.stop()
