"""Cross-process use of the TransferQueue adapter.

A Ray actor (``num_cpus=0``, a separate worker process) attaches with ``bootstrap=False`` to the
session system, reads the driver's partition bit-exactly (dense, jagged, scalar and string
columns, plus tags through a claim), writes a new column under the same ids that the driver
reads back bit-exactly; two consumer processes claiming from one partition never get the same
sample twice for one task; and attaching without a controller fails without creating one.
"""

from __future__ import annotations

from typing import Any

import pytest
import ray
import torch
from tensordict import NonTensorStack, TensorDict

from nemo_dp.data_plane.adapters import transfer_queue as tq_adapter
from nemo_dp.data_plane.adapters.transfer_queue import TQDataPlaneClient, tq_controller_exists

from .conftest import TQSession, tq_test_config

pytestmark = pytest.mark.timeout(240)


@ray.remote(num_cpus=0)
class _Consumer:
    """An attached data-plane client living in its own Ray worker process."""

    def __init__(self, cfg: Any) -> None:
        self.client = TQDataPlaneClient(cfg, bootstrap=False)

    def read(self, ids: list[str], pid: str, fields: list[str]) -> dict[str, Any]:
        td = self.client.get_samples(ids, pid, fields)
        out: dict[str, Any] = {}
        for name in fields:
            value = td.get(name)
            if isinstance(value, NonTensorStack):
                out[name] = ("objects", value.tolist())
            elif value.is_nested:
                out[name] = ("rows", [r.clone() for r in value.unbind()])
            else:
                out[name] = ("dense", value.clone())
        return out

    def claim_tags(self, pid: str, task: str, n: int) -> tuple[list[str], Any, Any]:
        meta = self.client.claim_meta(pid, task, ["tokens"], n, timeout_s=30)
        return meta.sample_ids, meta.tags, meta.sequence_lengths

    def write_adv(self, ids: list[str], pid: str) -> None:
        td = self.client.get_samples(ids, pid, ["logprobs", "reward"])
        rows = [lp * r for lp, r in zip(td["logprobs"].unbind(), td["reward"].tolist(), strict=True)]
        adv = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
        self.client.put_samples(ids, pid, TensorDict({"adv": adv}, batch_size=[len(ids)]))

    def claim_all(self, pid: str, task: str, batch: int) -> list[str]:
        got: list[str] = []
        while True:
            meta = self.client.claim_meta(pid, task, ["tokens"], batch, blocking=False)
            if meta.size == 0:
                return got
            got.extend(meta.sample_ids)

    def close(self) -> None:
        self.client.close()


def _jagged(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def test_attached_actor_reads_bit_exact_and_writes_back(
    tq_client: TQDataPlaneClient, tq_pid: str
) -> None:
    n = 12
    ids = [f"u{i}_g0" for i in range(n)]
    gen = torch.Generator().manual_seed(0)
    lens = [int(x) for x in torch.randint(3, 40, (n,), generator=gen)]
    tokens = [torch.randint(0, 50_000, (m,), generator=gen, dtype=torch.int64) for m in lens]
    logprobs = [torch.randn(m, generator=gen) for m in lens]
    dense = torch.randn(n, 6, generator=gen).to(torch.bfloat16)
    reward = torch.randn(n, generator=gen)
    names = [f"prompt-{i}-é" for i in range(n)]
    tags = [{"input_lengths": m, "status": "rollout_done"} for m in lens]
    tq_client.register_partition(
        tq_pid, ["tokens", "logprobs", "dense", "reward", "name", "adv"], n, ["train"]
    )
    tq_client.put_samples(
        ids,
        tq_pid,
        TensorDict(
            {
                "tokens": _jagged(tokens),
                "logprobs": _jagged(logprobs),
                "dense": dense,
                "reward": reward,
                "name": NonTensorStack(*names),
            },
            batch_size=[n],
        ),
        tags=tags,
    )
    actor = _Consumer.remote(tq_test_config())
    try:
        got = ray.get(actor.read.remote(ids, tq_pid, ["tokens", "logprobs", "dense", "reward", "name"]), timeout=120)
        assert got["tokens"][0] == "rows" and all(
            torch.equal(a, b) for a, b in zip(got["tokens"][1], tokens, strict=True)
        )
        assert got["logprobs"][0] == "rows" and all(
            torch.equal(a, b) for a, b in zip(got["logprobs"][1], logprobs, strict=True)
        )
        assert got["dense"][0] == "dense" and torch.equal(got["dense"][1], dense)
        assert got["reward"][0] == "dense" and torch.equal(got["reward"][1], reward)
        assert got["name"] == ("objects", names)

        claimed, claimed_tags, lengths = ray.get(actor.claim_tags.remote(tq_pid, "train", n), timeout=60)
        assert sorted(claimed) == sorted(ids)
        expected = dict(zip(ids, tags, strict=True))
        assert claimed_tags == [expected[i] for i in claimed]
        assert lengths == [expected[i]["input_lengths"] for i in claimed]

        ray.get(actor.write_adv.remote(ids, tq_pid), timeout=60)
        back = tq_client.get_samples(ids, tq_pid, ["adv"])
        for row, lp, r in zip(back["adv"].unbind(), logprobs, reward.tolist(), strict=True):
            assert torch.equal(row, lp * r)
        ray.get(actor.close.remote(), timeout=60)
    finally:
        ray.kill(actor)
    # The attached client's close left the driver's system running.
    assert tq_controller_exists()
    assert tq_client.list_sample_ids(tq_pid) == sorted(ids)


def test_two_consumer_processes_never_share_a_claim(tq_client: TQDataPlaneClient, tq_pid: str) -> None:
    n = 40
    ids = [f"c{i}" for i in range(n)]
    tq_client.register_partition(tq_pid, ["tokens"], n, ["t1", "t2"])
    tq_client.put_samples(ids, tq_pid, TensorDict({"tokens": torch.arange(n)}, batch_size=[n]))
    actors = [_Consumer.remote(tq_test_config()) for _ in range(2)]
    try:
        for task in ("t1", "t2"):
            parts = ray.get([a.claim_all.remote(tq_pid, task, 2) for a in actors], timeout=120)
            joined = parts[0] + parts[1]
            assert len(joined) == len(set(joined)), f"a sample was claimed twice for {task}"
            assert sorted(joined) == sorted(ids)
            assert tq_client.check_consumption_status(tq_pid, [task])
        ray.get([a.close.remote() for a in actors], timeout=60)
    finally:
        for a in actors:
            ray.kill(a)


def test_attach_without_controller_fails_and_creates_nothing(tq_session: TQSession) -> None:
    tq_session.close()
    assert not tq_controller_exists()
    try:
        with pytest.raises(RuntimeError, match="no TransferQueue controller.*bootstrap=True first"):
            TQDataPlaneClient(tq_test_config(), bootstrap=False)
        assert not tq_controller_exists()
        # The failed attach left nothing open in this process.
        assert tq_adapter.open_client() is None
    finally:
        assert tq_session.client is not None  # restore a live session system
