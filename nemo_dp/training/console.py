"""How a launcher run ends: one clear message, no debris, a summary of what ran, a clean log.

:func:`hydra_task` wraps a Hydra task: before the run starts nothing is written and a
configuration error becomes one :class:`RunConfigurationError` message; after start a failure
writes ``summary.json`` and plots; SIGTERM behaves like Ctrl-C; the run log has no colour codes.
:func:`recipe_hint_on_failure` adds hints to Hydra composition errors.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

from hydra.errors import CompactHydraException

__all__ = [
    "ANSI_ESCAPE",
    "RunConfigurationError",
    "TerminationRequested",
    "RunRecord",
    "strip_ansi",
    "AnsiStrippingFormatter",
    "capture_run_log",
    "sigterm_as_interrupt",
    "silence_known_noise",
    "is_configuration_error",
    "remove_unstarted_run_dir",
    "save_hydra_outputs",
    "RunLog",
    "write_failure_summary",
    "last_good_checkpoint",
    "resume_command",
    "hydra_task",
    "recipe_algorithm",
    "recipe_hint",
    "recipe_hint_on_failure",
]

_LOG = logging.getLogger(__name__)
_T = TypeVar("_T")

#: CSI sequences (colours, cursor moves), OSC sequences (titles, links) and 2-byte escapes.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
#: What Hydra and the launcher write into a run directory before the run starts.
_PRE_START_FILES: frozenset[str] = frozenset({"resolved_config.yaml", "run.json"})
_EXIT_SIGINT = 130
_EXIT_SIGTERM = 143


class RunConfigurationError(CompactHydraException):
    """A configuration or preflight error before the run started (Hydra prints only the message)."""


class TerminationRequested(KeyboardInterrupt):
    """SIGTERM arrived; raised in the main thread so teardown runs as for Ctrl-C."""


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences.

    Args:
        text: Any text.

    Returns:
        ``text`` without colour codes, cursor moves or terminal titles.
    """
    return ANSI_ESCAPE.sub("", text)


class AnsiStrippingFormatter(logging.Formatter):
    """Delegates to another formatter and strips ANSI codes from its output.

    Args:
        inner: The formatter whose layout is kept (``None``: the default layout).
    """

    def __init__(self, inner: logging.Formatter | None = None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        """Format with the inner formatter, then strip.

        Args:
            record: The log record.

        Returns:
            The formatted line without escape sequences.
        """
        return strip_ansi(self.inner.format(record))


# --- the run's log file ---


class _LineSink:
    """Appends complete lines to the log file: colour codes stripped, ``\\r`` redraws collapsed.

    A deferred sink holds its lines in memory until :meth:`open` (the run was accepted); closed
    before that, it writes nothing, so a refused run leaves another run's log as it was.
    """

    def __init__(self, path: Path, *, deferred: bool = False) -> None:
        self._path = path
        self._fh: TextIO | None = None
        self._held: list[str] = []
        self._lock = threading.Lock()
        self._partial: dict[str, str] = {}
        if not deferred:
            self.open()

    def open(self) -> None:
        """Open the file (idempotent) and write the lines held so far."""
        with self._lock:
            if self._fh is not None:
                return
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self._path, "a", encoding="utf-8")
            for line in self._held:
                self._fh.write(line)
            self._held.clear()
            self._fh.flush()

    def feed(self, key: str, text: str) -> None:
        with self._lock:
            buf = self._partial.get(key, "") + text
            *lines, rest = buf.split("\n")
            self._partial[key] = rest
            for line in lines:
                self._write(line)

    def _write(self, line: str) -> None:
        # A progress bar redraws its line after \r: keep what the terminal ends up showing.
        shown = strip_ansi(line.rsplit("\r", 1)[-1]).rstrip()
        if not shown:
            return
        if self._fh is None:
            self._held.append(shown + "\n")
            return
        self._fh.write(shown + "\n")
        self._fh.flush()

    def close(self) -> None:
        with self._lock:
            for rest in self._partial.values():
                self._write(rest)
            self._partial.clear()
            self._held.clear()
            if self._fh is not None:
                self._fh.close()


class _Tee(io.TextIOBase):
    """A text stream that writes to the original stream and copies to a :class:`_LineSink`."""

    def __init__(self, stream: TextIO, sink: _LineSink, key: str) -> None:
        super().__init__()
        self._stream = stream
        self._sink = sink
        self._key = key

    def write(self, text: str) -> int:  # type: ignore[override]
        self._stream.write(text)
        try:
            self._sink.feed(self._key, text)
        except ValueError:  # the sink was closed by another thread's teardown
            pass
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", "utf-8")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _file_handlers(path: Path) -> list[logging.FileHandler]:
    target = os.path.abspath(path)
    return [
        h
        for h in logging.getLogger().handlers
        if isinstance(h, logging.FileHandler) and os.path.abspath(h.baseFilename) == target
    ]


