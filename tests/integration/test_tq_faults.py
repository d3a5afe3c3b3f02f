"""Fault cases of the TransferQueue adapter, in a subprocess of their own.

The cases kill or over-commit parts of a TransferQueue system, so they run in a fresh Python
process with its own local Ray (``num_cpus=2``) and small timeouts exported *before* the library
is imported (its knobs are read at import), never on the tier's session cluster.  One process
runs every case in turn (each starts its own system and ends with it closed; a case that raises
is reported as that case's failure), which saves a Python and Ray start-up per case.  The
subprocess reports a JSON result line; it also lists its Ray child processes and waits, after
``ray.shutdown()``, until none is left, and the module re-checks those pids once the subprocess
has exited.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

pytestmark = pytest.mark.timeout(600)  # the first test waits for every case

# Small bounds: controller_s=3, storage_s=2, storage_max_attempts=1, storage_probe_s=1.
CONTROLLER_S = 3.0
STORAGE_S = 2.0
STORAGE_ATTEMPTS = 1
PROBE_S = 1.0
SLACK_S = 4.0

_SCRIPT = r"""
import json, os, sys, time, traceback
import psutil

cases = sys.argv[1:]


def wait_gone(pids, within_s, pause_s):
    # The processes of pids still running (not exited, not a zombie) after at most within_s.
    deadline = time.monotonic() + within_s
    while True:
        left = []
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{pid}:{proc.name()}")
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(pause_s)

from nemo_dp.data_plane.interfaces import DataPlaneConfig, SimpleStorageConfig, TimeoutsConfig


def cfg(**simple):
    params = {"num_storage_units": 1}
    params.update(simple)
    return DataPlaneConfig(
        simple=SimpleStorageConfig(**params),
        timeouts=TimeoutsConfig(controller_s=%(controller_s)r, storage_s=%(storage_s)r,
                                storage_max_attempts=%(attempts)r, storage_probe_s=%(probe_s)r,
                                startup_s=90.0),
    )


from nemo_dp.data_plane.registry import ray_start_args
from nemo_dp.distributed.ray_init import init_ray, shutdown_ray

result = {"cases": {}}
# Exports the small TQ_* knobs before anything imports transfer_queue.
result["env"] = init_ray(num_cpus=2, **ray_start_args(cfg()))
result["tq_imported_before_client"] = "transfer_queue" in sys.modules
children = []
try:
    import ray
    import torch
    from tensordict import TensorDict
    from nemo_dp.data_plane.interfaces import DataPlaneUnavailableError
    from nemo_dp.data_plane.adapters.transfer_queue import (
        CONTROLLER_NAME, CONTROLLER_NAMESPACE, STORAGE_UNIT_NAME_PREFIX, TQDataPlaneClient,
        tq_controller_exists,
    )

    def timed(fn):
        t0 = time.monotonic()
        try:
            fn()
        except Exception as exc:
            return {"error": type(exc).__name__, "unavailable": isinstance(exc, DataPlaneUnavailableError),
                    "message": str(exc)[:400], "elapsed": time.monotonic() - t0}
        return {"error": None, "elapsed": time.monotonic() - t0}

    ids = [f"s{i}" for i in range(4)]
    td = TensorDict({"x": torch.arange(8.0).view(4, 2)}, batch_size=[4])

    def kill_and_wait(handle):
        # ray.kill only sends the kill: calls made before the actor's process has exited may
        # still reach it and succeed.  Wait (at most 60 s) until the process is gone.
        pid = ray.get(handle.__ray_call__.remote(lambda self: os.getpid()), timeout=60)
        ray.kill(handle)
        if wait_gone([pid], within_s=60, pause_s=0.05):
            raise TimeoutError(f"killed actor process {pid} still runs after 60 s")

    def storage(r):
        c = TQDataPlaneClient(cfg())
        c.register_partition("p", ["x", "y"], 4, ["t"])
        c.put_samples(ids, "p", td)
        kill_and_wait(ray.get_actor(f"{STORAGE_UNIT_NAME_PREFIX}0"))
        r["get"] = timed(lambda: c.get_samples(ids, "p", ["x"]))
        r["put"] = timed(lambda: c.put_samples(ids, "p", TensorDict({"y": torch.zeros(4)}, batch_size=[4])))
        r["list_after"] = c.list_sample_ids("p")
        r["close"] = timed(c.close)
        r["controller_gone"] = not tq_controller_exists()

    def controller(r):
        c = TQDataPlaneClient(cfg())
        c.register_partition("p", ["x"], 4, ["t"])
        c.put_samples(ids, "p", td)
        kill_and_wait(ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE))
        r["list"] = timed(lambda: c.list_sample_ids("p"))
        r["get"] = timed(lambda: c.get_samples(ids, "p", ["x"]))
        r["put"] = timed(lambda: c.put_samples(ids, "p", td))
        r["claim"] = timed(lambda: c.claim_meta("p", "t", ["x"], 2, timeout_s=30))
        r["close"] = timed(c.close)
        r["controller_gone"] = not tq_controller_exists()

    def bootstrap(r):
        over = timed(lambda: TQDataPlaneClient(cfg(num_storage_units=2)))
        r["over_budget"] = over
        r["controller_after_over_budget"] = tq_controller_exists()

        @ray.remote(num_cpus=0)
        class Booter:
            def boot(self, conf):
                try:
                    client = TQDataPlaneClient(conf, bootstrap=True)
                except RuntimeError as exc:
                    return "RuntimeError: " + str(exc)
                client.close()
                return "created"

        first = TQDataPlaneClient(cfg(storage_capacity=1000))
        r["cap_first"] = first.backend_config.backend.SimpleStorage.total_storage_size
        r["polling_first"] = first.backend_config.controller.polling_mode
        booter = Booter.remote()
        r["second_bootstrap"] = ray.get(booter.boot.remote(cfg(storage_capacity=5)), timeout=120)
        ray.kill(booter)
        first.close()
        r["controller_after_close"] = tq_controller_exists()
        again = TQDataPlaneClient(cfg(storage_capacity=777))
        r["cap_again"] = again.backend_config.backend.SimpleStorage.total_storage_size
        again.register_partition("p", ["x"], 4, ["t"])
        again.put_samples(ids, "p", td)
        r["roundtrip"] = bool(torch.equal(again.get_samples(ids, "p", ["x"])["x"], td["x"]))
        again.close()

    known = {"storage": storage, "controller": controller, "bootstrap": bootstrap}
    for case in cases:
        r = result["cases"][case] = {}
        try:
            known[case](r)
        except Exception:
            r["exception"] = traceback.format_exc()[-3000:]
        # Every case ends with its system closed: the next one starts from an empty cluster.
        r["controller_left"] = tq_controller_exists()
