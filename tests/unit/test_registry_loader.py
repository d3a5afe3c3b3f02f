"""The colocated loader against a full store: typed ``PartitionLimitError``, nothing dropped.

The worker is a single-threaded Ray actor, so a store slot held by another user cannot be freed
while a loader call runs: a prefetch stops with the loader rewound, and the load a step needs
raises the typed error (never a string match, never a wait) and loads the same rows once the
slot is free.  The in-process workers of ``test_sft_sync_flow`` (real Local stores, no Ray)
isolate the loader from Ray and the model.
"""

from __future__ import annotations

import pytest

from nemo_dp.data_plane.interfaces import PartitionLimitError
from tests.unit.test_sft_sync_flow import _expected_blocks, _setup


def test_full_store_raises_the_typed_error_and_drops_nothing() -> None:
    _, _, workers, _ = _setup(max_partitions=1)
    w = workers[0]
    # Another user of the store holds its only slot.
    w.dp_client.register_partition("other", fields=["x"], num_samples=1, consumer_tasks=["train"])
    with pytest.raises(PartitionLimitError, match="partition limit"):
        w.load_sft_batch(0)
    assert w.colocated_loader_stats()["store_full"] == 1
    assert w.colocated_loader_stats()["live"] == []
    w.dp_client.clear_samples(None, "other")
    env = w.load_sft_batch(0, prefetch=False)
    assert env.source_ids == _expected_blocks(0)[0]  # the loader was rewound: same rows
    assert env.meta.partition_id == "sft_dp0_batch0"


def test_prefetch_into_a_full_store_stops_and_rewinds() -> None:
    _, _, workers, _ = _setup(max_partitions=2)
    w = workers[0]
    env0 = w.load_sft_batch(0, prefetch=False)
    w.dp_client.register_partition("other", fields=["x"], num_samples=1, consumer_tasks=["train"])
    assert w.prefetch_sft_batches() == 0  # the store's second slot is taken: no prefetch
    assert w.colocated_loader_stats()["store_full"] == 1
    w.dp_client.clear_samples(None, "other")
    w.commit_sft_batch(0)
    env1 = w.load_sft_batch(1, prefetch=False)
    assert env0.source_ids == _expected_blocks(0)[0]
    assert env1.source_ids == _expected_blocks(1)[0]  # nothing skipped by the failed prefetch
