"""Process-local data-plane adapter: a bounded store of complete batches inside one process.

Why it exists: colocated SFT (a data loader living in the same process as the policy worker
that consumes its batches) needs the data-plane interface without Ray or TransferQueue.  This
adapter keeps at most ``max_partitions`` complete batches in memory, each written by exactly one
put, and hands them out by id or through per-task claims.  Its checkpoints are exact and
pickle-free (``checkpoint``: a typed JSON manifest plus a safetensors tensor table).  Modules:
``client`` (the ``LocalDataPlaneClient``), ``store`` (column structures), ``validation`` (input
checks and the pure halves of put and get) and ``checkpoint``.

Storage and copies (why the data paths look the way they do):

* A put stores exactly one copy per column: dense tensors as one detached contiguous CPU clone,
  jagged (``torch.jagged``) tensors as a compact ``values``/``offsets`` pair, non-tensor columns
  as a deep-copied Python list.  Stored tensors are never mutated afterwards, so reads can
  gather from them without holding the lock.
* A get returns fresh tensors (never views of the store): a whole stored column in stored order
  or any contiguous run of rows is one ``clone`` of a slice; any other selection is one
  ``index_select`` gather.  Callers may therefore modify what they get without corrupting the
  store.  Non-tensor columns come back as one ``NonTensorData`` per column holding a deep copy
  of the selected rows as a list (read them with ``materialize_local``, re-exported here from
  ``codec``).
* A partition left without rows by an explicit ``clear_samples(ids, pid)`` is dropped, exactly
  as by ``clear_samples(None, pid)``: it can never take another put, so keeping it would only
  hold a ``max_partitions`` slot.

Helpers re-exported for callers of this package: ``is_local_batch_meta`` (does a meta come from
this adapter?), ``local_batch_to_tensordict`` (turn a loader batch into the TensorDict a put
expects) and ``materialize_local`` (turn a read into trainer columns); they live in
``nemo_dp.data_plane.batch_columns`` / ``codec`` so that helpers never import this adapter.
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
