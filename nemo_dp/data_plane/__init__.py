"""The data plane: a per-sample key/value store for bulk tensors, and the helpers around it.

Public names resolve lazily (PEP 562), so importing the package never imports Ray or
TransferQueue; adapters are loaded only by the factory.
"""

from __future__ import annotations

from nemo_dp.utils.imports import lazy_exports

_EXPORTS: dict[str, str] = {
    "DataPlaneClient": "nemo_dp.data_plane.interfaces",
    "KVBatchMeta": "nemo_dp.data_plane.interfaces",
    "DataPlaneUnavailableError": "nemo_dp.data_plane.interfaces",
    "DataPlaneConfig": "nemo_dp.data_plane.interfaces",
    "LocalDataPlaneConfig": "nemo_dp.data_plane.interfaces",
    "DisabledDataPlaneConfig": "nemo_dp.data_plane.interfaces",
    "DataPlaneRuntimeConfig": "nemo_dp.data_plane.interfaces",
    "MetricsDataPlaneClient": "nemo_dp.data_plane.observability",
    "log_event": "nemo_dp.data_plane.observability",
    "build_data_plane_client": "nemo_dp.data_plane.factory",
    "data_plane_enabled": "nemo_dp.data_plane.factory",
    "materialize": "nemo_dp.data_plane.codec",
    "materialize_local": "nemo_dp.data_plane.codec",
    "is_local_batch_meta": "nemo_dp.data_plane.batch_columns",
    "PartitionLimitError": "nemo_dp.data_plane.interfaces",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return __all__
