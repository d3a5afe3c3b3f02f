"""Known third-party log notices, dropped at their source in the driver and every Ray worker."""

from __future__ import annotations

import logging

__all__ = [
    "FX_TRACING_LOGGER",
    "FX_TRACING_NOTICE",
    "WORKER_SETUP_HOOK",
    "DropFxTracingNotice",
    "install_known_log_filters",
]

FX_TRACING_NOTICE = "is_fx_tracing will return true for both fx.symbolic_trace and torch.export"
FX_TRACING_LOGGER = "torch.fx._symbolic_trace"
#: Import path of :func:`install_known_log_filters`, Ray's ``worker_process_setup_hook`` value.
WORKER_SETUP_HOOK = f"{__name__}.install_known_log_filters"


class DropFxTracingNotice(logging.Filter):
    """Drops exactly torch's ``is_fx_tracing`` notice; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(FX_TRACING_NOTICE)


def install_known_log_filters() -> list[str]:
    """Install the known-notice filters on their emitting loggers (idempotent); return what was installed now."""
    done: list[str] = []
    fx_logger = logging.getLogger(FX_TRACING_LOGGER)
    if not any(isinstance(f, DropFxTracingNotice) for f in fx_logger.filters):
        fx_logger.addFilter(DropFxTracingNotice())
        done.append(f"filter on logger {FX_TRACING_LOGGER!r} drops the is_fx_tracing notice")
    return done
