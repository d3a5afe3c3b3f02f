"""Process-local data-plane adapter: a bounded store of complete batches inside one process.

Gives colocated SFT (the loader in the policy worker's process) the data-plane interface without
Ray or TransferQueue: at most ``max_partitions`` batches, each written by exactly one put, handed
out by id or through per-task claims, with exact, pickle-free checkpoints.  The re-exported
helpers live in ``batch_columns`` / ``codec`` so that they never import this adapter.
"""

from __future__ import annotations

from nemo_dp.data_plane.adapters.local.checkpoint import (
    LOCAL_CHECKPOINT_FORMAT,
    LOCAL_CHECKPOINT_VERSION,
    TENSORS_FILE,
)
from nemo_dp.data_plane.adapters.local.client import LocalDataPlaneClient, build_local_client
from nemo_dp.data_plane.batch_columns import is_local_batch_meta, local_batch_to_tensordict
from nemo_dp.data_plane.codec import materialize_local

__all__ = [
    "LocalDataPlaneClient",
    "build_local_client",
    "is_local_batch_meta",
    "local_batch_to_tensordict",
    "materialize_local",
    "LOCAL_CHECKPOINT_FORMAT",
    "LOCAL_CHECKPOINT_VERSION",
    "TENSORS_FILE",
]
