"""Ray worker processes drop torch's ``is_fx_tracing`` notice, and only that notice.

``nemo_dp.distributed.ray_init.init_ray`` sets Ray's ``worker_process_setup_hook`` to
``nemo_dp.utils.noise.install_known_log_filters``; the tier's session Ray is started by
``init_ray``, so every worker of this session runs the hook.  Each probe below runs in a Ray
worker (a task, an actor, and an actor started with its own ``env_vars`` the way the policy
workers are), never installs a filter itself, and captures what the worker writes to its stderr
(file descriptor 2, which Ray forwards to the driver's console) while torch emits the notice
through its real code path and two other warnings are logged.  A control in the same worker
removes the installed filter and emits again: the notice must then appear, so the check cannot
pass because the capture misses it.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(300)

FX_NOTICE = "is_fx_tracing will return true for both fx.symbolic_trace and torch.export"
FX_LOGGER = "torch.fx._symbolic_trace"
SAME_LOGGER_MARKER = "worker-noise probe: another warning on torch's fx logger"
OTHER_LOGGER_MARKER = "worker-noise probe: a warning of nemo_dp"


def _stderr_during(fn: Callable[[], None]) -> str:
    """What this process writes to file descriptor 2 while ``fn`` runs."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            fn()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        return tmp.read().decode("utf-8", errors="replace")


def _emit() -> None:
    """torch's notice through its real trigger, then two warnings that must stay visible."""
    import torch
    from torch.fx import _symbolic_trace

    # torch logs the notice once per process (an lru_cache); forget that it did.
    _symbolic_trace.is_fx_tracing_warning.cache_clear()
    torch.nested.nested_tensor_from_jagged(torch.arange(6.0), torch.tensor([0, 2, 6]))
    logging.getLogger(FX_LOGGER).warning(SAME_LOGGER_MARKER)
    logging.getLogger("nemo_dp.worker_noise_probe").warning(OTHER_LOGGER_MARKER)


def probe() -> dict[str, Any]:
    """Run in a Ray worker: the filter the hook installed, and stderr with and without it."""
    from nemo_dp.utils.noise import DropFxTracingNotice

    fx_logger = logging.getLogger(FX_LOGGER)
    installed = [f for f in fx_logger.filters if isinstance(f, DropFxTracingNotice)]
    silenced = _stderr_during(_emit)
    for f in installed:
        fx_logger.removeFilter(f)
    try:
        unfiltered = _stderr_during(_emit)
    finally:
        for f in installed:
            fx_logger.addFilter(f)
    return {"pid": os.getpid(), "installed": len(installed), "silenced": silenced, "unfiltered": unfiltered}


def _run_probe(kind: str) -> dict[str, Any]:
    import ray

    if kind == "task":
        return ray.get(ray.remote(num_cpus=0)(probe).remote(), timeout=180)

    class Probe:
        def run(self) -> dict[str, Any]:
            return probe()

    options: dict[str, Any] = {"num_cpus": 0}
    if kind == "actor_with_env_vars":
        options["runtime_env"] = {"env_vars": {"NEMO_DP_WORKER_NOISE_PROBE": "1"}}
    actor = ray.remote(Probe).options(**options).remote()
    try:
        return ray.get(actor.run.remote(), timeout=180)
    finally:
        ray.kill(actor)


@pytest.mark.parametrize("kind", ["task", "actor", "actor_with_env_vars"])
def test_worker_drops_the_fx_notice_and_keeps_other_warnings(ray_cluster: dict[str, str], kind: str) -> None:
    out = _run_probe(kind)
    assert out["pid"] != os.getpid()
    assert out["installed"] == 1, out  # the setup hook installed it before the probe ran, once
    assert FX_NOTICE not in out["silenced"], out["silenced"]
    assert SAME_LOGGER_MARKER in out["silenced"], out["silenced"]
    assert OTHER_LOGGER_MARKER in out["silenced"], out["silenced"]
    # Control: without the filter the same capture shows the notice.
    assert FX_NOTICE in out["unfiltered"], out["unfiltered"]
    assert SAME_LOGGER_MARKER in out["unfiltered"], out["unfiltered"]
