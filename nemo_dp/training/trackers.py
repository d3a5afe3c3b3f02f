"""Experiment trackers (TensorBoard, Weights & Biases, MLflow) behind one protocol, built from
the ``logger`` node by :func:`build_trackers`; packages are imported lazily, defaults need no network."""

from __future__ import annotations

import importlib.util
import logging
import os
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from nemo_dp.utils.config_access import cfg_get

__all__ = [
    "TRACKING_EXTRA",
    "TrackerUnavailableError",
    "Tracker",
    "TensorBoardTracker",
    "WandbTracker",
    "MlflowTracker",
    "TrackerGroup",
    "PrefixedTracker",
    "numeric_metrics",
    "flatten_config",
    "flatten_run_summary",
    "enabled_trackers",
    "check_trackers_available",
    "build_trackers",
]

#: What to install for every tracker.
TRACKING_EXTRA = "pip install 'nemo_dp[tracking]'"

#: tracker name -> (import name the tracker needs, PyPI distribution).
_PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow-skinny"),
}

#: Final values are logged under this prefix (``final/val_accuracy``).
FINAL_PREFIX = "final/"

_STATUSES: tuple[str, ...] = ("success", "failed", "killed")


class TrackerUnavailableError(ImportError):
    """An enabled tracker's optional package is not installed."""


@runtime_checkable
class Tracker(Protocol):
    """What the run layer calls on every experiment tracker."""

    def log_config(self, resolved: Mapping[str, Any]) -> None:
        """Record the resolved run config (a nested plain dict)."""

    def log_metrics(self, step: int, record: Mapping[str, Any]) -> None:
        """Record one step's metrics (non-numeric values are skipped)."""

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """Record the run's final values (flat ``name -> number``)."""

    def close(self, status: str = "success") -> None:
        """Flush and finish (``status`` in ``success`` / ``failed`` / ``killed``)."""


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        try:
            return _as_number(value.item())
        except (TypeError, ValueError):
            return None
    # metrics.jsonl spells non-finite floats as strings (JSON has no NaN).
    if isinstance(value, str) and value.lower() in ("nan", "inf", "-inf", "+inf"):
        return float(value)
    return None


def numeric_metrics(record: Mapping[str, Any], *, skip: tuple[str, ...] = ("step",)) -> dict[str, float]:
    """The numeric entries of a record as ``key -> float``, in order (no ``skip`` keys, bools, ``None``,
    or strings other than the ``nan``/``inf`` spellings)."""
    return {str(k): n for k, v in record.items() if k not in skip and (n := _as_number(v)) is not None}


