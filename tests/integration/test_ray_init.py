"""``init_ray`` against a real Ray, without the launcher: a private Ray stays private.

Each case runs in its own interpreter (a private Ray per case; the session cluster of this tier
is not used, so these tests can run beside it): ``RAY_ADDRESS`` and a stale address file that
point at a dead port are ignored by a local start, which gets exactly its CPU budget, runs in
its own temp dir, hands ``worker_env`` to the workers and leaves the address file alone.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.ray_cluster import short_tmp_dir

REPO_ROOT = Path(__file__).resolve().parents[2]

_LOCAL = """
import json, os, sys
from nemo_dp.distributed.ray_init import init_ray, shutdown_ray
env = init_ray(num_cpus=1, reserved_cpus=1, worker_env={"NEMO_DP_PROBE": "42"}, temp_dir=sys.argv[1])
import ray

@ray.remote(num_cpus=0)
def probe():
    return os.environ.get("NEMO_DP_PROBE")

out = {"env": env, "cpus": ray.cluster_resources().get("CPU"), "worker_env": ray.get(probe.remote()),
       "session_dir": ray._private.worker._global_node.get_session_dir_path()}
shutdown_ray()
print("OUT=" + json.dumps(out))
"""


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory under /tmp (Ray's socket paths must stay under 108 bytes)."""
    with short_tmp_dir("ndpi_") as path:
        yield path


def _dead_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_local_start_ignores_ray_address_and_a_stale_address_file(short_tmp: Path) -> None:
    machine_tmp = short_tmp / "machine"
    (machine_tmp / "ray").mkdir(parents=True)
    stale = machine_tmp / "ray" / "ray_current_cluster"
    stale.write_text(f"127.0.0.1:{_dead_port()}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(RAY_TMPDIR=str(machine_tmp), RAY_ADDRESS=f"127.0.0.1:{_dead_port()}", RAY_USAGE_STATS_ENABLED="0")
    private = short_tmp / "private"
    proc = subprocess.run(
        [sys.executable, "-c", _LOCAL, str(private)],
        env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("OUT="))[4:])
    assert out["env"] == {"NEMO_DP_PROBE": "42"} and out["worker_env"] == "42"
    assert out["cpus"] == 1.0
    assert Path(out["session_dir"]).parent == private
    assert stale.read_text().startswith("127.0.0.1:") and sorted(p.name for p in (machine_tmp / "ray").iterdir()) == [
        "ray_current_cluster"
    ]
