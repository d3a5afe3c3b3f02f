"""Process-local data plane for colocated SFT, without Ray or TransferQueue.

At most ``max_partitions`` batches, each written by exactly one put, with exact, pickle-free checkpoints.
"""

from __future__ import annotations

from nemo_dp.data_plane.adapters.local.checkpoint import LOCAL_CHECKPOINT_FORMAT, LOCAL_CHECKPOINT_VERSION
from nemo_dp.data_plane.adapters.local.client import LocalDataPlaneClient, build_local_client
from nemo_dp.data_plane.batch_columns import is_local_batch_meta, local_batch_to_tensordict
from nemo_dp.data_plane.codec import materialize_local
from nemo_dp.data_plane.typed_checkpoint import TENSORS_FILE

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
