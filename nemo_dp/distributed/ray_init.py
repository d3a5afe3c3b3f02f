"""Start a private Ray for a run (own temp dir, ``RAY_ADDRESS`` ignored), or join a running cluster.

A join failure is one :class:`ClusterConnectError` that names the fix."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_dp.utils.noise import WORKER_SETUP_HOOK

__all__ = [
    "init_ray",
    "check_cpu_budget",
    "shutdown_ray",
    "ray_session",
    "ClusterAddress",
    "ClusterConnectError",
    "JoinTarget",
    "parse_cluster_address",
    "resolve_join_target",
    "default_private_temp_dir",
    "ray_address_file",
    "QUIET_RAY_ENV",
    "WORKER_SETUP_HOOK",
]

#: Environment knobs set (only when absent) before Ray starts. Ray's token authentication is
#: deliberately left on: it is the only authentication this stack has on Ray's own ports.
QUIET_RAY_ENV: dict[str, str] = {"RAY_USAGE_STATS_ENABLED": "0"}

#: Ray's token-authentication variables: the mode, the token, a file holding it (else ``~/.ray/auth_token``).
_AUTH_MODE_ENV = "RAY_AUTH_MODE"
_AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"
_AUTH_TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"

_FIX_LOCAL = "or run with cluster=local (a private Ray for this run)"


@dataclass(frozen=True)
class ClusterAddress:
    """A parsed ``cluster.address``: ``local`` (a private Ray), ``auto``, or the head's ``host``/GCS ``port``."""

    raw: str | None
    local: bool = False
    auto: bool = False
    host: str | None = None
    port: int | None = None


def parse_cluster_address(address: str | None) -> ClusterAddress:
    """Parse ``cluster.address``: ``None``/``"local"``, ``"auto"`` or ``"<host>:<port>"``; ValueError (saying what
    is accepted) for anything else, e.g. a Ray Client ``ray://`` URL."""
    if address is None or address.strip() == "local":
        return ClusterAddress(raw=address, local=True)
    text = address.strip()
    if text == "auto":
        return ClusterAddress(raw=address, auto=True)
    if "://" in text:
        raise ValueError(
            f"{text!r} is a Ray Client (or dashboard) URL; nemo_dp joins a cluster through its "
            "head's GCS address '<host>:<port>' (printed by `ray start --head`, port 6379 by "
            "default), or 'auto' on a machine of the cluster. To run from outside the cluster, "
            "submit the launcher with `ray job submit --working-dir . -- python launchers/launch.py "
            "cluster=auto ...`"
        )
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(
            f"{text!r} is not 'local', 'auto' or '<host>:<port>' with a port in 1..65535 "
            "(e.g. 127.0.0.1:6379)"
        )
    return ClusterAddress(raw=address, host=host, port=int(port_text))


def _host_port(host: str | None, port: int | None) -> str:
    return f"[{host}]:{port}" if host and ":" in host else f"{host}:{port}"


def _system_temp_dir(environ: Mapping[str, str] | None) -> Path:
    """The base of Ray's default temp dir: ``RAY_TMPDIR`` or ``TMPDIR`` or ``/tmp`` (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    return Path(env.get("RAY_TMPDIR") or env.get("TMPDIR") or "/tmp")


def ray_address_file(environ: Mapping[str, str] | None = None) -> Path:
    """The address file ``ray start --head`` writes and ``ray.init(address="auto")`` reads."""
    return _system_temp_dir(environ) / "ray" / "ray_current_cluster"


def default_private_temp_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where a private Ray keeps its sessions unless ``cluster.temp_dir`` says otherwise: next to Ray's default,
    so a private Ray never moves the ``session_latest`` link of a cluster using Ray's default."""
    return _system_temp_dir(environ) / f"nemo_dp_ray_{os.getuid()}"


class ClusterConnectError(ConnectionError):
    """A Ray cluster named by ``cluster.address`` could not be joined; the message says why and the fix.

    ``address``: the ``<host>:<port>`` tried (``None`` if none was found); ``source``: as in :class:`JoinTarget`."""

    REASONS: tuple[str, ...] = (
        "nothing_running", "stale_address_file", "auth_token_missing", "auth_token_rejected", "join_failed"
    )
    NOTHING_RUNNING, STALE_ADDRESS_FILE, AUTH_TOKEN_MISSING, AUTH_TOKEN_REJECTED, JOIN_FAILED = REASONS

    def __init__(self, message: str, *, address: str | None = None, source: str, reason: str) -> None:
        if reason not in self.REASONS:
            raise ValueError(f"ClusterConnectError: unknown reason {reason!r}")
        super().__init__(message)
        self.address = address
        self.source = source
        self.reason = reason


