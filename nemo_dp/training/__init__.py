"""The run layer: trainer context, phase planning, ``run_phase``, logging, checkpoints, trackers.

Sits between the launchers and ``nemo_dp.algorithms``; ``TrainContext`` is re-exported here.
The re-exports load on first use, so that a light module of the package (``hydra_task``,
``run_record``, ``sigterm``) does not import torch with the package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

#: Re-exported name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "TrainContext": "nemo_dp.algorithms.context",
    "TrainHooks": "nemo_dp.algorithms.context",
    "Checkpointer": "nemo_dp.training.checkpointer",
    "load_start_state": "nemo_dp.training.checkpointer",
    "Phase": "nemo_dp.training.phases",
    "main_phase": "nemo_dp.training.phases",
    "plan_phases": "nemo_dp.training.phases",
    "warm_start_phase": "nemo_dp.training.phases",
    "build_inputs": "nemo_dp.training.run",
    "final_accuracy": "nemo_dp.training.run",
    "make_policy": "nemo_dp.training.run",
    "make_tokenizer": "nemo_dp.training.run",
    "phase_checkpointer": "nemo_dp.training.run",
    "phase_logger": "nemo_dp.training.run",
    "run_phase": "nemo_dp.training.run",
    "run_phases": "nemo_dp.training.run",
    "RunLogger": "nemo_dp.training.run_logger",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import a re-exported name from its module on first access."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
