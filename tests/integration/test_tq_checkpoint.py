"""TransferQueue checkpoints.

Save from the session system, drop the data, load into a freshly bootstrapped system and
compare bit-exactly (dense, jagged, bf16, object columns, tags and per-task cursors); check the
on-disk format (``manifest.json`` of ``nemo_dp.tq_data_plane`` v2 plus ``tensors.safetensors``,
nothing else: no pickle of the library's), that only the bootstrapping client may checkpoint, and that a load needs an
empty cluster-wide registry and a known format version.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from tensordict import NonTensorStack, TensorDict

from nemo_dp.data_plane.adapters.transfer_queue import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_FORMAT_VERSION,
    TQDataPlaneClient,
)

from nemo_dp.data_plane.adapters.transfer_queue.checkpoint_format import OLD_FILES
from nemo_dp.data_plane.typed_checkpoint import read_checkpoint

from tests.e2e.planted_pickle import plant_pickle

from .conftest import TQSession, tq_test_config

pytestmark = pytest.mark.timeout(300)


def _payload(n: int) -> tuple[list[str], TensorDict, list[dict[str, Any]]]:
    g = torch.Generator().manual_seed(3)
    ids = [f"ck{i}" for i in range(n)]
    rows = [torch.randint(0, 1000, (int(k),), generator=g) for k in torch.randint(1, 30, (n,), generator=g)]
    td = TensorDict(
        {
            "tokens": torch.nested.as_nested_tensor(rows, layout=torch.jagged),
            "dense": torch.randn(n, 5, generator=g),
            "bf16": torch.randn(n, 3, generator=g).to(torch.bfloat16),
            "reward": torch.randn(n, generator=g),
            "note": NonTensorStack(*[{"i": i, "s": "x" * i} for i in range(n)]),
        },
        batch_size=[n],
    )
    tags = [{"input_lengths": int(r.numel()), "row": i} for i, r in enumerate(rows)]
    return ids, td, tags


def _assert_equal(got: TensorDict, want: TensorDict) -> None:
    assert set(got.keys()) == set(want.keys())
    for name in want.keys():
        w, g = want.get(name), got.get(name)
        if isinstance(w, NonTensorStack):
            assert g.tolist() == w.tolist(), name
        elif w.is_nested:
            assert g.is_nested, name
            for a, b in zip(g.unbind(), w.unbind(), strict=True):
                assert a.dtype == b.dtype and torch.equal(a, b), name
        else:
            assert not g.is_nested and g.dtype == w.dtype and torch.equal(g, w), name


@ray.remote(num_cpus=0)
class _Attached:
    def __init__(self, cfg: Any) -> None:
        self.client = TQDataPlaneClient(cfg, bootstrap=False)

    def save(self, path: str) -> str:
        try:
            self.client.save_checkpoint(path)
        except RuntimeError as exc:
            return f"RuntimeError: {exc}"
        return "saved"

    def register(self, pid: str) -> None:
        self.client.register_partition(pid, ["x"], 1, ["t"])

    def close(self) -> None:
        self.client.close()


def test_save_clear_load_into_fresh_bootstrap_bit_exact(
    tq_session: TQSession, tq_pid: str, tmp_path: Path
) -> None:
    n = 10
    ids, td, tags = _payload(n)
    fields = list(td.keys())
    a = tq_session.client
    a.register_partition(tq_pid, fields, n, ["train", "ref"], grpo_group_size=5)
    a.put_samples(ids, tq_pid, td, tags=tags)
    early = a.claim_meta(tq_pid, "train", ["tokens"], 4, timeout_s=10)
    ck = tmp_path / "ck"
    a.save_checkpoint(ck, metadata={"step": 7, "run": "it"})

    manifest = json.loads((ck / "manifest.json").read_text())
    assert manifest["format"] == CHECKPOINT_FORMAT == "nemo_dp.tq_data_plane"
    assert manifest["format_version"] == CHECKPOINT_FORMAT_VERSION == 2
    assert manifest["backend"] == "simple"
    assert manifest["metadata"] == {"step": 7, "run": "it"}
    assert sorted(p.name for p in ck.rglob("*")) == ["manifest.json", "tensors.safetensors"]

    # Drop everything after the save: the checkpoint alone must carry the state.
    a.clear_samples(None, tq_pid)
    with pytest.raises(KeyError):
        a.get_samples(ids, tq_pid, fields)

    b = tq_session.fresh()
    assert b.load_checkpoint(ck) == {"step": 7, "run": "it"}
    assert b.list_sample_ids(tq_pid) == sorted(ids)
    order = ids[::-1]
    want = TensorDict({k: td.get(k) for k in fields}, batch_size=[n])[torch.tensor(list(range(n))[::-1])]
    _assert_equal(b.get_samples(order, tq_pid, fields), want)
    # Cursors: the rows claimed before the save stay claimed for "train" only.
    rest = b.claim_meta(tq_pid, "train", ["tokens"], n - 4, timeout_s=10)
    assert sorted(early.sample_ids + rest.sample_ids) == sorted(ids)
    assert b.claim_meta(tq_pid, "train", ["tokens"], 1, blocking=False).size == 0
    by_id = dict(zip(ids, tags, strict=True))
    assert rest.tags == [by_id[i] for i in rest.sample_ids]
    assert sorted(b.claim_meta(tq_pid, "ref", ["tokens"], n, timeout_s=10).sample_ids) == sorted(ids)
    # The registry came back too: schema checks, dtype checks and the partition's life cycle.
    with pytest.raises(TypeError, match="dense"):
        b.put_samples(ids[:1], tq_pid, TensorDict({"dense": torch.zeros(1, 5, dtype=torch.int64)}, batch_size=[1]))
    with pytest.raises(ValueError, match="already registered"):
        b.register_partition(tq_pid, ["x"], 1, [])
    with pytest.raises(RuntimeError, match="clean data-plane client"):
        b.load_checkpoint(ck)
    b.clear_samples(None, tq_pid)
    assert b.list_sample_ids(tq_pid) == []


def test_checkpoint_owner_registry_and_version_rules(tq_session: TQSession, tmp_path: Path) -> None:
    a = tq_session.client
    ck = tmp_path / "ck"
    a.save_checkpoint(ck, metadata={})
    actor = _Attached.remote(tq_test_config())
    try:
        outcome = ray.get(actor.save.remote(str(tmp_path / "by_worker")), timeout=120)
        assert outcome.startswith("RuntimeError") and "bootstrap" in outcome
        assert not (tmp_path / "by_worker").exists()
        ray.get(actor.close.remote(), timeout=60)
    finally:
        ray.kill(actor)

    # A clean client but a non-empty cluster-wide registry (another process registered).
    b = tq_session.fresh()
    actor = _Attached.remote(tq_test_config())
    try:
        ray.get(actor.register.remote("someone_elses"), timeout=120)
        with pytest.raises(RuntimeError, match="clean data-plane client"):
            b.load_checkpoint(ck)
        ray.get(actor.close.remote(), timeout=60)
    finally:
        ray.kill(actor)

    bad = tmp_path / "bad"
    shutil.copytree(ck, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["format_version"] = 999
    (bad / "manifest.json").write_text(json.dumps(manifest))
    c = tq_session.fresh()
    with pytest.raises(ValueError, match="999") as info:
        c.load_checkpoint(bad)
    assert "manifest.json" in str(info.value)


#: Every file name TransferQueue's own checkpoint (the adapter's format version 1) wrote.
OLD_TQ_FILES = (
    "tq/controller_state.pkl",
    "tq/metadata.json",
    "tq/simple_storage/su_0_TransferQueueStorageUnit#0.pkl",
    "tq/simple_storage/storage_unit_info.json",
    "tq/storage_units/su_0_0.pkl",
)


def test_load_never_reads_a_pickle_planted_in_the_checkpoint(
    tq_session: TQSession, tq_pid: str, tmp_path: Path
) -> None:
    a = tq_session.client
    a.register_partition(tq_pid, ["x"], 2, ["t"])
    a.put_samples(["a", "b"], tq_pid, TensorDict({"x": torch.arange(2)}, batch_size=[2]))
    ck = tmp_path / "ck"
    a.save_checkpoint(ck, metadata={})
    marker = tmp_path / "code_ran"
    planted: dict[str, Path] = {}
    for rel in OLD_TQ_FILES:
        bad = tmp_path / f"bad_{Path(rel).name}"
        shutil.copytree(ck, bad)
        planted[rel] = plant_pickle(bad, rel, marker)
        # The reader load_checkpoint runs first, before it touches the store (no system needed).
        with pytest.raises(ValueError, match="not part of its format") as info:
            read_checkpoint(bad, CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_VERSION, OLD_FILES)
        assert str(planted[rel]) in str(info.value)
        assert not marker.exists(), rel
    # The whole load through a clean client: refused the same way, before anything is restored.
    rel = OLD_TQ_FILES[0]
    b = tq_session.fresh()
    with pytest.raises(ValueError, match="not part of its format") as info:
        b.load_checkpoint(tmp_path / f"bad_{Path(rel).name}")
    assert str(planted[rel]) in str(info.value)
    assert not marker.exists()
    assert b.list_sample_ids(tq_pid) == []
    # The old format (version 1: the library's pickles, with its manifest) is refused unread.
    old = tmp_path / "old"
    old.mkdir()
    for rel in OLD_TQ_FILES:
        plant_pickle(old, rel, marker)
    (old / "manifest.json").write_text(
        json.dumps({"format": CHECKPOINT_FORMAT, "format_version": 1, "backend": "simple", "metadata": {}})
    )
    b = tq_session.fresh()
    with pytest.raises(ValueError, match="format_version 1") as info:
        b.load_checkpoint(old)
    assert "controller_state.pkl" in str(info.value) and str(old / "manifest.json") in str(info.value)
    assert not marker.exists()


def test_rows_with_different_fields_typed_objects_and_two_tasks_come_back(
    tq_session: TQSession, tq_pid: str, tmp_path: Path
) -> None:
    a = tq_session.client
    fields = ["tokens", "c128", "obj", "late"]
    a.register_partition(tq_pid, fields, 6, ["gen", "train"], enums={"late": ["yes", "no"]})
    ids = [f"r{i}" for i in range(6)]
    z = torch.randn(6, 2, dtype=torch.complex128)
    first = TensorDict(
        {
            "tokens": torch.nested.as_nested_tensor([torch.arange(i + 1) for i in range(6)], layout=torch.jagged),
            "c128": z,
            "obj": NonTensorStack(*[(i, {1: b"x" * i}, None) for i in range(6)]),
        },
        batch_size=[6],
    )
    a.put_samples(ids, tq_pid, first, tags=[{"i": i} for i in range(6)])
    a.put_samples(ids[1:3], tq_pid, TensorDict({"late": NonTensorStack("yes", "no")}, batch_size=[2]))
    gen = a.claim_meta(tq_pid, "gen", ["tokens"], 3, timeout_s=10).sample_ids
    train = a.claim_meta(tq_pid, "train", ["late"], 1, timeout_s=10).sample_ids
    before = a.get_samples(ids, tq_pid, ["tokens", "c128", "obj"])  # what the store gives back
    ck = tmp_path / "ck"
    a.save_checkpoint(ck, metadata={})

    b = tq_session.fresh()
    b.load_checkpoint(ck)
    got = b.get_samples(ids, tq_pid, ["tokens", "c128", "obj"])
    _assert_equal(got, before)
    _assert_equal(TensorDict({k: got.get(k) for k in ("tokens", "c128")}, batch_size=[6]), first.exclude("obj"))
    assert [type(v) for v in got.get("obj").tolist()] == [type(v) for v in before.get("obj").tolist()]
    assert b.get_samples(ids[1:3], tq_pid, ["late"]).get("late").tolist() == ["yes", "no"]
    with pytest.raises(KeyError, match="late"):
        b.get_samples(ids[:1], tq_pid, ["late"])
    # Each task's claims came back as they were: the rest, in the original order.
    assert b.claim_meta(tq_pid, "gen", ["tokens"], 3, timeout_s=10).sample_ids == [i for i in ids if i not in gen]
    assert b.claim_meta(tq_pid, "train", ["late"], 1, timeout_s=10).sample_ids == [i for i in ids[1:3] if i not in train]
    rest = b.claim_meta(tq_pid, "train", ["tokens"], 6 - 2, timeout_s=10)
    assert rest.tags == [{"i": int(s[1:])} for s in rest.sample_ids]
    # A checkpoint of the restored store is the same checkpoint (the re-claim marks are not in it).
    ck2 = tmp_path / "ck2"
    b.save_checkpoint(ck2, metadata={})
    m1, m2 = (json.loads((d / "manifest.json").read_text()) for d in (ck, ck2))
    assert [p["sample_ids"] for p in m1["partitions"]] == [p["sample_ids"] for p in m2["partitions"]]
    assert m2["partitions"][0]["field_types"] == m1["partitions"][0]["field_types"]