@dataclass(frozen=True)
class JoinTarget:
    """The head's GCS ``address`` a join will try, its ``source`` (``"cluster.address"``, ``"RAY_ADDRESS"``
    or the address file's path) and the ``ray_address`` for ``ray.init`` (``"auto"`` keeps Ray's
    token handling for a cluster found on this machine).
    """

    address: str
    source: str
    ray_address: str

    @property
    def from_file(self) -> bool:
        return self.source not in ("cluster.address", "RAY_ADDRESS")

    def describe(self) -> str:
        if self.source == "cluster.address":
            return f"cluster.address={self.address}"
        origin = f"the address file {self.source}" if self.from_file else "RAY_ADDRESS"
        return f"{self.address} (from {origin}, used by cluster.address=auto)"

    def error(self, why: str, reason: str) -> ClusterConnectError:
        message = f"Could not join the Ray cluster at {self.describe()}: {why}"
        return ClusterConnectError(message, address=self.address, source=self.source, reason=reason)


def resolve_join_target(address: ClusterAddress, environ: Mapping[str, str] | None = None) -> JoinTarget:
    """Find the head a join should try, in Ray's order: ``RAY_ADDRESS``, then the address file (unlike Ray's
    ``"auto"``, never a Ray found only by scanning processes: on a shared machine, usually somebody else's).

    ClusterConnectError when ``auto`` finds no address or ``RAY_ADDRESS`` is not ``<host>:<port>``;
    ValueError for a local ``address``."""
    env = os.environ if environ is None else environ
    if address.local:
        raise ValueError("resolve_join_target: a local cluster.address has no join target")
    if not address.auto:
        explicit = _host_port(address.host, address.port)
        return JoinTarget(address=explicit, source="cluster.address", ray_address=explicit)
    env_addr = (env.get("RAY_ADDRESS") or "").strip()
    if env_addr:
        try:
            parsed = parse_cluster_address(env_addr)
        except ValueError as exc:
            raise ClusterConnectError(
                f"cluster.address=auto uses RAY_ADDRESS={env_addr!r}, which nemo_dp cannot "
                f"join: {exc}. Fix: set RAY_ADDRESS to the head's '<host>:<port>', unset it to "
                f"use this machine's address file, {_FIX_LOCAL}.",
                source="RAY_ADDRESS",
                reason=ClusterConnectError.JOIN_FAILED,
            ) from None
        if parsed.local or parsed.auto:
            raise ClusterConnectError(
                f"cluster.address=auto uses RAY_ADDRESS={env_addr!r}, which names no cluster. "
                f"Fix: set RAY_ADDRESS to the head's '<host>:<port>' or unset it, {_FIX_LOCAL}.",
                source="RAY_ADDRESS",
                reason=ClusterConnectError.NOTHING_RUNNING,
            )
        found = _host_port(parsed.host, parsed.port)
        return JoinTarget(address=found, source="RAY_ADDRESS", ray_address="auto")
    path = ray_address_file(env)
    text = path.read_text().strip() if path.is_file() else ""
    if not text:
        raise ClusterConnectError(
            "cluster.address=auto found no Ray cluster to join: RAY_ADDRESS is unset and the "
            f"address file {path} that `ray start --head` writes "
            f"{'is empty' if path.is_file() else 'does not exist'} (nothing is running). "
            "Fix: start a cluster with `ray start --head --port=6379` on this machine, or set "
            f"cluster.address=<head-host>:<port> (or RAY_ADDRESS), {_FIX_LOCAL}.",
            source=str(path),
            reason=ClusterConnectError.NOTHING_RUNNING,
        )
    try:
        parsed = parse_cluster_address(text)
    except ValueError:
        parsed = ClusterAddress(raw=text, local=True)
    if parsed.host is None:
        raise ClusterConnectError(
            f"cluster.address=auto read {text!r} from the address file {path}, which is not a "
            f"'<host>:<port>' address. Fix: delete the file (`rm {path}`) and start the cluster "
            f"again with `ray start --head`, {_FIX_LOCAL}.",
            source=str(path),
            reason=ClusterConnectError.STALE_ADDRESS_FILE,
        )
    return JoinTarget(address=_host_port(parsed.host, parsed.port), source=str(path), ray_address="auto")


