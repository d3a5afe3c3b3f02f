"""Trainer and policy selection for a config (the lookup is :mod:`nemo_dp.config.trainer_lookup`'s)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nemo_dp.config.trainer_lookup import TrainerNotAvailableError, master_data_plane, validate_trainer_selection
from nemo_dp.data_plane import registry
from nemo_dp.data_plane.factory import coerce_data_plane_config, data_plane_enabled
from nemo_dp.models.policy.tq_policy import TQPolicy
from nemo_dp.utils.imports import resolve_target

__all__ = ["describe_selection", "make_policy_factory", "select_sync_trainer"]


def select_sync_trainer(master_config: Any, *, label: str | None = None) -> Callable[..., Any]:
    """Pick and import the trainer for (algorithm, data plane); print exactly one progress line.

    Raises:
        ValueError: As :func:`~nemo_dp.config.trainer_lookup.validate_trainer_selection`.
        TrainerNotAvailableError: The pair is legal but its trainer module or function is missing.
    """
    selection = validate_trainer_selection(master_config, label=label)
    trainer = resolve_target(
        selection.target,
        f"the trainer for algorithm={selection.algorithm!r} with data_plane={selection.data_plane!r}",
        error=TrainerNotAvailableError,
    )
    print(selection.progress_line, flush=True)
    return trainer


def describe_selection(master_config: Any) -> dict[str, str]:
    """``{"backend", "trainer", "policy_factory"}`` naming what a config selects (raises as above)."""
    selection = validate_trainer_selection(master_config)
    spec = registry.backend(selection.data_plane)
    backend = spec.describe(coerce_data_plane_config(master_data_plane(master_config)))
    policy = f"{TQPolicy.__module__}:{TQPolicy.__qualname__}" if spec.enabled else "plain policy (no data plane)"
    return {"backend": backend, "trainer": selection.target, "policy_factory": policy}


def make_policy_factory(cfg: Any) -> Callable[..., Any] | None:
    """``None`` for a disabled data plane, else a constructor of ``TQPolicy(**kwargs, dp_cfg=cfg)`` (``cfg`` as given).

    Raises:
        ValueError: Unknown ``impl`` or invalid config (checked now, not at first call).
    """
    if not data_plane_enabled(cfg):
        return None
    coerce_data_plane_config(cfg)  # validate eagerly; the policy gets cfg exactly as given

    def _make_policy(**kwargs: Any) -> Any:
        return TQPolicy(**kwargs, dp_cfg=cfg)

    return _make_policy
