"""SIGTERM handled like Ctrl-C: raised as :class:`TerminationRequested` in the main thread."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["TerminationRequested", "sigterm_as_interrupt"]

_LOG = logging.getLogger(__name__)


class TerminationRequested(KeyboardInterrupt):
    """SIGTERM arrived; raised in the main thread so teardown runs as for Ctrl-C."""


@dataclass
class _SigtermState:
    """What :func:`sigterm_as_interrupt` saw; :meth:`deferred` holds SIGTERM during teardown."""

    received: bool = False
    deferring: bool = False
    pending: bool = False

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Hold a SIGTERM arriving in the block (teardown must not be cut half-way) and raise it as
        :class:`TerminationRequested` once the block finished, unless the block already raised."""
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
    A second SIGTERM is ignored; the yielded state's ``received`` says whether one arrived.
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