def _probe(target: JoinTarget, timeout_s: float) -> None:
    """Fail with a :class:`ClusterConnectError` unless something listens at the target."""
    host, _, port = target.address.rpartition(":")
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except socket.gaierror as exc:
        why = f"the host {host!r} cannot be resolved ({exc.strerror or exc})"
    except TimeoutError:
        why = f"nothing answered within cluster.connect_timeout_s={timeout_s:g}s"
    except OSError as exc:
        why = f"nothing answers there ({exc.strerror or exc})"
    if target.from_file:
        raise target.error(
            f"{why}. The address file is stale: it is left over from a cluster that stopped without "
            f"`ray stop`. Fix: start the cluster again (`ray start --head`), or delete the stale file "
            f"(`rm {target.source}`) and set cluster.address=<head-host>:<port>, {_FIX_LOCAL}.",
            ClusterConnectError.STALE_ADDRESS_FILE,
        )
    where = "RAY_ADDRESS" if target.source == "RAY_ADDRESS" else "cluster.address"
    raise target.error(
        f"{why}; no Ray head is running there. Fix: start it with `ray start --head --port={port}` "
        f"on {host}, or correct {where} (the head's GCS '<host>:<port>' printed by `ray start --head`), "
        f"{_FIX_LOCAL}.",
        ClusterConnectError.NOTHING_RUNNING,
    )


def _token_source(environ: Mapping[str, str]) -> str | None:
    """Where Ray would read an auth token from in this process (Ray's order), or ``None``."""
    if environ.get(_AUTH_TOKEN_ENV, "").strip():
        return f"the {_AUTH_TOKEN_ENV} environment variable"
    token_path = environ.get(_AUTH_TOKEN_PATH_ENV, "").strip()
    if token_path:
        p = Path(token_path).expanduser()
        return f"{_AUTH_TOKEN_PATH_ENV}={token_path}" if p.is_file() and p.read_text().strip() else None
    home = environ.get("HOME")
    default = (Path(home) if home else Path.home()) / ".ray" / "auth_token"
    return str(default) if default.is_file() and default.read_text().strip() else None


def _auth_error(target: JoinTarget, environ: Mapping[str, str], detail: str) -> ClusterConnectError:
    """Turn Ray's authentication failure into a message that says which token and how to fix."""
    mode = (environ.get(_AUTH_MODE_ENV) or "").strip().lower()
    source = _token_source(environ)
    how = (
        f"Fix: run with {_AUTH_MODE_ENV}=token and the cluster's token, from the head's "
        f"~/.ray/auth_token (`ray get-auth-token` prints it there), in {_AUTH_TOKEN_ENV}=<token> "
        f"or a file named by {_AUTH_TOKEN_PATH_ENV}=<file> (or in this machine's "
        "~/.ray/auth_token)"
    )
    if mode == "token" and source is not None:
        reason = ClusterConnectError.AUTH_TOKEN_REJECTED
        why = f"the cluster rejected the auth token read from {source} (it is not this cluster's token)"
    elif mode == "token":
        reason = ClusterConnectError.AUTH_TOKEN_MISSING
        why = f"{_AUTH_MODE_ENV}=token is set but no auth token was found"
    else:
        reason = ClusterConnectError.AUTH_TOKEN_MISSING
        why = (
            "the cluster requires token authentication and this process sends no token "
            f"({_AUTH_MODE_ENV} is {'unset' if not mode else repr(mode)}"
            + ("" if source is None else f"; a token exists in {source} but is not used without it")
            + ")"
        )
    return target.error(f"{why}. {how}, {_FIX_LOCAL}. (Ray: {detail})", reason)


def _check_auth(target: JoinTarget) -> None:
    """One authenticated GCS round trip: a token problem fails at once, typed, instead of after
    ``ray.init``'s ~20 s of retries ending in a bare "Failed to connect"."""
    from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    if target.ray_address == "auto":
        # As ray.init(address="auto") does first (a token found on this machine turns token
        # auth on), so that this check sees the mode the join will use.
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    try:
        GcsClient(address=target.address)
    except AuthenticationError as exc:
        raise _auth_error(target, os.environ, str(exc).strip()) from None
    except Exception as exc:  # noqa: BLE001 - e.g. RpcError: the port is not a Ray head
        raise _join_failed(target, exc) from exc


def _join_failed(target: JoinTarget, exc: BaseException) -> ClusterConnectError:
    import ray

    return target.error(
        f"something answers there but Ray could not join it ({type(exc).__name__}: {exc}). Fix: check "
        f"that the address is the head's GCS port printed by `ray start --head` and that this Ray "
        f"({ray.__version__}) matches the cluster's version, {_FIX_LOCAL}.",
        ClusterConnectError.JOIN_FAILED,
    )


def _budget_error(num_cpus: float, needed: int, reserved_by: str, *, joined: str | None = None) -> ValueError:
    where = f"cluster.num_cpus={num_cpus:g} is too small"
    if joined:
        where = f"the cluster at {joined} has {num_cpus:g} logical CPUs"
    why = f" ({reserved_by})" if reserved_by else ""
    return ValueError(
        f"{where}: the data plane's own actors reserve {needed} logical CPUs in Ray{why}, "
        "and with fewer the data plane's start-up blocks forever. Raise cluster.num_cpus (or "
        "the cluster's CPUs) or lower the data plane's actor count; nemo_dp's own actors use "
        "num_cpus=0."
    )


