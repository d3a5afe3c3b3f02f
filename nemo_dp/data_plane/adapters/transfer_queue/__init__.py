"""The data-plane contract over TransferQueue 0.1.11 (SimpleStorage); the only package importing ``transfer_queue``.

The library's ports are unauthenticated and unpickle what they receive: trusted networks only.
"""

from __future__ import annotations

from nemo_dp.data_plane.adapters.transfer_queue.checkpoint_format import CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_VERSION
from nemo_dp.data_plane.adapters.transfer_queue.client import TQDataPlaneClient
from nemo_dp.data_plane.adapters.transfer_queue.lifetime import (
    CONTROLLER_NAME,
    CONTROLLER_NAMESPACE,
    STORAGE_UNIT_NAME_PREFIX,
    open_client,
    tq_controller_exists,
)
from nemo_dp.data_plane.adapters.transfer_queue.registry import REGISTRY_PARTITION

__all__ = [
    "TQDataPlaneClient",
    "REGISTRY_PARTITION",
    "CONTROLLER_NAME",
    "CONTROLLER_NAMESPACE",
    "STORAGE_UNIT_NAME_PREFIX",
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_FORMAT_VERSION",
    "open_client",
    "tq_controller_exists",
]
