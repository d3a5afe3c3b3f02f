"""Ray start-up rules that need no Ray: address grammar, join-target resolution, the join
diagnostics' messages, the CPU budget check, the cluster config and the worker actor options.

What this file isolates: no Ray process is started. The probe test opens a real TCP connection
to a loopback port nothing listens on; the auth messages are built from explicit environments
(Ray's own authentication failure is exercised against real clusters in
``tests/e2e/test_cluster.py``).
"""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_dp.config.cluster import ClusterConfig
from nemo_dp.distributed import ray_init
from nemo_dp.distributed.ray_init import (
    ClusterConnectError,
    JoinTarget,
    default_private_temp_dir,
    init_ray,
    parse_cluster_address,
    ray_address_file,
    resolve_join_target,
)
from nemo_dp.distributed.worker_group import RayCluster, worker_actor_options

REPO_ROOT = Path(__file__).resolve().parents[2]


def _dead_port() -> int:
    """A loopback port that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- address grammar ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "local", " local "])
def test_local_forms(value: str | None) -> None:
    parsed = parse_cluster_address(value)
    assert parsed.local and not parsed.auto and parsed.host is None


def test_auto_and_explicit_forms() -> None:
    assert parse_cluster_address("auto").auto
    explicit = parse_cluster_address("10.0.0.5:6379")
    assert (explicit.host, explicit.port, explicit.local, explicit.auto) == ("10.0.0.5", 6379, False, False)
    v6 = parse_cluster_address("[::1]:6380")
    assert (v6.host, v6.port) == ("::1", 6380)


@pytest.mark.parametrize("value", ["", "head", "head:", ":6379", "head:0", "head:70000", "head:port"])
def test_malformed_addresses_name_the_accepted_forms(value: str) -> None:
    with pytest.raises(ValueError, match="is not 'local', 'auto' or '<host>:<port>'"):
        parse_cluster_address(value)


def test_ray_client_url_is_refused_with_the_alternative() -> None:
    with pytest.raises(ValueError, match="ray job submit --working-dir"):
        parse_cluster_address("ray://head:10001")


# -- config ------------------------------------------------------------------------------------


def test_cluster_config_names_the_bad_key() -> None:
    with pytest.raises(ValueError, match=r"^cluster.address: 'nowhere' is not"):
        ClusterConfig(address="nowhere")
    with pytest.raises(ValueError, match=r"^cluster.num_cpus: must be >= 1"):
        ClusterConfig(num_cpus=0)
    with pytest.raises(ValueError, match=r"^cluster.connect_timeout_s"):
        ClusterConfig(connect_timeout_s=0)
    with pytest.raises(ValueError, match=r"^cluster.policy_resources.CPU: 'CPU' is not a custom"):
        ClusterConfig(policy_resources={"CPU": 1.0})
    with pytest.raises(ValueError, match=r"^cluster.policy_resources.node_b: must be > 0"):
        ClusterConfig(policy_resources={"node_b": 0.0})
    with pytest.raises(ValueError, match=r"^cluster.working_dir"):
        ClusterConfig(working_dir=" ")


def test_cluster_config_is_local() -> None:
    assert ClusterConfig().is_local
    assert ClusterConfig(address="local").is_local
    assert not ClusterConfig(address="auto").is_local
    assert not ClusterConfig(address="127.0.0.1:6379").is_local


# -- join target resolution --------------------------------------------------------------------


def test_explicit_address_is_joined_as_given() -> None:
    target = resolve_join_target(parse_cluster_address("127.0.0.1:7000"), {"RAY_ADDRESS": "1.2.3.4:1"})
    assert target == JoinTarget("127.0.0.1:7000", "cluster.address", "127.0.0.1:7000")


def test_auto_prefers_ray_address(tmp_path: Path) -> None:
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:9999")
    env = {"RAY_ADDRESS": "127.0.0.1:7001", "RAY_TMPDIR": str(tmp_path)}
    target = resolve_join_target(parse_cluster_address("auto"), env)
    assert (target.address, target.source, target.ray_address) == ("127.0.0.1:7001", "RAY_ADDRESS", "auto")


def test_auto_reads_the_address_file(tmp_path: Path) -> None:
    env = {"RAY_TMPDIR": str(tmp_path)}
    path = ray_address_file(env)
    assert path == tmp_path / "ray" / "ray_current_cluster"
    path.parent.mkdir()
    path.write_text("127.0.0.1:7002\n")
    target = resolve_join_target(parse_cluster_address("auto"), env)
    assert (target.address, target.source, target.from_file) == ("127.0.0.1:7002", str(path), True)


def test_auto_with_nothing_to_join_says_where_it_looked(tmp_path: Path) -> None:
    env = {"RAY_TMPDIR": str(tmp_path)}
    with pytest.raises(ClusterConnectError) as info:
        resolve_join_target(parse_cluster_address("auto"), env)
    err = info.value
    assert err.reason == ClusterConnectError.NOTHING_RUNNING and err.address is None
    text = str(err)
    assert str(tmp_path / "ray" / "ray_current_cluster") in text
    assert "does not exist" in text and "ray start --head" in text and "cluster=local" in text


def test_auto_with_garbage_address_file_is_stale(tmp_path: Path) -> None:
    env = {"RAY_TMPDIR": str(tmp_path)}
    ray_address_file(env).parent.mkdir()
    ray_address_file(env).write_text("not an address")
    with pytest.raises(ClusterConnectError) as info:
        resolve_join_target(parse_cluster_address("auto"), env)
    assert info.value.reason == ClusterConnectError.STALE_ADDRESS_FILE
    assert f"rm {ray_address_file(env)}" in str(info.value)


def test_auto_with_unusable_ray_address() -> None:
    with pytest.raises(ClusterConnectError, match="RAY_ADDRESS='ray://h:1'"):
        resolve_join_target(parse_cluster_address("auto"), {"RAY_ADDRESS": "ray://h:1"})


# -- probe -------------------------------------------------------------------------------------


def test_probe_of_a_dead_explicit_address_is_nothing_running() -> None:
    port = _dead_port()
    target = JoinTarget(f"127.0.0.1:{port}", "cluster.address", f"127.0.0.1:{port}")
    with pytest.raises(ClusterConnectError) as info:
        ray_init._probe(target, 2.0)
    err = info.value
    assert (err.reason, err.address, err.source) == (
        ClusterConnectError.NOTHING_RUNNING,
        f"127.0.0.1:{port}",
        "cluster.address",
    )
    assert f"cluster.address=127.0.0.1:{port}" in str(err)
    assert f"ray start --head --port={port}" in str(err)


def test_probe_of_a_dead_address_from_the_file_is_stale(tmp_path: Path) -> None:
    port = _dead_port()
    source = str(tmp_path / "ray" / "ray_current_cluster")
    with pytest.raises(ClusterConnectError) as info:
        ray_init._probe(JoinTarget(f"127.0.0.1:{port}", source, "auto"), 2.0)
    assert info.value.reason == ClusterConnectError.STALE_ADDRESS_FILE
    assert f"rm {source}" in str(info.value) and "stale" in str(info.value)


def test_probe_of_a_live_port_passes() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        ray_init._probe(JoinTarget(f"127.0.0.1:{port}", "cluster.address", ""), 2.0)


# -- auth messages -----------------------------------------------------------------------------


def test_auth_error_without_token_mode_is_missing(tmp_path: Path) -> None:
    target = JoinTarget("10.0.0.1:6379", "cluster.address", "10.0.0.1:6379")
    err = ray_init._auth_error(target, {"HOME": str(tmp_path)}, "denied")
    assert err.reason == ClusterConnectError.AUTH_TOKEN_MISSING
    text = str(err)
    assert "RAY_AUTH_MODE is unset" in text and "RAY_AUTH_MODE=token" in text
    assert "RAY_AUTH_TOKEN=<token>" in text and "RAY_AUTH_TOKEN_PATH" in text


def test_auth_error_with_a_token_is_rejected(tmp_path: Path) -> None:
    target = JoinTarget("10.0.0.1:6379", "cluster.address", "10.0.0.1:6379")
    token = tmp_path / "tok"
    token.write_text("abc")
    env = {"HOME": str(tmp_path), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    err = ray_init._auth_error(target, env, "denied")
    assert err.reason == ClusterConnectError.AUTH_TOKEN_REJECTED
    assert f"RAY_AUTH_TOKEN_PATH={token}" in str(err)


def test_auth_error_with_token_mode_but_no_token_is_missing(tmp_path: Path) -> None:
    target = JoinTarget("10.0.0.1:6379", "cluster.address", "10.0.0.1:6379")
    env = {"HOME": str(tmp_path), "RAY_AUTH_MODE": "token"}
    err = ray_init._auth_error(target, env, "denied")
    assert err.reason == ClusterConnectError.AUTH_TOKEN_MISSING
    assert "no auth token was found" in str(err)


def test_unknown_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown reason"):
        ClusterConnectError("x", address=None, source="s", reason="bogus")


# -- budget, temp dir, layering ----------------------------------------------------------------


def test_budget_is_checked_before_ray_starts() -> None:
    with pytest.raises(ValueError, match=r"cluster.num_cpus=1 is too small.*reserve 2 logical CPUs"):
        init_ray(num_cpus=1, reserved_cpus=2)


def test_private_temp_dir_is_not_rays_default(tmp_path: Path) -> None:
    env = {"RAY_TMPDIR": str(tmp_path)}
    private = default_private_temp_dir(env)
    assert private.parent == tmp_path and private != ray_address_file(env).parent


def test_ray_init_imports_nothing_above_distributed() -> None:
    tree = ast.parse((REPO_ROOT / "nemo_dp" / "distributed" / "ray_init.py").read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    } | {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    # utils sits on the bottom layer beside distributed (the worker setup hook lives there)
    assert not [
        m
        for m in imported
        if m.startswith("nemo_dp") and not m.startswith(("nemo_dp.distributed", "nemo_dp.utils"))
    ]
    code = (
        "import sys, nemo_dp.distributed.ray_init, nemo_dp.config.cluster; "
        "print(sorted(m for m in sys.modules if m.startswith('nemo_dp.data_plane') or m == 'ray'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert out.stdout.strip() == "[]"


# -- worker actor options ----------------------------------------------------------------------


def test_worker_actor_options() -> None:
    assert worker_actor_options(RayCluster()) == {"num_cpus": 0}
    opts = worker_actor_options(RayCluster(env_vars={"A": "1"}, worker_resources={"node_b": 0.5}))
    assert opts == {"num_cpus": 0, "runtime_env": {"env_vars": {"A": "1"}}, "resources": {"node_b": 0.5}}
    with pytest.raises(ValueError, match="cluster.policy_resources.GPU"):
        worker_actor_options(RayCluster(worker_resources={"GPU": 1.0}))


def test_ipv6_head_is_kept_bracketed() -> None:
    target = resolve_join_target(parse_cluster_address("[::1]:6380"), {})
    assert target.address == "[::1]:6380"
