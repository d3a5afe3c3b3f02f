"""Adapter-independent ``DataPlaneClient`` contract tests.

Why a base class: the Local and the TransferQueue adapters must behave identically wherever the
contract does not say otherwise, so the same tests run against both.  ``DataPlaneContract`` has
no ``Test`` prefix and is never collected by itself; each adapter's test module subclasses it
and provides the fixtures below.

Fixtures a subclass must provide:

* ``client`` -- a live client for data operations (may be shared between tests: every test uses
  its own partition ids, built from the ``pid`` fixture).
* ``fresh_client`` -- a factory ``() -> DataPlaneClient`` returning a client on which no data
  operation has run.  The factory may close every client obtained earlier from it or from
  ``client``; tests therefore finish with one client before asking for the next.
* ``read_table`` -- ``(TensorDict) -> BatchedDataDict``: the materialiser matching the adapter
  (``materialize_local`` for Local, ``materialize`` for TransferQueue).

``SessionContract`` provides all three from one ``session`` fixture for the cluster backends.

Class attribute a subclass must set:

* ``supports_write_back: bool`` -- ``True`` if a second put to the same ids adds/overwrites
  columns and an emptied partition stays live for more puts (TransferQueue); ``False`` if every
  partition takes exactly one put, a second one is rejected with "duplicate writes", and a
  partition whose last row is cleared by explicit ids is dropped (Local).
* ``old_checkpoint: tuple[int, str]`` -- an older checkpoint format version of the adapter and a
  file (relative path) it held that can run code when loaded (a pickle); such a checkpoint is
  refused without reading any of its files.

Rules the tests follow so they hold on both adapters: every partition receives exactly one
successful put of exactly ``num_samples`` rows (except where ``supports_write_back`` decides);
claimed rows are aligned by id, never by position; values are compared bit-exactly after the
adapter's materialiser; each error is asserted by type and the contract's message fragment.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from nemo_dp.data_plane.codec import materialize
from nemo_dp.data_plane.interfaces import DataPlaneClient, KVBatchMeta
from nemo_dp.utils import checkpoint_io

# ---------------------------------------------------------------------------------------------
# test data
# ---------------------------------------------------------------------------------------------

FIELDS = ["x", "y", "h", "r", "s", "input_lengths"]


@dataclass
class Batch:
    """One put's worth of rows plus per-row expectations for any read order."""

    ids: list[str]
    td: TensorDict
    rows: dict[str, list[Any]]
    kinds: dict[str, str]  # "dense" | "ragged" | "object"
    tags: list[dict[str, Any]] | None = None
    lengths: list[int] = field(default_factory=list)

    def expected(self, ids: Sequence[str], fields: Sequence[str]) -> dict[str, Any]:
        pos = {sid: i for i, sid in enumerate(self.ids)}
        out: dict[str, Any] = {}
        for f in fields:
            rows = [self.rows[f][pos[sid]] for sid in ids]
            kind = self.kinds[f]
            if kind == "dense":
                out[f] = torch.stack(rows)
            elif kind == "ragged":
                width = max(r.shape[0] for r in rows)
                padded = torch.zeros((len(rows), width), dtype=rows[0].dtype)
                for i, r in enumerate(rows):
                    padded[i, : r.shape[0]] = r
                out[f] = padded
            else:
                out[f] = rows
        return out


def make_batch(n: int = 4, *, seed: int = 0, with_tags: bool = True, prefix: str = "s") -> Batch:
    """A batch with every leaf kind: 2-D float32, 1-D int64, 2-D bf16, ragged int64, str objects.

    Tags carry ``input_lengths`` (equal to the ``input_lengths`` column) and a per-row marker.
    """
    g = torch.Generator().manual_seed(seed)
    ids = [f"{prefix}{i}_{uuid.uuid4().hex[:6]}" for i in range(n)]
    x = torch.randn(n, 3, generator=g)
    y = torch.randint(-(2**40), 2**40, (n,), generator=g, dtype=torch.int64)
    h = torch.randn(n, 2, generator=g).to(torch.bfloat16)
    lengths = [int(v) for v in torch.randint(1, 6, (n,), generator=g)]
    ragged = [torch.randint(0, 1000, (k,), generator=g, dtype=torch.int64) for k in lengths]
    s = [f"text-{i}-{'z' * i}" for i in range(n)]
    td = TensorDict(
        {
            "x": x,
            "y": y,
            "h": h,
            "r": torch.nested.nested_tensor([r.clone() for r in ragged], layout=torch.jagged),
            "s": NonTensorStack.from_list(list(s)),
            "input_lengths": torch.tensor(lengths, dtype=torch.int64),
        },
        batch_size=(n,),
    )
    rows: dict[str, list[Any]] = {
        "x": list(x.unbind(0)),
        "y": list(y.unbind(0)),
        "h": list(h.unbind(0)),
        "r": ragged,
        "s": s,
        "input_lengths": [torch.tensor(k, dtype=torch.int64) for k in lengths],
    }
    kinds = {"x": "dense", "y": "dense", "h": "dense", "r": "ragged", "s": "object", "input_lengths": "dense"}
    tags = [{"input_lengths": k, "row": i, "name": f"n{i}"} for i, k in enumerate(lengths)] if with_tags else None
    return Batch(ids=ids, td=td, rows=rows, kinds=kinds, tags=tags, lengths=lengths)


def dense_td(n: int, *, dtype: torch.dtype = torch.float32, name: str = "x") -> TensorDict:
    return TensorDict({name: torch.arange(n * 2, dtype=dtype).reshape(n, 2)}, batch_size=(n,))


def assert_table(table: Any, expected: dict[str, Any]) -> None:
    """Bit-exact comparison of a materialised read with expected columns (same keys)."""
    assert sorted(table.keys()) == sorted(expected.keys())
    for name, want in expected.items():
        got = table[name]
        if isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor), f"{name}: got {type(got).__name__}"
            assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
            assert tuple(got.shape) == tuple(want.shape), f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
            assert torch.equal(got, want), f"{name}: values differ"
        else:
            assert list(got) == list(want), f"{name}: {list(got)!r} != {list(want)!r}"