finally:
    children = [p.pid for p in psutil.Process().children(recursive=True)]
    shutdown_ray()
    left = wait_gone(children, within_s=45, pause_s=0.5)
    result["children"] = children
    result["leftover"] = left
    print("RESULT " + json.dumps(result), flush=True)
""" % {
    "controller_s": CONTROLLER_S,
    "storage_s": STORAGE_S,
    "attempts": STORAGE_ATTEMPTS,
    "probe_s": PROBE_S,
}

#: The fault cases, run in this order by one subprocess (one Ray start instead of one per case).
CASES: tuple[str, ...] = ("storage", "controller", "bootstrap")


def _run_cases(cases: tuple[str, ...]) -> dict[str, Any]:
    """Run ``cases`` in one fresh interpreter and check what it left behind.

    Args:
        cases: Case names, run in order in the subprocess's one Ray.

    Returns:
        The subprocess's result: ``cases`` (per-case results), ``env``, ``children``, ...
    """
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("TQ_") and k != "RAY_ADDRESS"
    }
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *cases],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"cases {cases} produced no result (rc={proc.returncode}):\n{proc.stderr[-4000:]}"
    result = json.loads(lines[-1][len("RESULT ") :])
    assert proc.returncode == 0, f"cases {cases} rc={proc.returncode}:\n{proc.stderr[-4000:]}"
    assert result["leftover"] == [], f"Ray/TQ processes left behind: {result['leftover']}"
    # Re-check after the subprocess is gone: none of its children may survive it.
    time.sleep(0.5)
    survivors = []
    for pid in result["children"]:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE and p.ppid() != os.getpid():
                survivors.append(f"{pid}:{p.name()}:{' '.join(p.cmdline()[:3])}")
        except psutil.NoSuchProcess:
            pass
    # A pid may have been reused by an unrelated process; only Ray/TQ names count.
    survivors = [s for s in survivors if "ray" in s.lower() or "transfer" in s.lower()]
    assert survivors == [], f"processes outlived the fault subprocess: {survivors}"
    assert result["env"]["TQ_SIMPLE_STORAGE_SEND_RECV_TIMEOUT"] == str(int(STORAGE_S))
    assert result["tq_imported_before_client"] is False
    return result


@pytest.fixture(scope="module")
def faults() -> dict[str, Any]:
    """Every case's result, from one subprocess for the module."""
    return _run_cases(CASES)


def _case(faults: dict[str, Any], case: str) -> dict[str, Any]:
    r = faults["cases"][case]
    assert "exception" not in r, f"case {case} raised:\n{r['exception']}"
    assert r["controller_left"] is False, f"case {case} left a TransferQueue controller behind"
    return r


def test_killed_storage_unit_raises_within_storage_bound(faults: dict[str, Any]) -> None:
    r = _case(faults, "storage")
    bound = STORAGE_ATTEMPTS * STORAGE_S + PROBE_S + SLACK_S
    for op in ("get", "put"):
        assert r[op]["unavailable"], r[op]
        assert r[op]["elapsed"] <= bound, (op, r[op]["elapsed"], bound)
        assert "'p'" in r[op]["message"]
    # The get found the unit gone; the put after it fails at once instead of waiting again.
    assert r["put"]["elapsed"] < 2.0 and "not attempted" in r["put"]["message"], r["put"]
    # The controller is alive: metadata calls still work.
    assert r["list_after"] == ["s0", "s1", "s2", "s3"]
    assert r["close"]["error"] is None
    assert r["controller_gone"] is True


def test_killed_controller_raises_unavailable_within_controller_bound(faults: dict[str, Any]) -> None:
    r = _case(faults, "controller")
    for op in ("list", "get", "put", "claim"):
        assert r[op]["unavailable"], (op, r[op])
        assert r[op]["elapsed"] <= CONTROLLER_S + SLACK_S, (op, r[op]["elapsed"])
    assert r["close"]["error"] is None
    assert r["close"]["elapsed"] <= CONTROLLER_S + 20.0
    assert r["controller_gone"] is True


def test_bootstrap_cpu_budget_second_bootstrap_and_rebootstrap(faults: dict[str, Any]) -> None:
    r = _case(faults, "bootstrap")
    over = r["over_budget"]
    assert over["error"] == "RuntimeError" and "num_storage_units" in over["message"], over
    assert over["elapsed"] < 10.0
    assert r["controller_after_over_budget"] is False
    assert r["cap_first"] == 1000 and r["polling_first"] is True
    assert r["second_bootstrap"].startswith("RuntimeError") and "already exists" in r["second_bootstrap"]
    assert r["controller_after_close"] is False
    assert r["cap_again"] == 777
    assert r["roundtrip"] is True