def flatten_config(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten a nested plain dict into ``dotted key -> leaf`` (``policy.optimizer.lr``); lists are leaves."""
    flat: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def flatten_run_summary(summary: Mapping[str, Any], main_phase: str) -> dict[str, float]:
    """The flat ``name -> number`` tracker summary of a ``summary.json``; only ``main_phase``'s numbers are
    unprefixed (``val_accuracy``, ``warm_start/val_accuracy``).

    Raises:
        KeyError: ``main_phase`` is not among the summary's phases.
    """
    phases = summary.get("phases", {})
    if main_phase not in phases:
        raise KeyError(f"flatten_run_summary: phase {main_phase!r} not in the summary (has {sorted(phases)})")
    out = {
        ("" if name == main_phase else f"{name}/") + key: value
        for name, result in phases.items()
        for key, value in numeric_metrics(result, skip=()).items()
    }
    out.update(numeric_metrics({key: summary.get(key) for key in ("accuracy_gain", "wall_time_s")}, skip=()))
    return out


def _check_status(status: str) -> None:
    if status not in _STATUSES:
        raise ValueError(f"Tracker.close: status must be one of {list(_STATUSES)}, got {status!r}")


def _config_yaml(resolved: Mapping[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(dict(resolved), sort_keys=False)


class TensorBoardTracker:
    """TensorBoard event files in ``log_dir`` (created), through ``SummaryWriter``."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer: Any = SummaryWriter(log_dir=str(self.log_dir))

    def log_config(self, resolved: Mapping[str, Any]) -> None:
        """Write the config as a text summary (indented: TensorBoard renders it as code)."""
        text = _config_yaml(resolved)
        self._writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), 0)
        self._writer.flush()

    def log_metrics(self, step: int, record: Mapping[str, Any]) -> None:
        """Write each numeric entry as a scalar at ``step``."""
        for key, value in numeric_metrics(record).items():
            self._writer.add_scalar(key, value, global_step=int(step))
        self._writer.flush()

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """Write final values as ``final/<name>`` scalars and a ``summary`` text."""
        values = numeric_metrics(summary, skip=())
        for key, value in values.items():
            self._writer.add_scalar(f"{FINAL_PREFIX}{key}", value, global_step=0)
        lines = [f"| {key} | {value:.6g} |" for key, value in values.items()]
        self._writer.add_text("summary", "\n".join(["| name | value |", "|---|---|", *lines]), 0)
        self._writer.flush()

    def close(self, status: str = "success") -> None:
        """Flush and close the event file (``status`` is recorded as text)."""
        _check_status(status)
        if self._writer is None:
            return
        self._writer.add_text("status", status, 0)
        self._writer.close()
        self._writer = None


class WandbTracker:
    """A Weights & Biases run (``cfg``: ``logger.wandb``; offline by default, no network).

    A W&B run's step only grows while phases restart theirs, so each row's phase step is the ``step`` metric.
    """

    def __init__(self, run_dir: str | os.PathLike[str], cfg: Any) -> None:
        import wandb

        run_dir = Path(run_dir)
        wandb_dir = run_dir / str(cfg_get(cfg, "dir", "."))
        wandb_dir.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(
            mode=str(cfg_get(cfg, "mode", "offline")),
            silent=True,  # no banner, no sync hints: the run directory is printed by the launcher
            console="off",
            x_disable_stats=True,  # the system-metrics sampler costs a core on a 2-core machine
            x_disable_meta=True,
            disable_git=True,
            save_code=False,
            reinit="create_new",  # a --multirun job must never continue the previous job's run
        )
        tags = cfg_get(cfg, "tags", None)
        self._run: Any = wandb.init(
            project=str(cfg_get(cfg, "project", "nemo_dp")),
            entity=cfg_get(cfg, "entity", None),
            name=cfg_get(cfg, "name", None) or run_dir.name,
            group=cfg_get(cfg, "group", None),
            tags=None if not tags else [str(t) for t in tags],
            dir=str(wandb_dir),
            settings=settings,
        )
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")

    def log_config(self, resolved: Mapping[str, Any]) -> None:
        """Store the resolved config as the run's config."""
        self._run.config.update(dict(resolved), allow_val_change=True)

    def log_metrics(self, step: int, record: Mapping[str, Any]) -> None:
        """Append one history row: the numeric entries plus ``step``."""
        values = numeric_metrics(record)
        if values:
            self._run.log({"step": int(step), **values})

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """Set ``final/<name>`` entries of the run summary."""
        for key, value in numeric_metrics(summary, skip=()).items():
            self._run.summary[f"{FINAL_PREFIX}{key}"] = value

    def close(self, status: str = "success") -> None:
        """Finish the run (exit code 0 on success, 1 otherwise)."""
        _check_status(status)
        if self._run is None:
            return
        self._run.finish(exit_code=0 if status == "success" else 1)
        self._run = None


_MLFLOW_STATUS = {"success": "FINISHED", "failed": "FAILED", "killed": "KILLED"}
_MLFLOW_MAX_PARAMS = 100  # per log_batch call
_MLFLOW_MAX_PARAM_LEN = 6000