MM_FIELDS = ["img", "pix", "feat", "input_lengths"]


@dataclass
class MultimodalBatch:
    """Rows of a multimodal put: per-sample images of different shapes and PackedTensor entries."""

    ids: list[str]
    td: TensorDict
    images: list[torch.Tensor]
    entries: list[torch.Tensor | None]
    feats: list[torch.Tensor]


def make_multimodal_batch(n: int = 6, *, seed: int = 0) -> MultimodalBatch:
    """``img``: one uint8 ``(3, H_i, W_i)`` image per sample; ``pix``: one bf16 PackedTensor
    entry per sample (``None`` for every third); ``feat``: float32 rows of different lengths
    and widths; ``input_lengths`` for presharding."""
    from nemo_dp.data.multimodal_utils import PackedTensor

    g = torch.Generator().manual_seed(seed)
    ids = [f"mm{i}_{uuid.uuid4().hex[:6]}" for i in range(n)]
    images = [
        torch.randint(0, 256, (3, 2 + (i % 3), 3 + (i * 2) % 5), generator=g, dtype=torch.uint8)
        for i in range(n)
    ]
    entries: list[torch.Tensor | None] = [
        None if i % 3 == 2 else torch.randn(1 + i, 4, generator=g).to(torch.bfloat16) for i in range(n)
    ]
    feats = [torch.randn(1 + i % 2, 2 + i, generator=g) for i in range(n)]
    td = TensorDict(
        {
            "img": NonTensorStack.from_list([t.clone() for t in images]),
            "pix": NonTensorStack.from_list(
                [PackedTensor([None if e is None else e.clone()], 0) for e in entries]
            ),
            "feat": NonTensorStack.from_list([t.clone() for t in feats]),
            "input_lengths": torch.tensor([2 + i for i in range(n)], dtype=torch.int64),
        },
        batch_size=(n,),
    )
    return MultimodalBatch(ids, td, images, entries, feats)


def assert_multimodal_rows(table: Any, batch: MultimodalBatch, ids: Sequence[str]) -> None:
    """Every requested row of a materialised multimodal read equals what was put, bit for bit."""
    from nemo_dp.data.multimodal_utils import PackedTensor

    pos = [batch.ids.index(sid) for sid in ids]

    def same(got: Any, want: torch.Tensor | None, what: str) -> None:
        if want is None:
            assert got is None, f"{what}: expected None, got {type(got).__name__}"
            return
        assert isinstance(got, torch.Tensor), f"{what}: got {type(got).__name__}"
        assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), (
            f"{what}: {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}"
        )
        assert torch.equal(got.view(torch.uint8) if got.dim() else got, want.view(torch.uint8) if want.dim() else want), f"{what}: bytes differ"

    if "img" in table:
        assert len(table["img"]) == len(ids)
        for got, p in zip(list(table["img"]), pos):
            same(got, batch.images[p], f"img row {p}")
    if "feat" in table:
        for got, p in zip(list(table["feat"]), pos):
            same(got, batch.feats[p], f"feat row {p}")
    if "pix" in table:
        packed = table["pix"]
        assert type(packed) is PackedTensor, f"pix: got {type(packed).__name__}"
        assert len(packed) == len(ids) and packed.dim_to_pack == 0
        for got, p in zip(packed.tensors, pos):
            same(got, batch.entries[p], f"pix row {p}")


def run_in_threads(target: Callable[[int], None], n: int, *, join_s: float = 60.0) -> None:
    """Run ``target(i)`` for ``i < n`` in ``n`` threads; assert none hangs past ``join_s`` or raises."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # surfaced in the calling thread below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def message(exc_info: pytest.ExceptionInfo[BaseException]) -> str:
    """The exception's message (``KeyError`` str() adds quotes, args[0] does not)."""
    args = exc_info.value.args
    return str(args[0]) if args else str(exc_info.value)


# ---------------------------------------------------------------------------------------------
# the contract
# ---------------------------------------------------------------------------------------------


