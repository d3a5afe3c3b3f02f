"""Fault cases of the TransferQueue adapter, each in its own subprocess.

Each case kills or over-commits part of a TransferQueue system, so it runs in a fresh Python
process with its own local Ray (``num_cpus=2``) and small timeouts exported *before* the library
is imported (its knobs are read at import).  The subprocess reports a JSON result line; it also
lists its Ray child processes and waits, after ``ray.shutdown()``, until none is left, and the
test re-checks those pids once the subprocess has exited.
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

pytestmark = pytest.mark.timeout(300)

# Small bounds: controller_s=3, storage_s=2, storage_max_attempts=1, storage_probe_s=1.
CONTROLLER_S = 3.0
STORAGE_S = 2.0
STORAGE_ATTEMPTS = 1
PROBE_S = 1.0
SLACK_S = 4.0

_SCRIPT = r"""
import json, sys, time
import psutil

case = sys.argv[1]
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

result = {"case": case}
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

    if case == "storage":
        c = TQDataPlaneClient(cfg())
        c.register_partition("p", ["x", "y"], 4, ["t"])
        c.put_samples(ids, "p", td)
        ray.kill(ray.get_actor(f"{STORAGE_UNIT_NAME_PREFIX}0"))
        time.sleep(1.0)
        result["get"] = timed(lambda: c.get_samples(ids, "p", ["x"]))
        result["put"] = timed(lambda: c.put_samples(ids, "p", TensorDict({"y": torch.zeros(4)}, batch_size=[4])))
        result["list_after"] = c.list_sample_ids("p")
        result["close"] = timed(c.close)
        result["controller_gone"] = not tq_controller_exists()
    elif case == "controller":
        c = TQDataPlaneClient(cfg())
        c.register_partition("p", ["x"], 4, ["t"])
        c.put_samples(ids, "p", td)
        ray.kill(ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE))
        time.sleep(1.0)
        result["list"] = timed(lambda: c.list_sample_ids("p"))
        result["get"] = timed(lambda: c.get_samples(ids, "p", ["x"]))
        result["put"] = timed(lambda: c.put_samples(ids, "p", td))
        result["claim"] = timed(lambda: c.claim_meta("p", "t", ["x"], 2, timeout_s=30))
        result["close"] = timed(c.close)
        result["controller_gone"] = not tq_controller_exists()
    elif case == "bootstrap":
        over = timed(lambda: TQDataPlaneClient(cfg(num_storage_units=2)))
        result["over_budget"] = over
        result["controller_after_over_budget"] = tq_controller_exists()

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
        result["cap_first"] = first.backend_config.backend.SimpleStorage.total_storage_size
        result["polling_first"] = first.backend_config.controller.polling_mode
        booter = Booter.remote()
        result["second_bootstrap"] = ray.get(booter.boot.remote(cfg(storage_capacity=5)), timeout=120)
        ray.kill(booter)
        first.close()
        result["controller_after_close"] = tq_controller_exists()
        again = TQDataPlaneClient(cfg(storage_capacity=777))
        result["cap_again"] = again.backend_config.backend.SimpleStorage.total_storage_size
        again.register_partition("p", ["x"], 4, ["t"])
        again.put_samples(ids, "p", td)
        result["roundtrip"] = bool(torch.equal(again.get_samples(ids, "p", ["x"])["x"], td["x"]))
        again.close()
    else:
        raise SystemExit(f"unknown case {case}")
finally:
    children = [p.pid for p in psutil.Process().children(recursive=True)]
    shutdown_ray()
    deadline = time.monotonic() + 45
    def alive():
        out = []
        for pid in children:
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{pid}:{proc.name()}")
            except psutil.NoSuchProcess:
                pass
        return out
    left = alive()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = alive()
    result["children"] = children
    result["leftover"] = left
    print("RESULT " + json.dumps(result), flush=True)
""" % {
    "controller_s": CONTROLLER_S,
    "storage_s": STORAGE_S,
    "attempts": STORAGE_ATTEMPTS,
    "probe_s": PROBE_S,
}


def _run_case(case: str) -> dict[str, Any]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("TQ_") and k != "RAY_ADDRESS"
    }
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, case],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"case {case} produced no result (rc={proc.returncode}):\n{proc.stderr[-4000:]}"
    result = json.loads(lines[-1][len("RESULT ") :])
    assert proc.returncode == 0, f"case {case} rc={proc.returncode}:\n{proc.stderr[-4000:]}"
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


def test_killed_storage_unit_raises_within_storage_bound() -> None:
    r = _run_case("storage")
    bound = STORAGE_ATTEMPTS * STORAGE_S + PROBE_S + SLACK_S
    for op in ("get", "put"):
        assert r[op]["unavailable"], r[op]
        assert r[op]["elapsed"] <= bound, (op, r[op]["elapsed"], bound)
        assert "'p'" in r[op]["message"]
    # The controller is alive: metadata calls still work.
    assert r["list_after"] == ["s0", "s1", "s2", "s3"]
    assert r["close"]["error"] is None
    assert r["controller_gone"] is True


def test_killed_controller_raises_unavailable_within_controller_bound() -> None:
    r = _run_case("controller")
    for op in ("list", "get", "put", "claim"):
        assert r[op]["unavailable"], (op, r[op])
        assert r[op]["elapsed"] <= CONTROLLER_S + SLACK_S, (op, r[op]["elapsed"])
    assert r["close"]["error"] is None
    assert r["close"]["elapsed"] <= CONTROLLER_S + 20.0
    assert r["controller_gone"] is True


def test_bootstrap_cpu_budget_second_bootstrap_and_rebootstrap() -> None:
    r = _run_case("bootstrap")
    over = r["over_budget"]
    assert over["error"] == "RuntimeError" and "num_storage_units" in over["message"], over
    assert over["elapsed"] < 10.0
    assert r["controller_after_over_budget"] is False
    assert r["cap_first"] == 1000 and r["polling_first"] is True
    assert r["second_bootstrap"].startswith("RuntimeError") and "already exists" in r["second_bootstrap"]
    assert r["controller_after_close"] is False
    assert r["cap_again"] == 777
    assert r["roundtrip"] is True
