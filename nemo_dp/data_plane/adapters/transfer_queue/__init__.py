"""The TransferQueue adapter: the data-plane contract over TransferQueue 0.1.11 (SimpleStorage).

Why this package exists: TransferQueue gives a cluster-wide, columnar key/value store on Ray,
but it is silent where the data-plane contract demands loud errors: a get with unknown keys
returns fewer rows, a misspelled field returns no column, a dtype change is only logged by the
controller, duplicate keys are rejected after the write, a dead controller hangs every call
forever and a dead storage unit for minutes.  This adapter keeps a cluster-wide partition
registry inside the library's own controller, checks every call against it and against the
controller's metadata before and after the wire call, runs the library's async API on one
event-loop thread it owns (so every call is bounded and the caller's ``torch.set_num_threads``
survives), ships tensor columns in a row-bytes layout that costs no message frame per row, and
gives dense puts back dense.

Modules, one job each: ``client`` (``TQDataPlaneClient`` and its direct-by-key calls),
``tasks`` (partitions, claims, consumption), ``registry`` (the cluster-wide partition
registry), ``validation`` (argument checks and wire transforms), ``row_wire`` (the row-bytes
layout: encoding puts, decoding gets) with ``row_split`` (its storage-unit half), ``lifetime``
(bootstrap, attach, the loop thread, teardown) and ``checkpoint`` with ``checkpoint_format``
(checkpoints read through the adapter and written as JSON + safetensors).

This is the **only** package of nemo_dp that imports ``transfer_queue``, and it does so lazily
(inside functions), never at module import.  The library's ports are unauthenticated and unpickle what
they receive: trusted networks only.  Its own checkpoint files are pickles, so the adapter never
writes nor reads them.
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