def _mlflow_key(key: str) -> str:
    # MLflow keys allow alphanumerics, '_', '-', '.', ' ', ':' and '/'.
    return "".join(ch if ch.isalnum() or ch in "_-. :/" else "_" for ch in key)


def default_mlflow_uri(run_dir: str | os.PathLike[str]) -> str:
    """The default tracking store, ``sqlite:///<abs run_dir>/mlflow.db`` (MLflow 3 refuses its plain-file
    backend unless ``MLFLOW_ALLOW_FILE_STORE`` is set)."""
    return f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"


class MlflowTracker:
    """An MLflow run via ``MlflowClient`` (no global active run: jobs never leak); ``cfg`` is ``logger.mlflow``."""

    def __init__(self, run_dir: str | os.PathLike[str], cfg: Any) -> None:
        # Store creation logs schema-migration INFO lines on every new store.
        for name in ("mlflow.store.db.utils", "alembic.runtime.migration", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)
        from mlflow.tracking import MlflowClient

        run_dir = Path(run_dir)
        self.tracking_uri = str(cfg_get(cfg, "tracking_uri", None) or default_mlflow_uri(run_dir))
        with warnings.catch_warnings():
            # MLflow's SQL store configures its mappers with a loader SQLAlchemy 2.1 deprecates.
            warnings.filterwarnings("ignore", message=".*noload.*", category=DeprecationWarning)
            self._client: Any = MlflowClient(tracking_uri=self.tracking_uri)
            name = str(cfg_get(cfg, "experiment", "nemo_dp"))
            experiment = self._client.get_experiment_by_name(name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        elif self.tracking_uri.startswith("sqlite:"):
            artifacts = (run_dir / "mlartifacts").resolve()
            experiment_id = self._client.create_experiment(name, artifact_location=artifacts.as_uri())
        else:
            experiment_id = self._client.create_experiment(name)
        run = self._client.create_run(experiment_id, run_name=cfg_get(cfg, "run_name", None) or run_dir.name)
        self.run_id: str | None = run.info.run_id

    def _log_batch(self, *, metrics: list[Any] | None = None, params: list[Any] | None = None) -> None:
        if self.run_id is None:
            raise RuntimeError("MlflowTracker: the run is closed")
        self._client.log_batch(self.run_id, metrics=metrics or [], params=params or [])

    def log_config(self, resolved: Mapping[str, Any]) -> None:
        """Log flattened params (values cut at MLflow's length limit) and the YAML artifact."""
        from mlflow.entities import Param

        flat = flatten_config(resolved)
        params = [Param(_mlflow_key(k), str(v)[:_MLFLOW_MAX_PARAM_LEN]) for k, v in flat.items()]
        for i in range(0, len(params), _MLFLOW_MAX_PARAMS):
            self._log_batch(params=params[i : i + _MLFLOW_MAX_PARAMS])
        self._client.log_text(self.run_id, _config_yaml(resolved), "resolved_config.yaml")

    def _log_metrics(self, values: Mapping[str, float], step: int, prefix: str = "") -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_key(prefix + k), v, now, int(step)) for k, v in values.items()]
        if metrics:
            self._log_batch(metrics=metrics)

    def log_metrics(self, step: int, record: Mapping[str, Any]) -> None:
        """Log the numeric entries at ``step``."""
        self._log_metrics(numeric_metrics(record), step)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """Log final values as ``final/<name>`` metrics (step 0)."""
        self._log_metrics(numeric_metrics(summary, skip=()), 0, prefix=FINAL_PREFIX)

    def close(self, status: str = "success") -> None:
        """Mark the run terminated with the MLflow status matching ``status``."""
        _check_status(status)
        if self.run_id is None:
            return
        self._client.set_terminated(self.run_id, _MLFLOW_STATUS[status])
        self.run_id = None


