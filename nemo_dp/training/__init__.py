"""The run layer: trainer context, phase planning, ``run_phase``, logging, checkpoints, trackers.

Sits between the launchers and ``nemo_dp.algorithms``; ``TrainContext`` is re-exported here.
"""

from __future__ import annotations

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

__all__ = [
    "TrainContext",
    "TrainHooks",
    "Checkpointer",
    "RunLogger",
    "load_start_state",
    "Phase",
    "main_phase",
    "warm_start_phase",
    "plan_phases",
    "build_inputs",
    "final_accuracy",
    "make_policy",
    "make_tokenizer",
    "phase_checkpointer",
    "phase_logger",
    "run_phase",
    "run_phases",
]
