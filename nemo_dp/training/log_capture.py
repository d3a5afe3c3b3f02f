"""The run's log file: stdout, stderr and log records without colour codes, held in memory until the
run is accepted (a refused run writes no log file)."""

from __future__ import annotations

import io
import logging
import logging.handlers
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

__all__ = ["ANSI_ESCAPE", "strip_ansi", "AnsiStrippingFormatter", "RunLog", "capture_run_log"]

#: CSI sequences (colours, cursor moves), OSC sequences (titles, links) and 2-byte escapes.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (colour codes, cursor moves, terminal titles)."""
    return ANSI_ESCAPE.sub("", text)


class AnsiStrippingFormatter(logging.Formatter):
    """Delegates to ``inner`` (``None``: the default layout) and strips ANSI codes from its output."""

    def __init__(self, inner: logging.Formatter | None = None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return strip_ansi(self.inner.format(record))


class _LineSink:
    """Appends complete lines to the log file: colour codes stripped, ``\\r`` redraws collapsed.

    A deferred sink holds its lines in memory until :meth:`open`; closed before, it writes nothing.
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


@dataclass
class RunLog:
    """The run's log file while :func:`capture_run_log` copies into it (``opened``: being written)."""

    path: Path
    opened: bool = False
    _sink: Any = None
    _handlers: list[logging.Handler] = field(default_factory=list)
    _held: logging.handlers.BufferingHandler | None = None

    def open(self) -> None:
        """Start writing the file, the lines and log records held so far first (idempotent)."""
        if self.opened:
            return
        self.opened = True
        self._sink.open()
        root = logging.getLogger()
        held = self._held.buffer if self._held is not None else []
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
    """Copy stdout/stderr and log records into ``log_path`` (Hydra's ``<run_dir>/<job>.log``) without colour
    codes for the block; a ``deferred`` log holds everything until :meth:`RunLog.open` (never: no file)."""
    path = Path(log_path)
    root = logging.getLogger()
    sink = _LineSink(path, deferred=deferred)
    target = os.path.abspath(path)
    handlers: list[logging.Handler] = [
        h for h in root.handlers if isinstance(h, logging.FileHandler) and os.path.abspath(h.baseFilename) == target
    ]
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
        run_log._held = logging.handlers.BufferingHandler(capacity=sys.maxsize)  # keeps records until open()
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
