"""The PPO critic: driver facade (``Value``) and its Ray worker (``ValueWorker``)."""

from __future__ import annotations

from nemo_dp.models.value.value import Value
from nemo_dp.models.value.worker import ValueWorker

__all__ = ["Value", "ValueWorker"]