def check_cpu_budget(num_cpus: int | None, reserved_cpus: int, reserved_by: str = "") -> None:
    """Refuse a private Ray whose ``num_cpus`` (``None``: Ray counts the cores, passes) cannot host
    the data plane's own actors: ValueError naming ``cluster.num_cpus`` and ``reserved_by``."""
    if num_cpus is not None and num_cpus < reserved_cpus:
        raise _budget_error(num_cpus, reserved_cpus, reserved_by)


def init_ray(
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    reserved_cpus: int = 0,
    reserved_by: str = "",
    worker_env: Mapping[str, str] | None = None,
    temp_dir: str | os.PathLike[str] | None = None,
    connect_timeout_s: float = 15.0,
    working_dir: str | os.PathLike[str] | None = None,
    worker_setup_hook: str | None = WORKER_SETUP_HOOK,
) -> dict[str, str]:
    """Start a private Ray (``address`` ``None``/``"local"``) or join a running cluster; return ``worker_env``.

    The caller exports its data-plane knobs before calling and passes them as ``worker_env`` (given to every
    worker via ``runtime_env``).

    Args:
        address: ``None``/``"local"`` (a private Ray, whatever else runs on the machine), ``"auto"`` (the
            cluster ``RAY_ADDRESS`` or the machine's address file names) or ``"<host>:<port>"``.
        num_cpus, temp_dir: Of a private Ray (ignored when joining); ``None``: Ray counts the
            cores / :func:`default_private_temp_dir`.
        reserved_cpus: Logical CPUs the data plane's own actors reserve (checked after start too).
        working_dir: Shipped to every worker through ``runtime_env``, for nodes that lack the code.
        worker_setup_hook: Import path of a no-argument function every worker process of the job
            runs before its first task (default: ``nemo_dp.utils.noise``'s log filters; ``None``: none).

    Raises:
        ValueError: ``address`` is malformed, or the CPU budget cannot host the data plane's actors.
        ClusterConnectError: A cluster to join is missing, stale, or refuses the auth token.
        RuntimeError: Ray is already initialised in this process.
    """
    parsed = parse_cluster_address(address)
    if parsed.local:
        check_cpu_budget(num_cpus, reserved_cpus, reserved_by)

    import ray
    from ray._private import ray_constants

    if ray.is_initialized():
        raise RuntimeError(
            "Ray is already initialised in this process; call shutdown_ray() first "
            "(the workers' environment reaches them through runtime_env at ray.init)"
        )
    env_vars = {str(k): str(v) for k, v in (worker_env or {}).items()}
    for key, value in QUIET_RAY_ENV.items():
        os.environ.setdefault(key, value)
    # Stop this driver's ray.shutdown() from resetting SIGTERM to "terminate at once" (a SIGTERM
    # during teardown would kill it before it writes summary.json); read at ray.init.
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True

    runtime_env = {
        # A copy: Ray writes the setup hook's key into it in place; the caller's must stay as is.
        "env_vars": dict(env_vars) if env_vars else None,
        "working_dir": None if working_dir is None else str(working_dir),
        "worker_process_setup_hook": worker_setup_hook,
    }
    init_kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if any(v is not None for v in runtime_env.values()):
        init_kwargs["runtime_env"] = {k: v for k, v in runtime_env.items() if v is not None}

    target: JoinTarget | None = None
    if parsed.local:
        private = (Path(temp_dir) if temp_dir is not None else default_private_temp_dir()).expanduser().resolve()
        private.mkdir(parents=True, exist_ok=True)
        ray.init(address="local", num_cpus=num_cpus, _temp_dir=str(private), **init_kwargs)
    else:
        target = resolve_join_target(parsed)
        _probe(target, connect_timeout_s)
        _check_auth(target)
        try:
            ray.init(address=target.ray_address, **init_kwargs)
        except Exception as exc:  # noqa: BLE001 - every join failure becomes one typed error
            shutdown_ray()
            raise _join_failed(target, exc) from exc

    if reserved_cpus:
        total = float(ray.cluster_resources().get("CPU", 0.0))
        if total < reserved_cpus:
            ray.shutdown()
            raise _budget_error(total, reserved_cpus, reserved_by, joined=None if target is None else target.address)
    return env_vars


def shutdown_ray() -> None:
    """Shut Ray down in this process if it is running (idempotent)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


@contextlib.contextmanager
def ray_session(**init_kwargs: Any) -> Iterator[dict[str, str]]:
    """:func:`init_ray` for a ``with`` block, yielding its result; leaving it disconnects from a joined
    cluster (which keeps running) or stops the private Ray."""
    env = init_ray(**init_kwargs)
    try:
        yield env
    finally:
        shutdown_ray()
