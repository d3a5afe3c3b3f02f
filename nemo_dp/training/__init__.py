"""The run layer between the launchers and ``nemo_dp.algorithms``; names are loaded on first use so
that light modules (``hydra_task``, ``run_record``, ``sigterm``) do not import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_dp.utils.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_dp.algorithms.context import TrainContext, TrainHooks
    from nemo_dp.training.checkpointer import Checkpointer, load_start_state
    from nemo_dp.training.phases import Phase, main_phase, plan_phases, warm_start_phase
    from nemo_dp.training.run import (
        build_inputs,
        final_accuracy,
        make_policy,
        make_tokenizer,
        phase_checkpointer,
        phase_logger,
        run_phase,
        run_phases,
    )
    from nemo_dp.training.run_logger import RunLogger

#: The module that defines each re-exported name.
_MODULES: dict[str, tuple[str, ...]] = {
    "nemo_dp.algorithms.context": ("TrainContext", "TrainHooks"),
    "nemo_dp.training.checkpointer": ("Checkpointer", "load_start_state"),
    "nemo_dp.training.phases": ("Phase", "main_phase", "plan_phases", "warm_start_phase"),
    "nemo_dp.training.run": (
        "build_inputs", "final_accuracy", "make_policy", "make_tokenizer", "phase_checkpointer",
        "phase_logger", "run_phase", "run_phases",
    ),
    "nemo_dp.training.run_logger": ("RunLogger",),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}

__all__ = list(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