class _HeldRecords(logging.Handler):
    """Keeps log records until the run's log file may be written (see :class:`RunLog`)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class RunLog:
    """The run's log file while :func:`capture_run_log` copies into it.

    Attributes:
        path: The log file.
        opened: Whether the file is being written (a deferred log opens on :meth:`open`).
    """

    path: Path
    opened: bool = False
    _sink: Any = None
    _handlers: list[logging.Handler] = field(default_factory=list)
    _held: _HeldRecords | None = None

    def open(self) -> None:
        """Start writing the file, the lines and log records held so far first (idempotent)."""
        if self.opened:
            return
        self.opened = True
        self._sink.open()
        root = logging.getLogger()
        held = self._held.records if self._held is not None else []
        if self._held is not None:
            root.removeHandler(self._held)
            self._held = None
        for handler in self._handlers:
            root.addHandler(handler)
            for record in held:
                if record.levelno >= handler.level:
                    handler.handle(record)


@contextmanager
def capture_run_log(log_path: str | os.PathLike[str], *, deferred: bool = False) -> Iterator[RunLog]:
    """Copy stdout/stderr into ``log_path`` (no colour codes) for the duration of the block.

    Hydra's file handler gets an ANSI-stripping formatter meanwhile (or a handler is added).
    A ``deferred`` log holds everything in memory until :meth:`RunLog.open`; if the block ends
    first, nothing is written.

    Args:
        log_path: The run's log file (Hydra's ``<run_dir>/<job name>.log``).
        deferred: Hold the output until :meth:`RunLog.open` (the run was accepted).

    Yields:
        The :class:`RunLog`.
    """
    path = Path(log_path)
    root = logging.getLogger()
    sink = _LineSink(path, deferred=deferred)
    handlers: list[logging.Handler] = list(_file_handlers(path))
    saved_formatters = [(h, h.formatter) for h in handlers]
    for h in handlers:
        h.setFormatter(AnsiStrippingFormatter(h.formatter))
    added: logging.FileHandler | None = None
    if not handlers:
        added = logging.FileHandler(path, encoding="utf-8", delay=True)
        added.setFormatter(
            AnsiStrippingFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        )
        handlers.append(added)
    run_log = RunLog(path=path, _sink=sink, _handlers=handlers)
    if deferred:
        for h in handlers:
            root.removeHandler(h)
        run_log._held = _HeldRecords()
        root.addHandler(run_log._held)
    else:
        run_log.opened = True
        if added is not None:
            root.addHandler(added)
    old_out, old_err = sys.stdout, sys.stderr
    sys.stdout = _Tee(old_out, sink, "stdout")  # type: ignore[assignment]
    sys.stderr = _Tee(old_err, sink, "stderr")  # type: ignore[assignment]
    try:
        yield run_log
    finally:
        sys.stdout, sys.stderr = old_out, old_err
        if run_log._held is not None:
            root.removeHandler(run_log._held)
        if not run_log.opened:  # never accepted: Hydra's own handlers go back, unused
            for h in handlers:
                if h is not added:
                    root.addHandler(h)
        for h, fmt in saved_formatters:
            h.setFormatter(fmt)  # type: ignore[arg-type]
        if added is not None:
            root.removeHandler(added)
            added.close()
        sink.close()


# --- signals and noise ---


@dataclass
class _SigtermState:
    """What :func:`sigterm_as_interrupt` saw; :meth:`deferred` holds SIGTERM during teardown."""

    def __init__(self) -> None:
        self.received = False
        self.deferring = False
        self.pending = False

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Hold a SIGTERM that arrives inside the block until the block is done.

        Teardown (workers, the data plane, Ray) must not be cut half-way: a SIGTERM during it
        is remembered and raised as :class:`TerminationRequested` once the block finished
        (unless the block already raised).
        """
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False
        if self.pending:
            raise TerminationRequested("SIGTERM received")


