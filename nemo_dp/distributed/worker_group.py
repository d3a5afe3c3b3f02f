"""A group of Ray actors forming one torch.distributed (gloo) data-parallel group (Ray imported lazily)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RayCluster", "RayWorkerGroup", "find_free_port", "node_ip_address", "worker_actor_options"]

_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


@dataclass
class RayCluster:
    """What a worker group needs to know about the (already started) Ray cluster; ``collective_timeout_s`` bounds
    the gloo rendezvous and each collective, ``worker_resources`` (``cluster.policy_resources``) go to every worker."""

    env_vars: dict[str, str] = field(default_factory=dict)
    collective_timeout_s: float = 120.0
    worker_resources: dict[str, float] = field(default_factory=dict)


def worker_actor_options(cluster: RayCluster) -> dict[str, Any]:
    """The ``ActorClass.options`` of every worker: ``num_cpus=0`` (the CPUs belong to the data plane's
    actors), placement only from ``cluster.worker_resources`` (ValueError unless positive custom ones)."""
    options: dict[str, Any] = {"num_cpus": 0}
    if cluster.env_vars:
        options["runtime_env"] = {"env_vars": dict(cluster.env_vars)}
    for name, amount in cluster.worker_resources.items():
        if name in _BUILTIN_RESOURCES or not float(amount) > 0:
            raise ValueError(
                f"cluster.policy_resources.{name}: must be a custom resource with an amount > 0, got {amount!r}"
            )
    if cluster.worker_resources:
        options["resources"] = {str(name): float(amount) for name, amount in cluster.worker_resources.items()}
    return options


def find_free_port() -> int:
    """A TCP port that was free a moment ago on this host (for the gloo rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def node_ip_address() -> str:
    """The IP address other Ray nodes reach this process at (``127.0.0.1`` outside Ray)."""
    with contextlib.suppress(Exception):  # Ray missing or not reachable
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    return "127.0.0.1"


def _check_resources_exist(wanted: Mapping[str, float], world_size: int, name_prefix: str) -> None:
    """Fail now, naming the key, if the alive nodes cannot host the group (else start-up hangs)."""
    import ray

    totals: dict[str, float] = {}
    for node in ray.nodes():
        if node.get("Alive"):
            for name, amount in node.get("Resources", {}).items():
                totals[name] = totals.get(name, 0.0) + float(amount)
    for name, amount in wanted.items():
        need = float(amount) * world_size
        if totals.get(name, 0.0) < need:
            custom = sorted(k for k in totals if k not in _BUILTIN_RESOURCES
                            and not k.startswith(("node:", "accelerator_type")))
            raise ValueError(
                f"cluster.policy_resources.{name}={amount:g}: {world_size} workers of group "
                f"{name_prefix!r} need {need:g} of resource {name!r} in all, but the alive nodes "
                f"offer {totals.get(name, 0.0):g} (custom resources there: {custom}). Start the "
                f"target nodes with `ray start --resources='{{\"{name}\": {max(need, 1):g}}}'` "
                "or change cluster.policy_resources"
            )


class RayWorkerGroup:
    """``world_size`` Ray actors of ``worker_cls`` (plain, undecorated) joined in one gloo process group.

    Each actor is ``worker_cls(rank=r, world_size=n, **init_kwargs)`` and provides
    ``collective_address() -> (host, port)`` (called on rank 0), ``init_collective(host, port,
    timeout_s)`` (called on every rank concurrently) and ``shutdown()``.

    RuntimeError if Ray is not initialised; ValueError if ``world_size`` < 1 or
    ``cluster.worker_resources`` is invalid or offered by no alive nodes.
    """

    def __init__(
        self,
        worker_cls: type,
        *,
        world_size: int,
        init_kwargs: Mapping[str, Any],
        cluster: RayCluster,
        name_prefix: str = "worker",
    ) -> None:
        import ray

        if world_size < 1:
            raise ValueError(f"RayWorkerGroup: world_size must be >= 1, got {world_size}")
        if not ray.is_initialized():
            raise RuntimeError("RayWorkerGroup: Ray is not initialised; call init_ray() first")
        self.world_size = world_size
        self.name_prefix = name_prefix
        remote_cls = ray.remote(worker_cls)
        options = worker_actor_options(cluster)
        if cluster.worker_resources:
            _check_resources_exist(cluster.worker_resources, world_size, name_prefix)
        self.workers = [
            remote_cls.options(**options).remote(rank=rank, world_size=world_size, **dict(init_kwargs))
            for rank in range(world_size)
        ]
        try:
            host, port = ray.get(self.workers[0].collective_address.remote())
            ray.get([w.init_collective.remote(host, port, cluster.collective_timeout_s) for w in self.workers])
        except BaseException:
            self._kill()
            raise

    def run_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every rank with the same arguments; return the results in rank order."""
        import ray

        return ray.get([getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def run_sharded(self, method: str, shards: Sequence[Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Like :meth:`run_all`, but rank ``r`` gets ``shards[r]`` first (ValueError unless one per rank)."""
        import ray

        if len(shards) != self.world_size:
            raise ValueError(f"{self.name_prefix}.{method}: got {len(shards)} shards for {self.world_size} workers")
        return ray.get([getattr(w, method).remote(s, *args, **kwargs) for w, s in zip(self.workers, shards)])

    def run_rank(self, rank: int, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` on one rank only (no collective may be involved) and return its result."""
        import ray

        return ray.get(getattr(self.workers[rank], method).remote(*args, **kwargs))

    def _kill(self) -> None:
        import ray

        for w in self.workers:
            with contextlib.suppress(Exception):  # the actor is already gone
                ray.kill(w, no_restart=True)
        self.workers = []

    def shutdown(self) -> None:
        """Let every worker leave its process group, then kill the actors (idempotent)."""
        import ray

        if not self.workers:
            return
        with contextlib.suppress(Exception):  # best effort; the actors are killed next anyway
            ray.get([w.shutdown.remote() for w in self.workers], timeout=30)
        self._kill()
