"""The policy: driver facade (``Policy``) and its Ray worker (``PolicyWorker``)."""

from __future__ import annotations

from nemo_dp.models.policy.policy import Policy
from nemo_dp.models.policy.worker import PolicyWorker

__all__ = ["Policy", "PolicyWorker"]
