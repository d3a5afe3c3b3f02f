"""The Hydra task wrapper: before start a configuration error is one message and nothing is written;
after start a failure writes ``summary.json`` and plots; SIGTERM acts like Ctrl-C."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hydra.errors import CompactHydraException

from nemo_dp.training.log_capture import capture_run_log
from nemo_dp.training.run_record import RunRecord, remove_unstarted_run_dir, write_failure_summary
from nemo_dp.training.sigterm import TerminationRequested, sigterm_as_interrupt

__all__ = [
    "RunConfigurationError", "is_configuration_error", "full_error_requested", "silence_known_noise",
    "save_hydra_outputs", "hydra_task",
]

_LOG = logging.getLogger(__name__)
_T = TypeVar("_T")

_EXIT_SIGINT = 130
_EXIT_SIGTERM = 143


class RunConfigurationError(CompactHydraException):
    """A configuration or preflight error before the run started (Hydra prints only the message)."""


def silence_known_noise(*, local_ray: bool) -> list[str]:
    """Remove the known start-up notices at their source, before Ray starts (idempotent); return what
    was done, one line each. A ``local_ray`` (null ``cluster.address``) gets ``RAY_AUTH_MODE=token``."""
    from nemo_dp.utils.noise import install_known_log_filters

    done = install_known_log_filters()
    if local_ray and "RAY_AUTH_MODE" not in os.environ and "ray._raylet" not in sys.modules:
        os.environ["RAY_AUTH_MODE"] = "token"
        done.append("RAY_AUTH_MODE=token (Ray's default for a local cluster, set explicitly)")
    return done


def full_error_requested() -> bool:
    """Whether ``HYDRA_FULL_ERROR`` asks for the full traceback instead of a one-line configuration error."""
    return os.environ.get("HYDRA_FULL_ERROR", "") not in ("", "0")


def is_configuration_error(exc: BaseException) -> bool:
    """Whether ``exc``, raised before the run started, is a user-facing configuration error (not a bug)."""
    from omegaconf.errors import OmegaConfBaseException

    from nemo_dp.config import PreflightError
    from nemo_dp.distributed.ray_init import ClusterConnectError

    return isinstance(exc, (ValueError, OmegaConfBaseException, PreflightError, FileNotFoundError, ClusterConnectError))


def save_hydra_outputs(cfg: Any, run_dir: Path) -> None:
    """Write Hydra's ``.hydra/`` files into ``run_dir`` once the run is accepted (the launcher sets
    ``hydra.output_subdir: null``); nothing when Hydra wrote them itself or runs no job."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    if hc.output_subdir is not None:
        return
    out = run_dir / ".hydra"
    out.mkdir(parents=True, exist_ok=True)
    for name, node in (("config", cfg), ("hydra", {"hydra": hc}), ("overrides", hc.overrides.task)):
        (out / f"{name}.yaml").write_text(OmegaConf.to_yaml(node), encoding="utf-8")


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
    """Wrap ``task(cfg, record)`` (which calls ``record.mark_started()`` just before Ray starts) with the
    run's failure handling, as a ``task(cfg)`` for ``@hydra.main``."""

    @functools.wraps(task)
    def wrapper(cfg: Any) -> _T:
        from hydra.core.hydra_config import HydraConfig

        run_dir = Path(HydraConfig.get().runtime.output_dir)
        log_path = run_dir / f"{HydraConfig.get().job.name}.log"
        record = RunRecord(run_dir=run_dir, log_path=log_path)
        # Only a directory made for this job is removed when the run is refused.
        new = _new_for_this_job(run_dir, log_path)
        for line in silence_known_noise(local_ray=_local_ray(cfg)):
            _LOG.debug(line)
        with capture_run_log(log_path, deferred=True) as run_log, sigterm_as_interrupt():
            record.on_start.extend([run_log.open, lambda: save_hydra_outputs(cfg, run_dir)])
            try:
                return task(cfg, record)
            except SystemExit as exc:
                # ray.init's SIGTERM handler calls sys.exit(signum) until sigterm_as_interrupt is re-entered.
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
                    print(f"run failed: {type(exc).__name__}; summary in {where}", file=sys.stderr, flush=True)
                    raise
                removed = new and remove_unstarted_run_dir(run_dir, log_names=(log_path.name,))
                if removed:
                    _LOG.debug("removed unstarted run directory %s", run_dir)
                if full_error_requested() or not is_configuration_error(exc):
                    raise
                message = _one_message(exc)
        raise RunConfigurationError(message) from None

    return wrapper
