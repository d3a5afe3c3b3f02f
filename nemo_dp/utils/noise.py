"""Known third-party log notices, dropped at their source in every process of a run.

The driver and every Ray worker (via :data:`WORKER_SETUP_HOOK`) install the same filters.
"""

from __future__ import annotations

import logging

__all__ = [
    "FX_TRACING_LOGGER",
    "FX_TRACING_NOTICE",
    "WORKER_SETUP_HOOK",
    "DropFxTracingNotice",
    "install_known_log_filters",
]

#: The start of torch's notice (torch 2.x, ``torch/fx/_symbolic_trace.py``).
FX_TRACING_NOTICE = "is_fx_tracing will return true for both fx.symbolic_trace and torch.export"
#: The logger torch emits it on.
FX_TRACING_LOGGER = "torch.fx._symbolic_trace"
#: Import path of :func:`install_known_log_filters`, Ray's ``worker_process_setup_hook`` value.
WORKER_SETUP_HOOK = f"{__name__}.install_known_log_filters"


class DropFxTracingNotice(logging.Filter):
    """Drops exactly torch's ``is_fx_tracing`` notice; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for the notice, True for any other record of logger ``torch.fx._symbolic_trace``."""
        return not str(record.msg).startswith(FX_TRACING_NOTICE)


def install_known_log_filters() -> list[str]:
    """Install the known-notice filters in this process (idempotent).

    The filter sits on the emitting logger, so the record is dropped before any handler sees
    it.  Runs on the driver before Ray starts and in every Ray worker (setup hook). Returns what
    was installed now, one line each.
    """
    done: list[str] = []
    fx_logger = logging.getLogger(FX_TRACING_LOGGER)
    if not any(isinstance(f, DropFxTracingNotice) for f in fx_logger.filters):
        fx_logger.addFilter(DropFxTracingNotice())
        done.append(f"filter on logger {FX_TRACING_LOGGER!r} drops the is_fx_tracing notice")
    return done
