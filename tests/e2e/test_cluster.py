"""Launcher runs next to, and on, real Ray clusters started with ``ray start`` on this machine.

Covers: ``cluster=local`` starting a private Ray while another cluster runs (``RAY_ADDRESS`` and
its address file pointing at it) and leaving that cluster running with its state files
untouched; a stale address file; ``cluster.address`` pointing at nothing; a token-protected
cluster joined without / with a wrong / with the right token; and a short GRPO over
TransferQueue on a two-node cluster (head + worker node with a custom resource) whose policy
workers and storage units land where the config asks, whose actors are gone afterwards, and
which leaves the cluster up.

The tests that need a running cluster share one per module (``two_node_cluster``, started and
stopped by ``tests/e2e/ray_cluster.py``). Their launcher runs (forked from the launch server,
like the tier's other runs) use a private Ray or a cluster of their own, never the tier's
shared one. The launcher sees the
test cluster as "the machine's cluster" through ``RAY_TMPDIR``, which moves Ray's default temp
dir (and so its address file) under the test's directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import LAUNCHER, REPO_ROOT, TINY, run_script
from tests.e2e.ray_cluster import RayTestCluster, base_env, free_port, short_tmp_dir, start_cluster, stop_cluster

pytestmark = pytest.mark.timeout(300)

SFT_TINY: tuple[str, ...] = (
    "recipe=sft_arith",
    *TINY,
    "data_plane=disabled",
    "algorithm.max_steps=2",
    "algorithm.val_period=2",
    "algorithm.num_train_samples=32",
    "checkpointing.enabled=false",
    "logger.plot=false",
)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory under /tmp (Ray's socket paths must stay under 108 bytes)."""
    with short_tmp_dir("ndpc_") as path:
        yield path


@pytest.fixture(scope="module")
def two_node_cluster() -> Iterator[RayTestCluster]:
    """The module's "user's cluster": a head (2 CPUs) and a worker node (2 CPUs, ``node_b``).

    One cluster serves every test that needs a running cluster (starting and stopping one
    costs tens of seconds here): the tests only join it or run next to it, and each checks
    what it needs relative to the cluster's state (actors are counted before and after).
    Every node is stopped by its pids in ``finally``.
    """
    root = Path(tempfile.mkdtemp(prefix="ndpc_", dir="/tmp"))  # Ray's socket paths: < 108 bytes
    cluster: RayTestCluster | None = None
    try:
        cluster = start_cluster(root / "c", num_cpus=2, worker_resources={"node_b": 1.0}, worker_cpus=2)
        yield cluster
    finally:
        if cluster is not None:
            stop_cluster(cluster)
        shutil.rmtree(root, ignore_errors=True)