class TrackerGroup:
    """Several trackers, called in order, behind the one protocol (an empty group is a no-op)."""

    def __init__(self, trackers: list[Tracker] | None = None) -> None:
        self.trackers: list[Tracker] = list(trackers or [])

    def __iter__(self) -> Iterator[Tracker]:
        return iter(self.trackers)

    def __len__(self) -> int:
        return len(self.trackers)

    def _each(self, method: str, *args: Any) -> None:
        for tracker in self.trackers:
            getattr(tracker, method)(*args)

    def log_config(self, resolved: Mapping[str, Any]) -> None:
        self._each("log_config", resolved)

    def log_metrics(self, step: int, record: Mapping[str, Any]) -> None:
        self._each("log_metrics", step, record)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        self._each("log_summary", summary)

    def close(self, status: str = "success") -> None:
        """Close every member; re-raise the first error after all were tried."""
        _check_status(status)
        first: BaseException | None = None
        for tracker in self.trackers:
            try:
                tracker.close(status)
            except Exception as exc:  # noqa: BLE001 - every tracker must get its close
                first = first or exc
        self.trackers = []
        if first is not None:
            raise first

    def with_prefix(self, prefix: str) -> PrefixedTracker:
        """A :class:`PrefixedTracker` view logging step metrics as ``<prefix>/<key>`` (one per phase)."""
        return PrefixedTracker(self, prefix)


class PrefixedTracker:
    """Forwards one phase's records, keys prefixed ``<prefix>/`` (``""``: unchanged), to a tracker it
    does not own (``close`` is a no-op; the config is forwarded unchanged)."""

    def __init__(self, inner: Tracker, prefix: str) -> None:
        self.inner = inner
        self.prefix = f"{prefix}/" if prefix else ""

    def log_config(self, resolved: Mapping[str, Any]) -> None:
        self.inner.log_config(resolved)

    def log_metrics(self, step: int, record: Mapping[str, Any]) -> None:
        self.inner.log_metrics(step, {f"{self.prefix}{k}": v for k, v in record.items() if k != "step"})

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        self.inner.log_summary({f"{self.prefix}{k}": v for k, v in summary.items()})

    def close(self, status: str = "success") -> None:
        _check_status(status)


def enabled_trackers(logger_cfg: Any) -> list[str]:
    """The sublist of ``["tensorboard", "wandb", "mlflow"]`` that the ``logger`` node enables (absent: disabled)."""
    return [name for name in _PACKAGES if bool(cfg_get(cfg_get(logger_cfg, name, None), "enabled", False))]


def check_trackers_available(logger_cfg: Any) -> None:
    """Fail before Ray starts when an enabled tracker's package is not installed (nothing is imported).

    Raises:
        TrackerUnavailableError: Naming each missing package, the key enabling it and the extra to install.
    """
    missing = []
    for name in enabled_trackers(logger_cfg):
        module, dist = _PACKAGES[name]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(f"logger.{name}.enabled=true needs the '{dist}' package")
    if missing:
        raise TrackerUnavailableError(
            f"{'; '.join(missing)}; install the tracking extra: {TRACKING_EXTRA} (or set the key to false)"
        )


def build_trackers(logger_cfg: Any, run_dir: str | os.PathLike[str]) -> TrackerGroup:
    """Build the enabled trackers of the ``logger`` node (default locations inside ``run_dir``).

    Raises:
        TrackerUnavailableError: An enabled tracker's package is missing.
    """
    check_trackers_available(logger_cfg)
    run_dir = Path(run_dir)
    group = TrackerGroup()
    builders: dict[str, Any] = {
        "tensorboard": lambda node: TensorBoardTracker(run_dir / str(cfg_get(node, "log_dir", "tensorboard"))),
        "wandb": lambda node: WandbTracker(run_dir, node),
        "mlflow": lambda node: MlflowTracker(run_dir, node),
    }
    try:
        for name in enabled_trackers(logger_cfg):
            group.trackers.append(builders[name](cfg_get(logger_cfg, name, None)))
    except BaseException:
        group.close("failed")
        raise
    return group