class _Payload:
    """A pickle whose loading creates ``marker`` (what a malicious checkpoint file would run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


class DataPlaneContract:
    """Contract tests valid for every adapter; subclass and provide the fixtures (see module)."""

    supports_write_back: bool
    old_checkpoint: tuple[int, str]

    @pytest.fixture
    def pid(self) -> str:
        return f"ct_{uuid.uuid4().hex[:12]}"

    # --- helpers ------------------------------------------------------------------------------
    def _register(
        self,
        client: DataPlaneClient,
        pid: str,
        n: int = 4,
        fields: Sequence[str] = FIELDS,
        tasks: Sequence[str] = ("t1", "t2"),
        **kwargs: Any,
    ) -> None:
        client.register_partition(pid, list(fields), n, list(tasks), **kwargs)

    def _put_batch(self, client: DataPlaneClient, pid: str, n: int = 4, **kwargs: Any) -> tuple[Batch, KVBatchMeta]:
        batch = make_batch(n, **kwargs)
        self._register(client, pid, n)
        receipt = client.put_samples(batch.ids, pid, batch.td, tags=batch.tags)
        return batch, receipt

    # --- round trip -----------------------------------------------------------------------
    def test_round_trip_and_requested_order(self, client: DataPlaneClient, pid: str, read_table: Callable) -> None:
        batch, _ = self._put_batch(client, pid, n=5, seed=1)
        out = client.get_samples(batch.ids, pid, FIELDS)
        assert tuple(out.batch_size) == (5,)
        assert_table(read_table(out), batch.expected(batch.ids, FIELDS))
        order = [batch.ids[3], batch.ids[0], batch.ids[4]]
        out = client.get_samples(order, pid, ["x", "r", "s"])
        assert tuple(out.batch_size) == (3,)
        assert sorted(out.keys()) == ["r", "s", "x"]
        assert_table(read_table(out), batch.expected(order, ["x", "r", "s"]))

    def test_get_returns_independent_copies(self, client: DataPlaneClient, pid: str, read_table: Callable) -> None:
        batch, _ = self._put_batch(client, pid, seed=2)
        want = batch.expected(batch.ids, ["x"])
        batch.td.get("x").add_(100.0)  # the caller's tensor after the put
        first = client.get_samples(batch.ids, pid, ["x"])
        first.get("x").mul_(0.0)  # the caller's copy of a read
        assert_table(read_table(client.get_samples(batch.ids, pid, ["x"])), want)

    def test_object_column_round_trip(self, client: DataPlaneClient, pid: str, read_table: Callable) -> None:
        values = [{"a": 1, "b": [1, 2]}, None, "z", {"nested": {"k": "v"}}]
        client.register_partition(pid, ["o"], 4, ["t"])
        ids = ["a", "b", "c", "d"]
        client.put_samples(ids, pid, TensorDict({"o": NonTensorStack.from_list(list(values))}, batch_size=(4,)))
        table = read_table(client.get_samples(["d", "b", "a"], pid, ["o"]))
        assert list(table["o"]) == [values[3], values[1], values[0]]

    def test_non_tensor_str_column_round_trips(self, client: DataPlaneClient, pid: str, read_table: Callable) -> None:
        batch, _ = self._put_batch(client, pid, seed=3)
        order = list(reversed(batch.ids))
        table = read_table(client.get_samples(order, pid, ["s"]))
        assert list(table["s"]) == batch.expected(order, ["s"])["s"]
        assert all(isinstance(v, str) for v in table["s"])

    def test_concurrent_reads_from_threads(self, client: DataPlaneClient, pid: str, read_table: Callable) -> None:
        batch, _ = self._put_batch(client, pid, n=8, seed=4)
        want = batch.expected(batch.ids, ["x", "r"])

        def reader(_: int) -> None:
            for _ in range(5):
                assert_table(read_table(client.get_samples(batch.ids, pid, ["x", "r"])), want)
                assert client.list_sample_ids(pid) == sorted(batch.ids)

        run_in_threads(reader, 4)

    # --- list_sample_ids -----------------------------------------------------------------
    def test_list_sample_ids(self, client: DataPlaneClient, pid: str) -> None:
        assert client.list_sample_ids(pid) == []  # unknown partition
        self._register(client, pid, n=4)
        assert client.list_sample_ids(pid) == []  # registered, empty
        ids = ["d", "b", "c", "a"]
        client.put_samples(ids, pid, dense_td(4))
        assert client.list_sample_ids(pid) == ["a", "b", "c", "d"]
        assert client.list_sample_ids(pid) == ["a", "b", "c", "d"]
        # listing moved no cursor: a claim still sees every row
        meta = client.claim_meta(pid, "t1", ["x"], 4, blocking=False)
        assert sorted(meta.sample_ids) == ["a", "b", "c", "d"]
        client.clear_samples(None, pid)
        assert client.list_sample_ids(pid) == []

    # --- register_partition ---------------------------------------------------------------
    def test_register_rules(self, client: DataPlaneClient, pid: str) -> None:
        self._register(client, pid, n=2)
        with pytest.raises(ValueError) as ei:
            self._register(client, pid, n=2)
        assert pid in message(ei) and "already registered" in message(ei)
        client.put_samples(["a", "b"], pid, dense_td(2))
        client.clear_samples(None, pid)
        self._register(client, pid, n=3, fields=["x"], tasks=["only"])
        assert client.list_sample_ids(pid) == []
        client.put_samples(["c", "d", "e"], pid, dense_td(3))
        assert client.list_sample_ids(pid) == ["c", "d", "e"]

        other = pid + "_b"
        with pytest.raises(ValueError, match="must be unique"):
            client.register_partition(other, ["x", "x"], 2, ["t"])
        with pytest.raises(ValueError, match="must be unique"):
            client.register_partition(other, ["x"], 2, ["t", "t"])
        for bad in (0, -1):
            with pytest.raises(ValueError):
                client.register_partition(other, ["x"], bad, ["t"])
        for bad_group in (0, 3):
            with pytest.raises(ValueError):
                client.register_partition(other, ["x"], 4, ["t"], grpo_group_size=bad_group)
        # none of the rejected registrations created the partition
        with pytest.raises(KeyError):
            client.clear_samples(None, other)
        # empty field and task lists are allowed; a dividing group size is accepted
        client.register_partition(other, [], 4, [], grpo_group_size=2)
        client.clear_samples(None, other)

    def test_ids_and_names_must_be_non_empty_strings(self, client: DataPlaneClient, pid: str) -> None:
        with pytest.raises(ValueError):
            client.register_partition("", ["x"], 1, ["t"])
        with pytest.raises(TypeError):
            client.register_partition(7, ["x"], 1, ["t"])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="__nemo_dp"):
            client.register_partition("__nemo_dp_mine", ["x"], 1, ["t"])
        with pytest.raises(TypeError):
            client.register_partition(pid, ["x", 3], 1, ["t"])  # type: ignore[list-item]
        with pytest.raises(ValueError):
            client.register_partition(pid, ["x", ""], 1, ["t"])
        with pytest.raises(ValueError):
            client.register_partition(pid, ["x"], 1, [""])
        self._register(client, pid, n=2)
        with pytest.raises(TypeError):
            client.put_samples(["a", 5], pid, dense_td(2))  # type: ignore[list-item]
        with pytest.raises(ValueError):
            client.put_samples(["a", ""], pid, dense_td(2))
        assert client.list_sample_ids(pid) == []

    def test_enums(self, client: DataPlaneClient, pid: str, read_table: Callable) -> None:
        with pytest.raises(ValueError):
            client.register_partition(pid, ["status"], 3, ["t"], enums={"nope": ["a"]})
        with pytest.raises(ValueError):
            client.register_partition(pid, ["status"], 3, ["t"], enums={"status": ["ok", "ok"]})
        client.register_partition(pid, ["status", "x"], 3, ["t"], enums={"status": ["ok", "bad", "late"]})
        ids = ["a", "b", "c"]

        def td(values: list[Any]) -> TensorDict:
            return TensorDict(
                {"status": NonTensorStack.from_list(values), "x": torch.zeros(3, 1)}, batch_size=(3,)
            )

        with pytest.raises(ValueError) as ei:
            client.put_samples(ids, pid, td(["ok", "weird", "bad"]))
        assert "status" in message(ei) and "weird" in message(ei)
        assert client.list_sample_ids(pid) == []
        client.put_samples(ids, pid, td(["late", "ok", "late"]))
        table = read_table(client.get_samples(["c", "b", "a"], pid, ["status"]))
        assert list(table["status"]) == ["late", "ok", "late"]

    # --- unknown partition ---------------------------------------------------------------
    def test_unknown_partition_raises_key_error_naming_it(self, client: DataPlaneClient, pid: str) -> None:
        meta = KVBatchMeta(pid, "t1", ["a"], fields=["x"], extra_info={"local_partition_generation": 1})
        calls: list[Callable[[], Any]] = [
            lambda: client.claim_meta(pid, "t1", ["x"], 1, blocking=False),
            lambda: client.get_data(meta),
            lambda: client.check_consumption_status(pid, ["t1"]),
            lambda: client.put_samples(["a"], pid, dense_td(1)),
            lambda: client.get_samples(["a"], pid, ["x"]),
            lambda: client.clear_samples(["a"], pid),
            lambda: client.clear_samples(None, pid),
        ]
        for call in calls:
            with pytest.raises(KeyError) as ei:
                call()
            assert repr(pid) in message(ei)

    def test_unknown_partition_is_checked_before_arguments(self, client: DataPlaneClient, pid: str) -> None:
        # Error precedence: closed -> unknown partition -> argument validity
        calls: list[Callable[[], Any]] = [
            lambda: client.claim_meta(pid, "no_task", [], 0, timeout_s=-1),
            lambda: client.put_samples(["a", "a"], pid, None, None),
            lambda: client.get_samples(["a", "a"], pid, []),
            lambda: client.clear_samples(["a", "a"], pid),
            lambda: client.check_consumption_status(pid, []),
            lambda: client.get_data(KVBatchMeta(pid, None, ["a"])),
        ]
        for call in calls:
            with pytest.raises(KeyError) as ei:
                call()
            assert repr(pid) in message(ei)

    # --- put validation ------------------------------------------------------------------
    def test_rejected_puts_write_nothing(self, client: DataPlaneClient, pid: str, read_table: Callable) -> None:
        client.register_partition(pid, ["x", "y"], 3, ["t"])
        ids = ["a", "b", "twice"]
        good = TensorDict({"x": torch.arange(6.0).reshape(3, 2)}, batch_size=(3,))
        with pytest.raises(ValueError) as ei:
            client.put_samples(["twice", "b", "twice"], pid, good)
        assert "twice" in message(ei)
        assert client.list_sample_ids(pid) == []
        with pytest.raises(ValueError) as ei:
            client.put_samples(ids, pid, TensorDict({"x": torch.zeros(3, 2), "zz": torch.zeros(3)}, batch_size=(3,)))
        assert "zz" in message(ei)
        with pytest.raises(ValueError):
            client.put_samples(ids, pid, dense_td(2))  # batch mismatch
        with pytest.raises(ValueError):
            client.put_samples(ids, pid, good, tags=[{"k": 1}, {"k": 2}])  # tags mismatch
        with pytest.raises(ValueError):
            client.put_samples(ids, pid, None, None)
        with pytest.raises(TypeError):
            client.put_samples(ids, pid, good, tags=[{"k": object()}, {}, {}])  # not JSON
        nested = TensorDict({"x": TensorDict({"inner": torch.zeros(3)}, batch_size=(3,))}, batch_size=(3,))
        with pytest.raises(TypeError):
            client.put_samples(ids, pid, nested)
        assert client.list_sample_ids(pid) == []
        # nothing of the rejected puts (rows, columns, tags) is visible after a valid put
        client.put_samples(ids, pid, good)
        assert client.list_sample_ids(pid) == ids
        assert_table(read_table(client.get_samples(ids, pid, ["x"])), {"x": torch.arange(6.0).reshape(3, 2)})
        with pytest.raises(KeyError):
            client.get_samples(ids, pid, ["y"])
        meta = client.claim_meta(pid, "t", ["x"], 3, blocking=False)
        assert meta.tags is None

    def test_dtype_and_kind_changes_are_type_errors(self, client: DataPlaneClient, pid: str, read_table: Callable) -> None:
        client.register_partition(pid, ["x", "s"], 2, ["t"])
        ids = ["a", "b"]
        client.put_samples(
            ids,
            pid,
            TensorDict({"x": torch.ones(2, 2), "s": NonTensorStack.from_list(["u", "v"])}, batch_size=(2,)),
        )
        with pytest.raises(TypeError) as ei:
            client.put_samples(ids, pid, TensorDict({"x": torch.zeros(2, 2, dtype=torch.int64)}, batch_size=(2,)))
        assert "x" in message(ei) and "float32" in message(ei) and "int64" in message(ei)
        with pytest.raises(TypeError) as ei:
            client.put_samples(ids, pid, TensorDict({"s": torch.zeros(2)}, batch_size=(2,)))
        assert "s" in message(ei)
        table = read_table(client.get_samples(ids, pid, ["x", "s"]))
        assert_table(table, {"x": torch.ones(2, 2), "s": ["u", "v"]})

    # --- get_samples ---------------------------------------------------------------------
    def test_get_samples_errors(self, client: DataPlaneClient, pid: str) -> None:
        client.register_partition(pid, ["x", "y"], 4, ["t"])
        ids = ["a", "b", "cleared_row", "d"]
        client.put_samples(ids, pid, dense_td(4))
        for bad in ([], None):
            with pytest.raises(ValueError):
                client.get_samples(ids, pid, bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            client.get_samples(["a", "b", "a"], pid, ["x"])
        with pytest.raises(KeyError) as ei:
            client.get_samples(["a", "ghost", "b"], pid, ["x"])
        assert "ghost" in message(ei)
        client.clear_samples(["cleared_row"], pid)
        with pytest.raises(KeyError) as ei:
            client.get_samples(["a", "cleared_row"], pid, ["x"])
        assert "cleared_row" in message(ei)
        with pytest.raises(KeyError) as ei:
            client.get_samples(["a"], pid, ["x", "y"])  # declared, never produced
        assert "y" in message(ei)
        with pytest.raises(KeyError) as ei:
            client.get_samples(["a"], pid, ["xx"])  # misspelled
        assert "xx" in message(ei)
        empty = client.get_samples([], pid, ["x"])
        assert isinstance(empty, TensorDict)
        assert tuple(empty.batch_size) == (0,)
        assert list(empty.keys()) == []

    # --- get_data field resolution -------------------------------------------------------
    def test_get_data_field_resolution(self, client: DataPlaneClient, pid: str, read_table: Callable) -> None:
        batch, receipt = self._put_batch(client, pid, seed=5)
        no_fields = KVBatchMeta(pid, "t1", list(batch.ids), fields=None, extra_info=dict(receipt.extra_info))
        with pytest.raises(ValueError) as ei:
            client.get_data(no_fields)
        assert "select_fields" in message(ei) and "fields" in message(ei)
        with pytest.raises(ValueError):
            client.get_data(no_fields, select_fields=[])
        assert_table(read_table(client.get_data(no_fields, ["x"])), batch.expected(batch.ids, ["x"]))
        narrowed = KVBatchMeta(pid, "t1", batch.ids[::-1], fields=["y", "s"], extra_info=dict(receipt.extra_info))
        assert_table(read_table(client.get_data(narrowed)), batch.expected(batch.ids[::-1], ["y", "s"]))
        # select_fields wins over meta.fields
        assert_table(read_table(client.get_data(narrowed, ["h"])), batch.expected(batch.ids[::-1], ["h"]))
        # get_data moves no cursor
        claimed = client.claim_meta(pid, "t1", ["x"], 4, blocking=False)
        assert sorted(claimed.sample_ids) == sorted(batch.ids)

    # --- claims -------------------------------------------------------------------
    def test_claims_and_consumption(self, client: DataPlaneClient, pid: str, read_table: Callable) -> None:
        batch, receipt = self._put_batch(client, pid, seed=6)
        assert client.check_consumption_status(pid, ["t1"]) is False
        first = client.claim_meta(pid, "t1", ["x", "r"], 2)
        assert first.size == 2
        assert first.task_name == "t1" and first.fields == ["x", "r"]
        assert client.check_consumption_status(pid, ["t1"]) is False
        second = client.claim_meta(pid, "t1", ["x"], 2)
        assert set(first.sample_ids).isdisjoint(second.sample_ids)
        assert sorted(first.sample_ids + second.sample_ids) == sorted(batch.ids)
        # the same task never re-claims; non-blocking on nothing ready -> empty meta
        empty = client.claim_meta(pid, "t1", ["x"], 1, blocking=False)
        assert empty.sample_ids == [] and empty.fields == ["x"] and empty.task_name == "t1"
        assert client.check_consumption_status(pid, ["t1"]) is True
        assert client.check_consumption_status(pid, ["t1", "t2"]) is False
        # another task claims independently
        other = client.claim_meta(pid, "t2", ["s"], 4)
        assert sorted(other.sample_ids) == sorted(batch.ids)
        assert client.check_consumption_status(pid, ["t1", "t2"]) is True
        # claim metas carry the stored tags and lengths of their rows (aligned by id)
        by_id = dict(zip(batch.ids, batch.tags or []))
        for meta in (first, second, other):
            assert meta.tags == [by_id[sid] for sid in meta.sample_ids]
            assert meta.sequence_lengths == [by_id[sid]["input_lengths"] for sid in meta.sample_ids]
        # claimed rows stay readable
        assert_table(read_table(client.get_data(first)), batch.expected(first.sample_ids, ["x", "r"]))
        assert client.list_sample_ids(pid) == sorted(batch.ids)

    def test_claim_argument_errors(self, client: DataPlaneClient, pid: str) -> None:
        self._put_batch(client, pid, seed=7)
        with pytest.raises(KeyError) as ei:
            client.claim_meta(pid, "nope", ["x"], 1, blocking=False)
        assert "task" in message(ei) and "nope" in message(ei)
        with pytest.raises(KeyError) as ei:
            client.check_consumption_status(pid, ["t1", "nope"])
        assert "task" in message(ei) and "nope" in message(ei)
        with pytest.raises(ValueError):
            client.check_consumption_status(pid, [])
        with pytest.raises(ValueError):
            client.claim_meta(pid, "t1", [], 1, blocking=False)
        with pytest.raises(ValueError):
            client.claim_meta(pid, "t1", ["undeclared"], 1, blocking=False)
        with pytest.raises(ValueError):
            client.claim_meta(pid, "t1", ["x"], 0, blocking=False)
        with pytest.raises(ValueError):
            client.claim_meta(pid, "t1", ["x"], 1, blocking=False, timeout_s=0)
        # none of the rejected claims moved a cursor
        assert client.claim_meta(pid, "t1", ["x"], 4, blocking=False).size == 4

    def test_claim_needs_produced_fields_and_a_full_batch(self, client: DataPlaneClient, pid: str) -> None:
        client.register_partition(pid, ["x", "later"], 3, ["t"])
        client.put_samples(["a", "b", "c"], pid, dense_td(3))
        # "later" was never produced: nothing is ready for it
        assert client.claim_meta(pid, "t", ["x", "later"], 1, blocking=False).sample_ids == []
        # a tail smaller than batch_size is never claimed by a full-size request
        assert client.claim_meta(pid, "t", ["x"], 4, blocking=False).sample_ids == []
        assert client.claim_meta(pid, "t", ["x"], 3, blocking=False).size == 3

    @pytest.mark.timeout(60)
    def test_blocking_claim_times_out(self, client: DataPlaneClient, pid: str) -> None:
        client.register_partition(pid, ["x"], 2, ["waiter"])
        client.put_samples(["a", "b"], pid, dense_td(2))
        start = time.monotonic()
        with pytest.raises(TimeoutError) as ei:
            client.claim_meta(pid, "waiter", ["x"], 3, blocking=True, timeout_s=1.0)
        elapsed = time.monotonic() - start
        assert 0.9 <= elapsed < 10.0
        assert pid in message(ei) and "waiter" in message(ei)
        # the timed-out claim took nothing
        assert client.claim_meta(pid, "waiter", ["x"], 2, blocking=False).size == 2

    # --- clear ---------------------------------------------------------------------------
    def test_explicit_and_partition_clear(self, client: DataPlaneClient, pid: str, read_table: Callable) -> None:
        batch, _ = self._put_batch(client, pid, seed=8)
        a, b, c, d = batch.ids
        with pytest.raises(KeyError) as ei:
            client.clear_samples([a, "ghost"], pid)
        assert "ghost" in message(ei)
        assert client.list_sample_ids(pid) == sorted(batch.ids)  # nothing cleared
        with pytest.raises(ValueError):
            client.clear_samples([a, a], pid)
        client.clear_samples([], pid)  # no-op
        assert client.list_sample_ids(pid) == sorted(batch.ids)
        client.clear_samples([b], pid)
        assert client.list_sample_ids(pid) == sorted([a, c, d])
        with pytest.raises(KeyError) as ei:
            client.clear_samples([b], pid)  # not idempotent
        assert b in message(ei)
        assert_table(read_table(client.get_samples([d, a], pid, ["x", "s"])), batch.expected([d, a], ["x", "s"]))
        # clearing the rows a task has not claimed completes its consumption
        claimed = client.claim_meta(pid, "t1", ["x"], 1, blocking=False)
        rest = [sid for sid in (a, c, d) if sid not in claimed.sample_ids]
        assert client.check_consumption_status(pid, ["t1"]) is False
        client.clear_samples(rest, pid)
        assert client.check_consumption_status(pid, ["t1"]) is True
        client.clear_samples(claimed.sample_ids, pid)
        assert client.list_sample_ids(pid) == []
        if self.supports_write_back:
            # the partition stays live when empty (it can be written again, e.g. a dynamic-
            # sampling refill); an empty partition is not "consumed"
            assert client.check_consumption_status(pid, ["t1"]) is False
            assert client.claim_meta(pid, "t1", ["x"], 1, blocking=False).sample_ids == []
            client.clear_samples(None, pid)
        else:
            # one put per partition: clearing its last row drops it, as the None form does
            with pytest.raises(KeyError) as ei:
                client.check_consumption_status(pid, ["t1"])
            assert repr(pid) in message(ei)
            client.register_partition(pid, ["x"], 1, ["t1"])  # the id is free again
            client.clear_samples(None, pid)
        with pytest.raises(KeyError) as ei:
            client.clear_samples(None, pid)
        assert repr(pid) in message(ei)

    def test_partition_clear_on_registered_empty_partition(self, client: DataPlaneClient, pid: str) -> None:
        client.register_partition(pid, ["x"], 2, ["t"])
        client.clear_samples(None, pid)
        assert client.list_sample_ids(pid) == []
        with pytest.raises(KeyError):
            client.get_samples(["a"], pid, ["x"])

    # --- tags ----------------------------------------------------------------------------
    def test_put_without_tags_keeps_stored_tags(self, client: DataPlaneClient, pid: str) -> None:
        client.register_partition(pid, ["x", "z"], 2, ["t"])
        ids = ["a", "b"]
        tags = [{"k": 1, "input_lengths": 3}, {"k": 2, "input_lengths": 4}]
        client.put_samples(ids, pid, dense_td(2), tags=tags)
        second = TensorDict({"z": torch.ones(2)}, batch_size=(2,))
        if self.supports_write_back:
            receipt = client.put_samples(ids, pid, second)
            assert receipt.tags is None
        else:
            with pytest.raises(ValueError, match="duplicate writes"):
                client.put_samples(ids, pid, second)
        meta = client.claim_meta(pid, "t", ["x"], 2, blocking=False)
        by_id = dict(zip(ids, tags))
        assert meta.tags == [by_id[sid] for sid in meta.sample_ids]
        assert meta.sequence_lengths == [by_id[sid]["input_lengths"] for sid in meta.sample_ids]

    # --- receipts ------------------------------------------------------------------------
    def test_put_receipt(self, client: DataPlaneClient, pid: str) -> None:
        batch = make_batch(4, seed=9)
        self._register(client, pid, n=4)
        tags = batch.tags
        assert tags is not None
        ids = list(batch.ids)
        receipt = client.put_samples(ids, pid, batch.td, tags=tags)
        assert isinstance(receipt, KVBatchMeta)
        assert receipt.partition_id == pid
        assert receipt.task_name is None
        assert receipt.sample_ids == ids and receipt.sample_ids is not ids
        assert sorted(receipt.fields or []) == sorted(FIELDS)
        assert receipt.sequence_lengths == batch.lengths
        assert receipt.tags == tags
        tags[0]["row"] = "mutated"
        assert receipt.tags[0]["row"] == 0  # a deep copy

    def test_put_receipt_lengths_from_tags_or_none(self, client: DataPlaneClient, pid: str) -> None:
        client.register_partition(pid, ["x"], 2, ["t"])
        receipt = client.put_samples(["a", "b"], pid, dense_td(2), tags=[{"input_lengths": 5}, {"input_lengths": 2}])
        assert receipt.fields == ["x"]
        assert receipt.sequence_lengths == [5, 2]
        other = pid + "_b"
        client.register_partition(other, ["x"], 2, ["t"])
        receipt = client.put_samples(["a", "b"], other, dense_td(2))
        assert receipt.sequence_lengths is None and receipt.tags is None

    # --- close ---------------------------------------------------------------------------
    def test_close_is_idempotent_and_later_calls_raise(
        self, fresh_client: Callable[[], DataPlaneClient], tmp_path: Path
    ) -> None:
        c = fresh_client()
        c.close()
        c.close()
        meta = KVBatchMeta("p", "t", ["a"], fields=["x"])
        calls: list[Callable[[], Any]] = [
            lambda: c.register_partition("p", ["x"], 1, ["t"]),
            lambda: c.claim_meta("p", "t", ["x"], 1, blocking=False),
            lambda: c.get_data(meta),
            lambda: c.check_consumption_status("p", ["t"]),
            lambda: c.put_samples(["a"], "p", dense_td(1)),
            lambda: c.get_samples(["a"], "p", ["x"]),
            lambda: c.list_sample_ids("p"),
            lambda: c.clear_samples(["a"], "p"),
            lambda: c.clear_samples(None, "p"),
            lambda: c.save_checkpoint(tmp_path / "ck"),
            lambda: c.load_checkpoint(tmp_path / "ck"),
        ]
        for call in calls:
            with pytest.raises(RuntimeError, match="closed"):
                call()
        assert not (tmp_path / "ck").exists()

    # --- checkpoint round trip -----------------------------------------------------------
    def test_checkpoint_round_trip(
        self, client: DataPlaneClient, fresh_client: Callable[[], DataPlaneClient], read_table: Callable, tmp_path: Path, pid: str
    ) -> None:
        ck = tmp_path / "nested" / "ck"
        a = client  # saving needs no clean client; each load below gets a fresh one
        batch = make_batch(4, seed=10)
        self._register(a, pid, n=4)
        a.put_samples(batch.ids, pid, batch.td, tags=batch.tags)
        early = a.claim_meta(pid, "t1", ["x"], 1, blocking=False)
        assert early.size == 1
        a.save_checkpoint(ck, metadata={"step": 7})
        assert ck.is_dir()
        assert list(ck.parent.glob("ck.tmp-*")) == [] and list(ck.parent.glob("ck.old-*")) == []

        b = fresh_client()
        assert b.load_checkpoint(ck) == {"step": 7}
        assert b.list_sample_ids(pid) == sorted(batch.ids)
        assert_table(read_table(b.get_samples(batch.ids, pid, FIELDS)), batch.expected(batch.ids, FIELDS))
        assert_table(read_table(b.get_data(early)), batch.expected(early.sample_ids, ["x"]))
        # the row claimed before the save is not claimable again; the rest is
        assert b.claim_meta(pid, "t1", ["x"], 4, blocking=False).sample_ids == []
        rest = b.claim_meta(pid, "t1", ["x"], 3, blocking=False)
        assert sorted(early.sample_ids + rest.sample_ids) == sorted(batch.ids)
        by_id = dict(zip(batch.ids, batch.tags or []))
        assert rest.tags == [by_id[sid] for sid in rest.sample_ids]
        # the other task's cursor was untouched
        assert sorted(b.claim_meta(pid, "t2", ["x"], 4, blocking=False).sample_ids) == sorted(batch.ids)

    # --- load only into a clean client ---------------------------------------------------
    def test_load_requires_a_clean_client(
        self, client: DataPlaneClient, fresh_client: Callable[[], DataPlaneClient], tmp_path: Path, pid: str
    ) -> None:
        ck = tmp_path / "ck"
        a = client  # saving needs no clean client; each load below gets a fresh one
        a.register_partition(pid, ["x"], 2, ["t"])
        a.put_samples(["a", "b"], pid, dense_td(2))
        a.save_checkpoint(ck, metadata={"k": "v"})
        with pytest.raises(RuntimeError, match="clean data-plane client"):
            a.load_checkpoint(ck)
        b = fresh_client()
        with pytest.raises(FileNotFoundError):
            b.load_checkpoint(tmp_path / "missing")
        # a failed load still used up this client
        with pytest.raises(RuntimeError, match="clean data-plane client"):
            b.load_checkpoint(ck)

    # --- atomic saves -------------------------------------------------------------
    def test_failed_saves_keep_previous_checkpoint(
        self,
        client: DataPlaneClient,
        fresh_client: Callable[[], DataPlaneClient],
        read_table: Callable,
        tmp_path: Path,
        pid: str,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        ck = tmp_path / "ck"

        def siblings() -> list[str]:
            return sorted(p.name for p in tmp_path.iterdir() if p.name != "ck")

        a = client  # saving needs no clean client; each load below gets a fresh one
        a.register_partition(pid, ["x"], 2, ["t"])
        a.put_samples(["a", "b"], pid, dense_td(2))

        # Non-JSON metadata fails before anything touches the disk
        for bad in ({"obj": object()}, {1: "int key"}, ["not", "a", "mapping"]):
            with pytest.raises((TypeError, ValueError)):
                a.save_checkpoint(ck, metadata=bad)  # type: ignore[arg-type]
        assert not ck.exists() and siblings() == []

        a.save_checkpoint(ck, metadata={"step": 1})

        # A failure after the payload was written into the temp dir
        real_verify = checkpoint_io._verify_written
        seen: list[list[str]] = []

        def fail_after_write(tmp: Path) -> None:
            real_verify(tmp)
            seen.append(sorted(p.name for p in tmp.iterdir()))
            raise OSError("injected failure mid-save")

        monkeypatch.setattr(checkpoint_io, "_verify_written", fail_after_write)
        with pytest.raises(OSError, match="injected failure mid-save"):
            a.save_checkpoint(ck, metadata={"step": 2})
        monkeypatch.undo()
        assert seen and "manifest.json" in seen[0]  # the injection point was really reached
        assert siblings() == []

        # The final rename fails -> the old directory is restored
        real_replace = checkpoint_io.os.replace
        attempts: list[str] = []

        def failing_replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if Path(src).name.startswith("ck.tmp-"):
                attempts.append(str(src))
                raise OSError("injected rename failure")
            real_replace(src, dst, *args, **kwargs)

        monkeypatch.setattr(checkpoint_io.os, "replace", failing_replace)
        with pytest.raises(OSError, match="injected rename failure"):
            a.save_checkpoint(ck, metadata={"step": 3})
        monkeypatch.undo()
        assert attempts
        assert ck.is_dir() and siblings() == []

        b = fresh_client()
        assert b.load_checkpoint(ck) == {"step": 1}
        assert_table(read_table(b.get_samples(["a", "b"], pid, ["x"])), {"x": dense_td(2).get("x")})

    # --- pickles are never loaded ----------------------------------------------------------
    def test_checkpoint_pickles_are_refused_unread(
        self, client: DataPlaneClient, fresh_client: Callable[[], DataPlaneClient], tmp_path: Path, pid: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        a = client  # saving needs no clean client; each load below gets a fresh one
        a.register_partition(pid, ["x"], 2, ["t"])
        a.put_samples(["a", "b"], pid, dense_td(2))
        ck = tmp_path / "ck"
        a.save_checkpoint(ck, metadata={"step": 1})
        assert sorted(p.name for p in ck.iterdir()) == ["manifest.json", "tensors.safetensors"]
        marker = tmp_path / "code_ran"
        unpickled: list[Any] = []

        def load(*args: Any, **kwargs: Any) -> Any:
            unpickled.append(args)
            raise AssertionError("torch.load called while loading a checkpoint")

        version, old_file = self.old_checkpoint
        for old in (False, True):
            bad = tmp_path / f"bad_{old}"
            shutil.copytree(ck, bad)
            planted = bad / old_file
            planted.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"x": _Payload(marker)}, planted)
            if old:  # the manifest of the older format, which held the pickle
                manifest = json.loads((bad / "manifest.json").read_text())
                (bad / "manifest.json").write_text(json.dumps({**manifest, "format_version": version}))
                (bad / "tensors.safetensors").unlink()
            b = fresh_client()
            with monkeypatch.context() as m:
                m.setattr(torch, "load", load)
                m.setattr(torch.serialization, "load", load)
                with pytest.raises(ValueError, match="no longer supported" if old else "not part of its format") as info:
                    b.load_checkpoint(bad)
            assert str(planted) in str(info.value)
            assert not marker.exists() and unpickled == []
        b = fresh_client()
        assert b.load_checkpoint(ck) == {"step": 1}
        assert b.list_sample_ids(pid) == ["a", "b"]

    # --- multimodal columns --------------------------------------------------------------
    def _put_multimodal(self, client: DataPlaneClient, pid: str, n: int = 6, fields: Sequence[str] = MM_FIELDS) -> tuple[MultimodalBatch, KVBatchMeta]:
        batch = make_multimodal_batch(n, seed=n)
        client.register_partition(pid, [*fields, "x"], n, ["t1"])
        receipt = client.put_samples(batch.ids, pid, batch.td)
        return batch, receipt

    def test_multimodal_columns_round_trip_per_sample(
        self, client: DataPlaneClient, pid: str, read_table: Callable
    ) -> None:
        batch, _ = self._put_multimodal(client, pid)
        assert_multimodal_rows(read_table(client.get_samples(batch.ids, pid, MM_FIELDS)), batch, batch.ids)
        order = [batch.ids[4], batch.ids[0], batch.ids[2]]
        assert_multimodal_rows(read_table(client.get_samples(order, pid, ["pix", "img"])), batch, order)
        meta = client.claim_meta(pid, "t1", ["img", "pix"], 4, blocking=False)
        assert meta.size == 4
        assert_multimodal_rows(read_table(client.get_data(meta)), batch, meta.sample_ids)
        # a read is the caller's copy
        first = read_table(client.get_samples(batch.ids, pid, ["img", "pix"]))
        list(first["img"])[0].zero_()
        first["pix"].tensors[0].zero_()
        assert_multimodal_rows(read_table(client.get_samples(batch.ids, pid, ["img", "pix"])), batch, batch.ids)

    def test_multimodal_columns_survive_write_back_preshard_and_clear(
        self, client: DataPlaneClient, pid: str, read_table: Callable
    ) -> None:
        from nemo_dp.data_plane.driver_mixin import shard_meta_for_dp

        batch, receipt = self._put_multimodal(client, pid)
        if self.supports_write_back:
            client.put_samples(batch.ids, pid, dense_td(6))  # another field, same ids
            client.put_samples(batch.ids[:3], pid, TensorDict({"input_lengths": torch.tensor([9, 9, 9])}, batch_size=(3,)))
            table = read_table(client.get_samples(batch.ids, pid, ["x", *MM_FIELDS[:3]]))
            assert torch.equal(table["x"], dense_td(6).get("x"))
            assert_multimodal_rows(table, batch, batch.ids)
        shards, _ = shard_meta_for_dp(receipt, dp_world=2)
        assert [s.size for s in shards] == [3, 3]
        for shard in shards:
            shard.fields = ["img", "pix", "feat"]
            assert_multimodal_rows(read_table(client.get_data(shard)), batch, shard.sample_ids)
        dropped = [batch.ids[1], batch.ids[4]]
        client.clear_samples(dropped, pid)
        kept = [sid for sid in batch.ids if sid not in dropped]
        assert client.list_sample_ids(pid) == sorted(kept)
        assert_multimodal_rows(read_table(client.get_samples(kept, pid, MM_FIELDS[:3])), batch, kept)
        with pytest.raises(KeyError):
            client.get_samples(dropped[:1], pid, ["img"])

    def test_multimodal_checkpoint_round_trip(
        self, client: DataPlaneClient, fresh_client: Callable[[], DataPlaneClient], read_table: Callable, tmp_path: Path, pid: str
    ) -> None:
        a = client  # saving needs no clean client; each load below gets a fresh one
        batch, _ = self._put_multimodal(a, pid)
        a.save_checkpoint(tmp_path / "ck", metadata={"mm": True})
        b = fresh_client()
        assert b.load_checkpoint(tmp_path / "ck") == {"mm": True}
        assert_multimodal_rows(read_table(b.get_samples(batch.ids, pid, MM_FIELDS)), batch, batch.ids)


class SessionContract(DataPlaneContract):
    """The contract over a cluster backend (write-back supported) whose tests share one session.

    A subclass provides the ``session`` fixture: the backend's ``BootstrapSession`` of
    ``tests/integration/conftest.py``; ``client``, ``fresh_client`` and ``read_table``
    (``materialize``) come from it.
    """

    supports_write_back = True

    @pytest.fixture
    def client(self, session: Any) -> Any:
        return session.client

    @pytest.fixture
    def fresh_client(self, session: Any) -> Callable[[], Any]:
        return session.fresh

    @pytest.fixture
    def read_table(self) -> Callable[[Any], Any]:
        return materialize