def _launch(overrides: list[str], cwd: Path, env: dict[str, str], timeout: float = 240.0) -> subprocess.CompletedProcess:
    return run_script(LAUNCHER, overrides, cwd, env=env, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"launcher failed:\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-4000:]}"


def _state_of(temp_dir: Path) -> dict[str, str]:
    """The files by which other tools find a cluster: its address file and ``session_latest``."""
    return {
        "address": (temp_dir / "ray_current_cluster").read_text(),
        "session_latest": os.readlink(temp_dir / "session_latest"),
        "sessions": ",".join(sorted(p.name for p in temp_dir.glob("session_2*"))),
    }


# -- issue 17: cluster=local is private --------------------------------------------------------


@pytest.mark.slow
def test_local_run_starts_a_private_ray_next_to_a_running_cluster(
    two_node_cluster: RayTestCluster, short_tmp: Path, tmp_path: Path
) -> None:
    other = two_node_cluster
    before = _state_of(other.head_temp_dir)
    actors_before = other.query("out['actors'] = len(state.actors())")["actors"]
    # The other cluster is "the machine's cluster": its address file is where Ray looks by
    # default, RAY_ADDRESS names it and this process holds its token.
    env = base_env(RAY_TMPDIR=str(other.head_temp_dir.parent), RAY_ADDRESS=other.address, **other.auth_env())
    private = short_tmp / "private"
    run = tmp_path / "run"
    proc = _launch(
        [*SFT_TINY, "cluster=local", "cluster.num_cpus=2", f"cluster.temp_dir={private}", f"hydra.run.dir={run}"],
        tmp_path,
        env,
    )
    _ok(proc)
    assert "Held-out exact-match accuracy after SFT:" in proc.stdout
    assert json.loads((run / "summary.json").read_text())["phases"]["sft"]["step"] == 2
    assert list(private.glob("session_2*")), "the private Ray did not run in cluster.temp_dir"
    # The other cluster still answers (all its 4 CPUs), ran no actor of the job, and its state
    # files are unchanged.
    out = other.query("out['cpus'] = ray.cluster_resources().get('CPU'); out['actors'] = len(state.actors())")
    assert out == {"cpus": 4.0, "actors": actors_before}
    assert _state_of(other.head_temp_dir) == before


@pytest.mark.slow
def test_local_run_ignores_a_stale_address_file(short_tmp: Path, tmp_path: Path) -> None:
    ray_tmp = short_tmp
    (ray_tmp / "ray").mkdir(parents=True)
    stale = ray_tmp / "ray" / "ray_current_cluster"
    stale.write_text(f"127.0.0.1:{free_port()}")
    run = tmp_path / "run"
    proc = _launch(
        [*SFT_TINY, "cluster=local", f"hydra.run.dir={run}"], tmp_path, base_env(RAY_TMPDIR=str(ray_tmp))
    )
    _ok(proc)
    assert stale.read_text().startswith("127.0.0.1:"), "the stale address file was modified"


# -- issue 17: cluster=auto / cluster.address explain what they could not join ----------------


def _assert_fails_fast(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    err = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"the launcher should have failed:\n{err[-3000:]}"
    assert "ClusterConnectError" in err, err[-3000:]
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} missing from:\n{err[-3000:]}"
    # The trainer is selected (and its banner printed) before Ray starts; no step may run.
    assert "step/s" not in err and "Held-out exact-match accuracy" not in err, "training started"
    return err


def test_auto_with_a_stale_address_file_explains(short_tmp: Path, tmp_path: Path) -> None:
    ray_tmp = short_tmp
    (ray_tmp / "ray").mkdir(parents=True)
    port = free_port()
    stale = ray_tmp / "ray" / "ray_current_cluster"
    stale.write_text(f"127.0.0.1:{port}")
    proc = _launch([*SFT_TINY, "cluster=auto"], tmp_path, base_env(RAY_TMPDIR=str(ray_tmp)), timeout=120)
    _assert_fails_fast(proc, f"127.0.0.1:{port}", str(stale), "stale", f"rm {stale}", "cluster=local")


def test_address_pointing_at_nothing_fails_fast(tmp_path: Path) -> None:
    port = free_port()
    proc = _launch(
        [*SFT_TINY, f"cluster.address=127.0.0.1:{port}"], tmp_path, base_env(RAY_TMPDIR=str(tmp_path)), timeout=120
    )
    _assert_fails_fast(
        proc, f"cluster.address=127.0.0.1:{port}", "no Ray head is running there", f"ray start --head --port={port}"
    )


def test_auto_with_no_cluster_at_all_says_where_it_looked(tmp_path: Path) -> None:
    proc = _launch([*SFT_TINY, "cluster=auto"], tmp_path, base_env(RAY_TMPDIR=str(tmp_path)), timeout=120)
    _assert_fails_fast(proc, str(tmp_path / "ray" / "ray_current_cluster"), "does not exist", "ray start --head")


_JOIN = """
import json, os, sys
from nemo_dp.distributed.ray_init import ClusterConnectError, init_ray, shutdown_ray
try:
    init_ray(address=sys.argv[1], connect_timeout_s=10, working_dir=sys.argv[2] or None)
except ClusterConnectError as exc:
    print("REASON=" + exc.reason)
    print(exc)
    sys.exit(3)
import ray

@ray.remote(num_cpus=0)
def where():
    import nemo_dp
    return {"cwd": os.getcwd(), "nemo_dp": nemo_dp.__file__}

print("CPUS=%g" % ray.cluster_resources()["CPU"])
print("WORKER=" + json.dumps(ray.get(where.remote())))
from nemo_dp.distributed.worker_group import RayCluster, RayWorkerGroup
try:  # a placement no node can satisfy fails at once instead of pending forever
    RayWorkerGroup(object, world_size=2, init_kwargs={}, cluster=RayCluster(worker_resources={"gpu_box": 1}))
except ValueError as exc:
    print("PLACEMENT=" + str(exc))
shutdown_ray()
"""


def _join(cluster: RayTestCluster, working_dir: str = "", **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _JOIN, cluster.address, working_dir],
        env=base_env(**env), capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
    )  # fmt: skip