@contextmanager
def sigterm_as_interrupt() -> Iterator[_SigtermState]:
    """Turn SIGTERM into :class:`TerminationRequested` in the main thread for the block.

    ``ray.init`` installs its own SIGTERM handlers, so enter this again after Ray has started.
    A second SIGTERM during teardown is ignored; inside ``state.deferred()`` one is held until
    the block is done.

    Yields:
        A state whose ``received`` says whether SIGTERM arrived.
    """
    state = _SigtermState()
    if threading.current_thread() is not threading.main_thread():
        _LOG.warning("SIGTERM is not converted: not in the main thread")
        yield state
        return
    previous = signal.getsignal(signal.SIGTERM)

    def _handler(signum: int, frame: Any) -> None:
        if state.received:
            return
        state.received = True
        if state.deferring:
            state.pending = True
            return
        raise TerminationRequested("SIGTERM received")

    signal.signal(signal.SIGTERM, _handler)
    try:
        yield state
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def silence_known_noise(*, local_ray: bool) -> list[str]:
    """Remove the known start-up notices at their source (idempotent; call before Ray starts).

    * torch's one-time "is_fx_tracing will return true ..." log record: dropped by a logger
      filter (``nemo_dp.utils.noise``; Ray workers install it through the setup hook).
    * Ray's "Token authentication is enabled ..." notice: for a local Ray only, set
      ``RAY_AUTH_MODE=token`` (what Ray would set itself) before Ray is imported.

    Args:
        local_ray: The run starts a local Ray (``cluster.address`` is null).

    Returns:
        What was done, one line each (for a debug log).
    """
    from nemo_dp.utils.noise import install_known_log_filters

    done = install_known_log_filters()
    if local_ray and "RAY_AUTH_MODE" not in os.environ and "ray._raylet" not in sys.modules:
        os.environ["RAY_AUTH_MODE"] = "token"
        done.append("RAY_AUTH_MODE=token (Ray's default for a local cluster, set explicitly)")
    return done


# --- failures ---


@dataclass
class RunRecord:
    """What the launcher tells the wrapper while a run goes on.

    Attributes:
        run_dir: The job's output directory.
        log_path: The run's log file.
        started: Set by :meth:`mark_started` just before Ray starts.
        summary: The launcher's summary so far (phases finished, ...), merged into a failure's
            ``summary.json``; the launcher may replace it or fill it in place.
        metrics: ``(metrics.jsonl, plot.png)`` of every phase begun, plotted after a failure.
        t_start: ``time.perf_counter()`` when the task started.
        on_start: Called once by :meth:`mark_started` (the wrapper opens the run's log file
            and writes Hydra's ``.hydra/`` files there: nothing reaches the run directory
            before the run is accepted).
        checkpoint_root: The run's checkpoints root (set by the launcher; the last good
            checkpoint after a failure is looked up there).
        phase_names: The run's phases in order.
    """

    run_dir: Path
    log_path: Path | None = None
    started: bool = False
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: list[tuple[Path, Path]] = field(default_factory=list)
    t_start: float = field(default_factory=time.perf_counter)
    on_start: list[Callable[[], None]] = field(default_factory=list)
    checkpoint_root: Path | None = None
    phase_names: list[str] = field(default_factory=list)

    def mark_started(self) -> None:
        """From now on a failure is a failed run (summary, plot), not a configuration error."""
        if self.started:
            return
        self.started = True
        for hook in self.on_start:
            hook()

    def track_metrics(self, metrics_path: str | os.PathLike[str], plot_path: str | os.PathLike[str]) -> None:
        """Plot ``metrics_path`` to ``plot_path`` if the run fails.

        Args:
            metrics_path: A phase's metrics file.
            plot_path: Its plot.
        """
        pair = (Path(metrics_path), Path(plot_path))
        if pair not in self.metrics:
            self.metrics.append(pair)


