"""``cluster`` config: where Ray runs, its CPU budget, and where the policy workers go."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from nemo_dp.utils.config_checks import Checked, at_least_field, fail, positive_field
from nemo_dp.distributed.ray_init import parse_cluster_address

__all__ = ["ClusterConfig", "RESERVED_RESOURCE_NAMES"]

#: Resource names Ray handles through dedicated actor options, refused in ``cluster.policy_resources``.
RESERVED_RESOURCE_NAMES: tuple[str, ...] = ("CPU", "GPU", "memory", "object_store_memory")


@dataclass
class ClusterConfig(Checked, key="cluster"):
    """``cluster``: a private Ray for the run, or a running cluster to join.

    Attributes:
        address: ``None`` or ``"local"``: a private Ray for this run only (``RAY_ADDRESS`` ignored).
            ``"auto"``: join the cluster named by ``RAY_ADDRESS``, else by ``ray start``'s address
            file. ``"<host>:<port>"``: join that head (GCS).
        num_cpus, temp_dir: Of the private Ray (``temp_dir`` ``None``: a per-user ``nemo_dp_ray_<uid>``
            under the system temp directory).
        working_dir: Shipped to every worker through Ray's ``runtime_env``; ``None`` ships nothing.
        policy_resources: Custom Ray resources every policy worker requests, e.g. ``{node_b: 0.5}``.
    """

    address: Optional[str] = None
    num_cpus: int = at_least_field(2, 1)
    temp_dir: Optional[str] = None
    connect_timeout_s: float = positive_field(15.0)
    working_dir: Optional[str] = None
    policy_resources: dict[str, float] = field(default_factory=dict)

    def check(self) -> None:
        if self.address is not None:
            try:
                parse_cluster_address(self.address)
            except ValueError as exc:
                fail("cluster.address", str(exc))
        for key in ("temp_dir", "working_dir"):
            if getattr(self, key) is not None and not str(getattr(self, key)).strip():
                fail(f"cluster.{key}", "must be a non-empty path or null")
        for name, amount in dict(self.policy_resources).items():
            key = f"cluster.policy_resources.{name}"
            if not str(name).strip():
                fail("cluster.policy_resources", "resource names must be non-empty")
            if name in RESERVED_RESOURCE_NAMES:
                fail(
                    key,
                    f"{name!r} is not a custom resource; policy workers request num_cpus=0 on "
                    "purpose (the CPU budget belongs to the data plane's actors). Start the "
                    "target nodes with a custom resource (ray start --resources='{\"node_b\": 1}') "
                    "and request that instead",
                )
            if not float(amount) > 0:
                fail(key, f"must be > 0, got {amount!r}")

    @property
    def is_local(self) -> bool:
        """Whether the run starts its own private Ray (``address`` is ``None`` or ``"local"``)."""
        return parse_cluster_address(self.address).local