@pytest.mark.slow
def test_joining_a_token_cluster_explains_missing_and_wrong_tokens(
    two_node_cluster: RayTestCluster, tmp_path: Path
) -> None:
    cluster = two_node_cluster
    home = tmp_path / "home"  # no ~/.ray/auth_token here
    home.mkdir()
    missing = _join(cluster, HOME=str(home))
    assert missing.returncode == 3, missing.stdout + missing.stderr
    assert "REASON=auth_token_missing" in missing.stdout
    assert f"cluster.address={cluster.address}" in missing.stdout and "RAY_AUTH_MODE=token" in missing.stdout

    wrong = _join(cluster, HOME=str(home), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex)
    assert wrong.returncode == 3, wrong.stdout + wrong.stderr
    assert "REASON=auth_token_rejected" in wrong.stdout
    assert "RAY_AUTH_TOKEN environment variable" in wrong.stdout

    # The right token joins; with a working_dir the worker runs from (and imports nemo_dp
    # from) the copy Ray shipped, not from this checkout.
    right = _join(cluster, str(REPO_ROOT), HOME=str(home), **cluster.auth_env())
    assert right.returncode == 0 and "CPUS=4" in right.stdout, right.stdout + right.stderr
    worker = json.loads(next(ln for ln in right.stdout.splitlines() if ln.startswith("WORKER="))[7:])
    assert "runtime_resources" in worker["cwd"] and Path(worker["cwd"]) != REPO_ROOT, worker
    assert Path(worker["nemo_dp"]).is_relative_to(worker["cwd"]), worker
    assert "PLACEMENT=cluster.policy_resources.gpu_box=1: 2 workers of group 'worker' need 2" in right.stdout
    assert len(cluster.alive_nodes()) == 2  # the joins left both nodes of the cluster up


# -- issue 15 item 4: a short GRPO over TransferQueue on a two-node cluster --------------------


@pytest.mark.slow
def test_grpo_over_tq_on_a_two_node_cluster(two_node_cluster: RayTestCluster, tmp_path: Path) -> None:
    cluster = two_node_cluster
    nodes = cluster.alive_nodes()
    worker_node = next(n["id"] for n in nodes if "node_b" in n["resources"])
    head_node = next(n["id"] for n in nodes if "node_b" not in n["resources"])
    run = tmp_path / "run"
    proc = _launch(
        [
            "~recipe",
            *TINY,
            "algorithm=grpo",
            "data_plane=tq",
            "algorithm.max_steps=2",
            "algorithm.val_period=2",
            "algorithm.num_prompts_per_step=4",
            "algorithm.num_generations_per_prompt=2",
            "algorithm.num_train_prompts=16",
            "data_plane.simple.num_storage_units=2",
            "policy.dp_size=2",
            f"cluster.address={cluster.address}",
            "+cluster.policy_resources.node_b=0.5",
            "checkpointing.enabled=false",
            "logger.plot=false",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
        base_env(**cluster.auth_env()),
        timeout=280,
    )
    _ok(proc)
    assert "Held-out exact-match accuracy after GRPO:" in proc.stdout
    assert json.loads((run / "summary.json").read_text())["phases"]["grpo"]["step"] == 2

    out = cluster.query(
        "out['actors'] = [{'cls': a['ActorClassName'], 'state': a['State'], "
        "'node': a['Address']['NodeID']} for a in state.actors().values()]\n"
        "out['nodes'] = sorted(n['NodeID'] for n in ray.nodes() if n['Alive'])"
    )
    assert out["nodes"] == sorted([head_node, worker_node]), "the user's cluster lost a node"
    actors = out["actors"]
    assert actors and all(a["state"] == "DEAD" for a in actors), f"actors left alive: {actors}"
    workers = [a for a in actors if a["cls"].endswith("Worker")]
    assert len(workers) == 2 and {a["node"] for a in workers} == {worker_node}, workers
    units = [a for a in actors if a["cls"].endswith("SimpleStorageUnit")]
    assert sorted(a["node"] for a in units) == sorted([head_node, worker_node]), units
    assert [a["cls"] for a in actors if a["cls"].endswith("TransferQueueController")]