def is_configuration_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a user-facing configuration/preflight error (not a bug).

    Args:
        exc: The exception raised before the run started.

    Returns:
        True for ``ValueError`` (schema rules, resume, run-dir, dataset, checkpoint-integrity
        errors, the CPU budget), OmegaConf errors, ``PreflightError``, ``FileNotFoundError``
        and ``ClusterConnectError`` (the cluster to join cannot be reached).
    """
    from omegaconf.errors import OmegaConfBaseException

    from nemo_dp.config import PreflightError
    from nemo_dp.distributed.ray_init import ClusterConnectError

    return isinstance(
        exc, (ValueError, OmegaConfBaseException, PreflightError, FileNotFoundError, ClusterConnectError)
    )


def _empty_tree(path: Path) -> bool:
    """A directory holding no files at any depth (what preflight's writability probe leaves)."""
    return all(child.is_dir() and not child.is_symlink() and _empty_tree(child) for child in path.iterdir())


def remove_unstarted_run_dir(run_dir: str | os.PathLike[str], *, log_names: tuple[str, ...] = ()) -> bool:
    """Remove a run directory that holds only what was written before the run started.

    Allowed: ``.hydra/``, the run's log files, ``resolved_config.yaml``, ``run.json`` and empty
    directories; anything else keeps the directory untouched.

    Args:
        run_dir: The job's output directory.
        log_names: The run's log file names (default: any ``*.log``).

    Returns:
        Whether the directory was removed.
    """
    root = Path(run_dir)
    if not root.is_dir():
        return False
    for child in root.iterdir():
        if child.is_symlink():
            return False
        if child.is_dir() and (child.name == ".hydra" or _empty_tree(child)):
            continue
        is_log = child.name in log_names or (not log_names and child.suffix == ".log")
        if child.is_file() and (child.name in _PRE_START_FILES or is_log):
            continue
        return False
    shutil.rmtree(root, ignore_errors=True)
    return not root.exists()


def _plot_tracked(record: RunRecord) -> list[str]:
    plots: list[str] = []
    for metrics_path, plot_path in record.metrics:
        if not metrics_path.is_file() or metrics_path.stat().st_size == 0:
            continue
        try:
            from nemo_dp.utils.plotting import plot_training_curves

            plots.append(str(plot_training_curves(metrics_path, plot_path)))
        except Exception as exc:  # the plot must never hide the run's own error
            _LOG.warning("could not plot %s: %s", metrics_path, exc)
    return plots


def last_good_checkpoint(record: RunRecord) -> Path | None:
    """The newest committed checkpoint of the latest phase that has one, or ``None``.

    Args:
        record: The run's record (``checkpoint_root``, ``phase_names``).

    Returns:
        The step directory.
    """
    from nemo_dp.utils.checkpoint import latest_checkpoint

    root = record.checkpoint_root
    if root is None or not root.is_dir():
        return None
    names = list(record.phase_names) or sorted(p.name for p in root.iterdir() if p.is_dir())
    for name in reversed(names):
        found = latest_checkpoint(root / name)
        if found is not None:
            return found
    return None


def resume_command(run_dir: Path) -> str:
    """The command that resumes this run into its own directory (this job's overrides kept).

    Args:
        run_dir: The run directory.

    Returns:
        A shell command line.
    """
    import shlex

    overrides: list[str] = []
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = [str(o) for o in HydraConfig.get().overrides.task]
    except ValueError:  # not under Hydra
        pass
    replaced = ("hydra.run.dir", "checkpointing.resume_from")
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in replaced]
    script = sys.argv[0] if sys.argv and sys.argv[0] else "launchers/launch.py"
    return shlex.join(
        ["python", script, *kept, f"checkpointing.resume_from={run_dir}", f"hydra.run.dir={run_dir}"]
    )


def _resume_hint(record: RunRecord) -> tuple[dict[str, Any], list[str]]:
    """What a stopped run tells the user about resuming it: summary fields and lines."""
    last = last_good_checkpoint(record)
    if last is None:
        return {"last_checkpoint": None}, [
            "no checkpoint was written before the run stopped (see checkpointing.save_period); "
            "nothing to resume from"
        ]
    command = resume_command(record.run_dir)
    return {"last_checkpoint": str(last), "resume_command": command}, [
        f"last good checkpoint: {last}",
        f"resume with: {command}",
    ]


def write_failure_summary(record: RunRecord, exc: BaseException, *, status: str) -> Path:
    """Write ``summary.json`` for a run that stopped early, and plot what ran.

    Args:
        record: The run's record (its ``summary`` is merged in).
        exc: What stopped it.
        status: ``failed``, ``interrupted`` (SIGINT) or ``terminated`` (SIGTERM).

    Returns:
        The summary path.
    """
    summary = dict(record.summary)
    summary.setdefault("run_dir", str(record.run_dir))
    summary["status"] = status
    summary["error"] = {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback_tail": traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:],
    }
    summary["plots"] = _plot_tracked(record)
    summary["wall_time_s"] = time.perf_counter() - record.t_start
    try:
        hint, lines = _resume_hint(record)
    except Exception as hint_exc:  # the hint must never hide the run's own error
        hint, lines = {}, []
        _LOG.warning("could not find the last checkpoint: %s", hint_exc)
    summary.update(hint)
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    path = record.run_dir / "summary.json"
    record.run_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".summary.json.tmp-{uuid.uuid4().hex}")
    tmp.write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)
    return path


