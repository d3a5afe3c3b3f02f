"""A pre-imported parent that forks one process per launcher run of the e2e tier.

Why this exists: a launcher run in a fresh interpreter first spends seconds of CPU importing
torch, transformers, tensordict, Hydra, OmegaConf and matplotlib before it reads its first
override, and the e2e tier makes dozens of runs on a 2-core machine. This server imports those
libraries once (nothing of ``nemo_dp``, Ray or TransferQueue, whose import-time state depends on the
environment a run sets), then answers each request by forking a child that takes the request's
working directory, environment, ``argv`` and output files and executes ``launchers/launch.py``
as ``__main__``: the launcher's own code runs from its first line in a process of its own, as
it does from a shell, and ends like an interpreter does (threads joined, ``atexit`` handlers).

What differs from a fresh interpreter, and why it is acceptable here: the preloaded modules
were imported under the server's environment (a request whose environment differs in a
variable those libraries read at import, ``HF_*``, ``TORCH*``, ``OMP_*`` and the like, is run
in a fresh interpreter by the client instead), and every child shares the server's
``PYTHONHASHSEED``. Launcher runs seed every generator they use from their config, and the
tests that compare two runs bit for bit compare numbers, not hash orders; runs that must be
independent interpreters (signals, ``-m`` entry points) start their own.

Protocol (one JSON line per request on a Unix socket, one JSON line per reply):
``{"script", "argv", "cwd", "env", "stdout", "stderr"}`` -> ``{"pid"}`` once forked, then
``{"returncode"}`` when the child exits (negative: killed by that signal).

Run as ``python launch_server.py SOCKET_PATH``; it serves until its socket is closed by the
parent (the pytest session), which also ends it by PID in ``finally``.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import socket
import sys
from pathlib import Path
from typing import Any

#: What the server imports once; chosen because they are slow to import and keep no state that
#: depends on the environment of a particular run.
PRELOAD = ("torch", "tensordict", "transformers", "hydra", "omegaconf", "numpy", "safetensors", "matplotlib.pyplot")


def _run_child(req: dict[str, Any]) -> None:
    """In the forked child: take the request's process state and run the script; never returns."""
    code = 1
    try:
        os.setsid()  # a process group of its own, so a timeout can end everything it started
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in (out, err, null):
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        script = str(Path(req["script"]).resolve())
        sys.argv = [script, *req["argv"]]
        sys.path[0] = str(Path(script).parent)  # what `python script.py` puts first
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            code = 130
        except BaseException:  # noqa: BLE001 - report like the interpreter does, then exit 1
            import traceback

            traceback.print_exc()
            code = 1
    finally:
        try:
            _finalize_like_the_interpreter()
        finally:
            os._exit(code)


def _finalize_like_the_interpreter() -> None:
    """What a normal interpreter exit does before the process ends, in its order.

    Wait for non-daemon threads, run ``atexit`` handlers (Ray registers its shutdown there),
    flush the standard streams. ``os._exit`` then skips only the interpreter teardown.
    """
    import atexit
    import threading

    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx calls first
    finally:
        try:
            atexit._run_exitfuncs()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 - a closed stream has nothing left to flush
                    pass


def _fork_for(conn: socket.socket) -> int:
    """Read one request from ``conn``, fork its child and tell the client the child's pid."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("client went away before its request was complete")
        line += chunk
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        _run_child(req)
    conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
    return pid


def main(sock_path: str) -> None:
    """Import the preload set, then serve fork requests on ``sock_path`` until it goes away.

    Single-threaded on purpose (a fork from a multi-threaded parent can inherit held locks):
    one loop accepts requests and reaps children, replying with each child's exit status.
    """
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(16)
    server.settimeout(0.05)
    waiting: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            pass
        except OSError:
            return
        else:
            conn.settimeout(30)
            try:
                waiting[_fork_for(conn)] = conn
            except (OSError, ValueError, ConnectionError) as exc:
                print(f"bad request: {exc!r}", file=sys.stderr, flush=True)
                conn.close()
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall((json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n").encode())
                except OSError:
                    pass
                conn.close()
        if not Path(sock_path).exists():
            return


if __name__ == "__main__":
    main(sys.argv[1])
