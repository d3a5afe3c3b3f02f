"""The TransferQueue adapter: the data-plane contract over TransferQueue 0.1.11 (SimpleStorage).

It turns the library's silent failures into the contract's errors, bounds every call and ships
tensor columns in a row-bytes layout (see ``client``).  This is the only package of nemo_dp that
imports ``transfer_queue``, lazily.  The library's ports are unauthenticated and unpickle what
they receive: trusted networks only; its own checkpoint files are pickles, never used here.
"""

from __future__ import annotations

from nemo_dp.data_plane.adapters.transfer_queue.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_FORMAT_VERSION,
)
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