def _full_error_requested() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR", "") not in ("", "0")


def _hydra_run_dir_and_log() -> tuple[Path, Path]:
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    return run_dir, run_dir / f"{hc.job.name}.log"


def save_hydra_outputs(cfg: Any, run_dir: Path) -> None:
    """Write Hydra's ``.hydra/`` files (config, hydra, overrides) into ``run_dir``.

    The launcher's config sets ``hydra.output_subdir: null``, so Hydra writes nothing before
    the task runs; the wrapper calls this once the run is accepted.  Nothing is done when
    Hydra wrote them itself (``output_subdir`` set) or runs no job.

    Args:
        cfg: The job's composed config (without the ``hydra`` node).
        run_dir: The job's output directory.
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    if hc.output_subdir is not None:
        return
    out = run_dir / ".hydra"
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")
    (out / "hydra.yaml").write_text(OmegaConf.to_yaml({"hydra": hc}), encoding="utf-8")
    (out / "overrides.yaml").write_text(OmegaConf.to_yaml(hc.overrides.task), encoding="utf-8")


def _local_ray(cfg: Any) -> bool:
    try:
        return cfg.cluster.address is None
    except Exception:  # a config without a cluster node starts no Ray of its own choosing
        return False


def _one_message(exc: BaseException) -> str:
    """The line a configuration error prints (a cluster join names its error type too)."""
    from nemo_dp.distributed.ray_init import ClusterConnectError

    text = str(exc)
    if not text:
        return type(exc).__name__
    return f"{type(exc).__name__}: {text}" if isinstance(exc, ClusterConnectError) else text


def _new_for_this_job(run_dir: Path, log_path: Path) -> bool:
    """Whether ``run_dir`` holds nothing but what Hydra wrote for this job (it is new)."""
    from hydra.core.hydra_config import HydraConfig

    hydra_own = {log_path.name}
    if HydraConfig.initialized() and HydraConfig.get().output_subdir is not None:
        hydra_own.add(str(HydraConfig.get().output_subdir))
    return run_dir.is_dir() and all(child.name in hydra_own for child in run_dir.iterdir())


def _stopped(
    record: RunRecord, run_dir: Path, log_path: Path, exc: BaseException, *, terminated: bool, new: bool
) -> None:
    """Finish a run stopped by SIGINT/SIGTERM: summary and plot, or no debris before start."""
    signame = "SIGTERM" if terminated else "SIGINT"
    if record.started:
        where = write_failure_summary(record, exc, status="terminated" if terminated else "interrupted")
        print(f"stopped by {signame}; teardown done; summary in {where}", file=sys.stderr, flush=True)
    else:
        if new:
            remove_unstarted_run_dir(run_dir, log_names=(log_path.name,))
        print(f"stopped by {signame} before the run started", file=sys.stderr, flush=True)


def hydra_task(task: Callable[[Any, RunRecord], _T]) -> Callable[[Any], _T]:
    """Wrap a Hydra task function ``task(cfg, record)`` with the run's failure handling.

    Use under ``@hydra.main(...)``; the wrapped function takes only ``cfg``.

    Args:
        task: The task; it calls ``record.mark_started()`` just before Ray starts.

    Returns:
        The task function for ``hydra.main``.
    """

    @functools.wraps(task)
    def wrapper(cfg: Any) -> _T:
        run_dir, log_path = _hydra_run_dir_and_log()
        record = RunRecord(run_dir=run_dir, log_path=log_path)
        # Only a directory made for this job is removed when the run is refused: an existing
        # one (another run's) stays exactly as it was.
        new = _new_for_this_job(run_dir, log_path)
        for line in silence_known_noise(local_ray=_local_ray(cfg)):
            _LOG.debug(line)
        with capture_run_log(log_path, deferred=True) as run_log, sigterm_as_interrupt():
            record.on_start.extend([run_log.open, lambda: save_hydra_outputs(cfg, run_dir)])
            try:
                return task(cfg, record)
            except SystemExit as exc:
                # ray.init installs ``sys.exit(signum)`` for SIGTERM; until the launcher
                # re-enters sigterm_as_interrupt after Ray is up, SIGTERM arrives as this.
                if exc.code != int(signal.SIGTERM):
                    raise
                _stopped(record, run_dir, log_path, exc, terminated=True, new=new)
                raise SystemExit(_EXIT_SIGTERM) from None
            except KeyboardInterrupt as exc:
                terminated = isinstance(exc, TerminationRequested)
                _stopped(record, run_dir, log_path, exc, terminated=terminated, new=new)
                raise SystemExit(_EXIT_SIGTERM if terminated else _EXIT_SIGINT) from None
            except Exception as exc:
                if record.started:
                    where = write_failure_summary(record, exc, status="failed")
                    print(
                        f"run failed: {type(exc).__name__}; summary in {where}", file=sys.stderr, flush=True
                    )
                    raise
                removed = new and remove_unstarted_run_dir(run_dir, log_names=(log_path.name,))
                if removed:
                    _LOG.debug("removed unstarted run directory %s", run_dir)
                if _full_error_requested() or not is_configuration_error(exc):
                    raise
                message = _one_message(exc)
        raise RunConfigurationError(message) from None

    return wrapper


# --- composition hints ---


def recipe_algorithm(recipe_path: str | os.PathLike[str]) -> str | None:
    """The ``algorithm`` a recipe selects (its ``override /algorithm: <name>`` default).

    Args:
        recipe_path: A ``recipes/*.yaml`` file.

    Returns:
        The algorithm name, or ``None`` when the recipe does not select one.
    """
    from omegaconf import OmegaConf

    node = OmegaConf.load(recipe_path)
    for entry in node.get("defaults", []) or []:
        if hasattr(entry, "items"):
            for key, value in entry.items():
                if str(key).replace("override", "").strip() in ("/algorithm", "algorithm"):
                    return str(value)
    return None


def _override_value(overrides: list[str], key: str) -> str | None:
    for item in overrides:
        name, sep, value = item.partition("=")
        if sep and name.lstrip("+") == key:
            return value
    return None


def recipe_hint(
    overrides: list[str], *, recipes_dir: str | os.PathLike[str], default_recipe: str
) -> str | None:
    """A hint for ``algorithm=<x>`` given without a recipe that the default recipe cannot serve.

    Args:
        overrides: The command-line overrides (``sys.argv[1:]``).
        recipes_dir: The ``recipes/`` directory.
        default_recipe: The root config's default ``recipe`` choice.

    Returns:
        The hint, or ``None`` when a recipe is chosen (``recipe=...``, ``~recipe``) or the
        chosen algorithm is the default recipe's.
    """
    from nemo_dp.config import CONF_DIR
    from nemo_dp.config.hints import group_options

    algorithm = _override_value(overrides, "algorithm")
    if algorithm is None or any(o.lstrip("+~").startswith("recipe") for o in overrides):
        return None
    if algorithm not in (group_options(CONF_DIR, "algorithm") or ()):
        return None  # not an option at all: composition_hints names the closest one
    root = Path(recipes_dir)
    default_algo = recipe_algorithm(root / f"{default_recipe}.yaml")
    if default_algo is None or default_algo == algorithm:
        return None
    matching = sorted(p.stem for p in root.glob("*.yaml") if recipe_algorithm(p) == algorithm)
    choices = [f"recipe={name}" for name in matching] + ["~recipe (the plain group defaults)"]
    return (
        f"hint: algorithm={algorithm} cannot be merged into the default recipe "
        f"{default_recipe!r} (a {default_algo} recipe); add one of: {', '.join(choices)}"
    )


@contextmanager
def recipe_hint_on_failure(
    overrides: list[str], *, recipes_dir: str | os.PathLike[str], default_recipe: str
) -> Iterator[None]:
    """Print :func:`recipe_hint` when the block exits with an error (Hydra's exit status 1).

    Args:
        overrides: The command-line overrides (``sys.argv[1:]``).
        recipes_dir: The ``recipes/`` directory.
        default_recipe: The root config's default ``recipe`` choice.

    Yields:
        Nothing.
    """
    try:
        yield
    except SystemExit as exc:
        if exc.code not in (0, None):
            _print_hint(overrides, recipes_dir, default_recipe)
        raise
    except Exception:
        _print_hint(overrides, recipes_dir, default_recipe)
        raise


def _print_hint(overrides: list[str], recipes_dir: str | os.PathLike[str], default_recipe: str) -> None:
    from nemo_dp.config import CONF_DIR
    from nemo_dp.config.hints import composition_hints

    try:
        hint = recipe_hint(overrides, recipes_dir=recipes_dir, default_recipe=default_recipe)
        hints = ([hint] if hint is not None else []) + composition_hints(overrides, conf_dir=CONF_DIR)
    except Exception:  # a hint must never replace the error it explains
        return
    for line in hints:
        print(line, file=sys.stderr, flush=True)
