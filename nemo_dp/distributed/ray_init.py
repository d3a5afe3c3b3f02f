"""Start (or join) Ray the one way every nemo_dp entry point needs it.

Why this module exists: TransferQueue reads its ``TQ_*`` knobs once, at import, in every process,
including its own controller and storage actors, which only see them through Ray's
``runtime_env``.  The knobs must therefore be exported *before* ``ray.init`` and handed to Ray as
job-wide environment variables.  The TransferQueue controller and each of its storage units also
reserve one logical CPU each, so a Ray started with too few CPUs makes the library's start-up
block forever instead of failing.  Tests, benchmarks and the training launcher all go through
:func:`init_ray` so that both traps are handled in one place.

nemo_dp's own actors are expected to request ``num_cpus=0``: the CPU budget checked here is for
the library's actors only.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["init_ray", "shutdown_ray", "ray_session", "required_cpus", "QUIET_RAY_ENV"]

_LOG = logging.getLogger(__name__)

#: Environment knobs set (only when absent) before Ray starts.
#: * ``RAY_USAGE_STATS_ENABLED=0``: Ray otherwise tries to report usage statistics over the
#:   network at start-up; the training hosts are often offline and the attempt only adds noise.
#: Ray's token authentication (on by default in Ray 2.60, it writes ``~/.ray/auth_token`` and
#: logs one line) is deliberately left enabled: it is the only authentication this stack has on
#: Ray's own ports (TransferQueue's ports have none, see the data-plane docs).
QUIET_RAY_ENV: dict[str, str] = {"RAY_USAGE_STATS_ENABLED": "0"}


def required_cpus(data_plane_cfg: Any) -> int:
    """Logical CPUs the data-plane backend's own actors reserve in Ray.

    Args:
        data_plane_cfg: Any accepted ``data_plane`` form (``None``, dataclass, mapping,
            ``DictConfig``).

    Returns:
        ``1 + num_storage_units`` for an enabled TransferQueue data plane (controller plus one
        CPU per storage unit), else ``0``.

    Raises:
        ValueError: The config is invalid (propagated from the factory's coercion).
    """
    from nemo_dp.data_plane.factory import coerce_data_plane_config
    from nemo_dp.data_plane.interfaces import DataPlaneConfig

    dp_cfg = coerce_data_plane_config(data_plane_cfg)
    if not isinstance(dp_cfg, DataPlaneConfig) or not dp_cfg.enabled:
        return 0
    return 1 + int(dp_cfg.simple.num_storage_units)


def _budget_error(num_cpus: float, needed: int) -> ValueError:
    return ValueError(
        f"cluster.num_cpus={num_cpus:g} is too small for the TransferQueue data plane: its "
        f"controller and each of data_plane.simple.num_storage_units={needed - 1} storage units "
        f"reserve 1 logical CPU in Ray, so at least {needed} are needed (otherwise the "
        "library's start-up blocks forever). Raise cluster.num_cpus or lower "
        "data_plane.simple.num_storage_units; nemo_dp's own actors use num_cpus=0."
    )


def init_ray(
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    data_plane_cfg: Any = None,
    extra_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Export the data-plane knobs, check the CPU budget and start (or join) Ray.

    Args:
        address: Ray cluster to join (e.g. ``"auto"``); ``None`` starts a local Ray.
        num_cpus: Logical CPUs of a local Ray (ignored when joining ``address``); ``None`` lets
            Ray count the machine's cores.
        data_plane_cfg: The ``data_plane`` config (any accepted form) whose knobs the job needs.
        extra_env: More environment variables for every Ray worker of the job.

    Returns:
        The environment passed to every worker via ``runtime_env`` (data-plane knobs plus
        ``extra_env``).

    Raises:
        ValueError: The CPU budget cannot host the data-plane actors (names ``cluster.num_cpus``
            and ``data_plane.simple.num_storage_units``), or the config is invalid.
        RuntimeError: Ray is already initialised in this process, or a knob is missing while
            ``transfer_queue`` is already imported.
    """
    from nemo_dp.data_plane.factory import maybe_configure_data_plane_env

    needed = required_cpus(data_plane_cfg)
    if address is None and num_cpus is not None and num_cpus < needed:
        raise _budget_error(num_cpus, needed)

    import ray

    if ray.is_initialized():
        raise RuntimeError(
            "Ray is already initialised in this process; call shutdown_ray() first "
            "(the data-plane knobs must reach every worker through runtime_env at ray.init)"
        )
    # Must run before ray.init and before anything imports transfer_queue.
    env_vars = dict(maybe_configure_data_plane_env(data_plane_cfg))
    if extra_env:
        env_vars.update({str(k): str(v) for k, v in extra_env.items()})
    for key, value in QUIET_RAY_ENV.items():
        os.environ.setdefault(key, value)

    init_kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": logging.WARNING,
    }
    if env_vars:
        init_kwargs["runtime_env"] = {"env_vars": env_vars}
    if address is None:
        init_kwargs["num_cpus"] = num_cpus
    else:
        init_kwargs["address"] = address
    ray.init(**init_kwargs)

    if needed:
        total = float(ray.cluster_resources().get("CPU", 0.0))
        if total < needed:
            ray.shutdown()
            raise _budget_error(total, needed)
    return env_vars


def shutdown_ray() -> None:
    """Shut Ray down in this process if it is running (idempotent)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


@contextlib.contextmanager
def ray_session(
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    data_plane_cfg: Any = None,
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[dict[str, str]]:
    """``init_ray`` for the duration of a ``with`` block; Ray is shut down in ``finally``.

    Args:
        address: As in :func:`init_ray`.
        num_cpus: As in :func:`init_ray`.
        data_plane_cfg: As in :func:`init_ray`.
        extra_env: As in :func:`init_ray`.

    Yields:
        The environment dict returned by :func:`init_ray`.
    """
    env = init_ray(
        address=address, num_cpus=num_cpus, data_plane_cfg=data_plane_cfg, extra_env=extra_env
    )
    try:
        yield env
    finally:
        shutdown_ray()
