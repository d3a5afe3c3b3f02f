"""Local-adapter checkpoints and the shared atomic-write helper.

Covers failures during a save (real exception inside the writer, failing final rename, a crash
between the two renames), hostile or damaged files on load (a code-bearing pickle in place of the
tensor table, older formats that held ``tensors.pt``, unknown versions, corrupt manifests,
inconsistent content) and what a restore brings back (generations, cursors, compact tensors).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tensordict import TensorDict

from nemo_dp.utils import checkpoint_io
from nemo_dp.data_plane.adapters.local import TENSORS_FILE, LocalDataPlaneClient, local_batch_to_tensordict
from nemo_dp.data_plane.typed_checkpoint import load_tensor_table
from nemo_dp.data_plane.codec import materialize_local
from nemo_dp.data_plane.interfaces import KVBatchMeta, LocalDataPlaneConfig
from nemo_dp.data_plane.schema import LOCAL_PARTITION_GENERATION

pytestmark = pytest.mark.timeout(120)


def make_client(max_partitions: int = 2) -> LocalDataPlaneClient:
    return LocalDataPlaneClient(LocalDataPlaneConfig(max_partitions=max_partitions))


def fill(c: LocalDataPlaneClient, pid: str = "p", offset: float = 0.0) -> KVBatchMeta:
    c.register_partition(pid, ["x", "text"], 3, ["train"])
    batch = {"x": torch.arange(6.0).reshape(3, 2) + offset, "text": ["a", "b", "c"]}
    return c.put_samples([f"{pid}_r{i}" for i in range(3)], pid, local_batch_to_tensordict(batch, batch_size=3))


def siblings(ck: Path) -> list[str]:
    return sorted(p.name for p in ck.parent.iterdir() if p.name != ck.name)


def client_with_checkpoint(
    tmp_path: Path, metadata: dict[str, Any] | None = None
) -> tuple[LocalDataPlaneClient, Path]:
    """A filled client and the checkpoint it saved to ``tmp_path / "ck"`` (metadata ``{"step": 1}``
    unless given)."""
    c = make_client()
    fill(c)
    ck = tmp_path / "ck"
    c.save_checkpoint(ck, metadata=metadata if metadata is not None else {"step": 1})
    return c, ck


def saved_checkpoint(tmp_path: Path, metadata: dict[str, Any] | None = None) -> Path:
    c, ck = client_with_checkpoint(tmp_path, metadata)
    c.close()
    return ck


def files(ck: Path) -> dict[str, bytes]:
    """Every file of the checkpoint ``ck`` by name, with its bytes."""
    return {p.name: p.read_bytes() for p in ck.iterdir()}


# --- failures during a save -------------------------------------------------------------


def test_exception_inside_the_writer_keeps_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c, ck = client_with_checkpoint(tmp_path)
    before = files(ck)

    import safetensors.torch

    real_save = safetensors.torch.save_file
    partial: list[Path] = []

    def save_half_then_fail(tensors: Any, filename: Any, *args: Any, **kwargs: Any) -> None:
        path = Path(filename)
        real_save(tensors, path, *args, **kwargs)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])  # a torn file inside the temp dir
        partial.append(path)
        raise OSError("disk full (injected)")

    monkeypatch.setattr(safetensors.torch, "save_file", save_half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        c.save_checkpoint(ck, metadata={"step": 2})
    monkeypatch.undo()
    assert partial and ".tmp-" in partial[0].parent.name  # the writer really ran in a temp dir
    assert siblings(ck) == []  # temp dir removed
    assert files(ck) == before
    assert make_client().load_checkpoint(ck) == {"step": 1}


def test_failing_final_rename_restores_the_old_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c, ck = client_with_checkpoint(tmp_path)
    before = files(ck)
    real_replace = os.replace
    moved_away: list[str] = []

    def replace(src: Any, dst: Any) -> None:
        if Path(src).name.startswith("ck.tmp-"):
            assert not ck.exists()  # the old dir had been moved aside
            moved_away.extend(siblings(ck))
            raise OSError("rename failed (injected)")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="rename failed"):
        c.save_checkpoint(ck, metadata={"step": 2})
    monkeypatch.undo()
    assert any(name.startswith("ck.old-") for name in moved_away)
    assert files(ck) == before
    assert siblings(ck) == []
    # a later save replaces it normally and removes the old dir
    c.save_checkpoint(ck, metadata={"step": 3})
    assert siblings(ck) == []
    assert make_client().load_checkpoint(ck) == {"step": 3}


def test_crash_between_renames_names_the_surviving_old_dir(tmp_path: Path) -> None:
    ck = saved_checkpoint(tmp_path)
    old = tmp_path / "ck.old-3f2a9c"
    os.replace(ck, old)  # what a crash after the first rename leaves behind
    (tmp_path / "ck.tmp-deadbeef").mkdir()  # and a leftover temp dir, never read
    with pytest.raises(FileNotFoundError) as ei:
        make_client().load_checkpoint(ck)
    assert "ck.old-3f2a9c" in str(ei.value)
    os.replace(old, ck)
    assert make_client().load_checkpoint(ck) == {"step": 1}


def test_unserialisable_inputs_fail_before_writing(tmp_path: Path) -> None:
    c = make_client()
    c.register_partition("objs", ["o"], 2, ["t"])
    c.put_samples(["a", "b"], "objs", local_batch_to_tensordict({"o": [{"k": 1}, object()]}, batch_size=2))
    ck = tmp_path / "ck"
    with pytest.raises(TypeError) as ei:
        c.save_checkpoint(ck, metadata={"step": 1})
    assert "'objs'" in str(ei.value) and "'o'" in str(ei.value)
    c.clear_samples(None, "objs")
    for bad in ({"x": float("nan")}, {"x": {1: 2}}, {"x": (1, object())}, "step"):
        with pytest.raises((TypeError, ValueError)):
            c.save_checkpoint(ck, metadata=bad)  # type: ignore[arg-type]
    assert not tmp_path.joinpath("ck").exists() and list(tmp_path.iterdir()) == []


# --- hostile or damaged files -----------------------------------------------------------


class _CodeBearing:
    """Unpickling this runs ``exec`` on a payload that creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


@pytest.fixture
def unpickled(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Records every ``torch.load`` (an unpickler, even with ``weights_only=True``)."""
    calls: list[Any] = []

    def load(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        raise AssertionError("torch.load called while loading a checkpoint")

    monkeypatch.setattr(torch, "load", load)
    monkeypatch.setattr(torch.serialization, "load", load)
    return calls


def test_code_bearing_pickle_is_rejected_and_never_runs(tmp_path: Path, unpickled: list[Any]) -> None:
    ck = saved_checkpoint(tmp_path / "a")
    marker = tmp_path / "marker"
    tensor_file = ck / TENSORS_FILE
    torch.save({"p0.c0": _CodeBearing(marker)}, tensor_file)
    with pytest.raises(ValueError, match="not a valid safetensors file") as ei:
        make_client().load_checkpoint(ck)
    assert str(tensor_file) in str(ei.value)
    # the same with a raw (non-zip) pickle in place of the tensor file
    tensor_file.write_bytes(pickle.dumps({"p0.c0": _CodeBearing(marker)}, protocol=2))
    with pytest.raises(ValueError, match="not a valid safetensors file") as ei:
        make_client().load_checkpoint(ck)
    assert str(tensor_file) in str(ei.value)
    assert not marker.exists() and unpickled == []


def test_older_formats_holding_tensors_pt_are_refused_unread(tmp_path: Path, unpickled: list[Any]) -> None:
    """Versions 1 and 2 kept their tensors in ``tensors.pt`` (a pickle): refused, never read."""
    marker = tmp_path / "marker"
    probe = tmp_path / "probe.pt"
    torch.save({"p0.c0": _CodeBearing(tmp_path / "probe_marker")}, probe)
    # the payload really carries code: an unrestricted load of it runs it
    pickle.loads(zipfile.ZipFile(probe).read("probe/data.pkl"))
    assert (tmp_path / "probe_marker").exists()
    for version in (1, 2):
        ck = saved_checkpoint(tmp_path / f"v{version}")
        manifest_path = ck / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        manifest_path.write_text(json.dumps({**manifest, "format_version": version}))
        (ck / TENSORS_FILE).unlink()
        torch.save({"p0.c0": _CodeBearing(marker)}, ck / "tensors.pt")
        with pytest.raises(ValueError, match=f"format_version {version} .* no longer supported") as ei:
            make_client().load_checkpoint(ck)
        assert str(ck / "tensors.pt") in str(ei.value) and str(manifest_path) in str(ei.value)
    assert not marker.exists() and unpickled == []


def test_a_tensors_pt_beside_a_current_checkpoint_is_refused_unread(tmp_path: Path, unpickled: list[Any]) -> None:
    ck = saved_checkpoint(tmp_path)
    marker = tmp_path / "marker"
    torch.save({"p0.c0": _CodeBearing(marker)}, ck / "tensors.pt")
    with pytest.raises(ValueError, match="not part of its format") as ei:
        make_client().load_checkpoint(ck)
    assert str(ck / "tensors.pt") in str(ei.value)
    assert not marker.exists() and unpickled == []
    (ck / "tensors.pt").unlink()
    assert make_client().load_checkpoint(ck) == {"step": 1}


def test_truncated_or_wrong_tensor_file(tmp_path: Path) -> None:
    ck = saved_checkpoint(tmp_path)
    tensor_file = ck / TENSORS_FILE
    data = tensor_file.read_bytes()
    tensor_file.write_bytes(data[: len(data) // 3])
    with pytest.raises(ValueError) as ei:
        make_client().load_checkpoint(ck)
    assert str(tensor_file) in str(ei.value)
    from safetensors.torch import save_file

    save_file({"other": torch.zeros(3, 2)}, str(tensor_file))  # a valid table without the column
    with pytest.raises(ValueError, match="'p0.c0' is missing") as ei:
        make_client().load_checkpoint(ck)
    assert str(ck / "manifest.json") in str(ei.value)
    save_file({"p0.c0": torch.zeros(5, 2)}, str(tensor_file))  # 5 rows for 3 ids
    with pytest.raises(ValueError, match="must have 3 rows") as ei:
        make_client().load_checkpoint(ck)
    save_file({"p0.c0": torch.zeros(3, 2, dtype=torch.float64)}, str(tensor_file))  # another dtype
    with pytest.raises(ValueError, match="float64") as ei:
        make_client().load_checkpoint(ck)
    tensor_file.unlink()
    with pytest.raises(ValueError) as ei:
        make_client().load_checkpoint(ck)
    assert str(tensor_file) in str(ei.value)


def test_manifest_version_format_and_corruption(tmp_path: Path) -> None:
    ck = saved_checkpoint(tmp_path)
    manifest_path = ck / "manifest.json"
    good = json.loads(manifest_path.read_text())
    assert good["format"] == "nemo_dp.local_data_plane" and good["format_version"] == 3

    manifest_path.write_text(json.dumps({**good, "format_version": 999}))
    with pytest.raises(ValueError) as ei:
        make_client().load_checkpoint(ck)
    assert str(manifest_path) in str(ei.value) and "999" in str(ei.value)

    manifest_path.write_text(json.dumps({**good, "format": "nemo_dp.tq_data_plane"}))
    with pytest.raises(ValueError) as ei:
        make_client().load_checkpoint(ck)
    assert str(manifest_path) in str(ei.value)

    for corrupt in ('{"format": "nemo_dp.local_data_plane", ', "[1, 2]", "\xff\xfe"):
        manifest_path.write_text(corrupt, encoding="latin-1")
        with pytest.raises(ValueError) as ei:
            make_client().load_checkpoint(ck)
        assert str(manifest_path) in str(ei.value)

    broken = json.loads(json.dumps(good))
    broken["partitions"][0]["claimed"] = {"train": ["not-a-row"]}
    manifest_path.write_text(json.dumps(broken))
    with pytest.raises(ValueError) as ei:
        make_client().load_checkpoint(ck)
    assert str(manifest_path) in str(ei.value)

    manifest_path.write_text(json.dumps(good))
    assert make_client().load_checkpoint(ck) == {"step": 1}


def test_missing_directory_or_manifest(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        make_client().load_checkpoint(tmp_path / "nope")
    ck = saved_checkpoint(tmp_path)
    (ck / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError) as ei:
        make_client().load_checkpoint(ck)
    assert "manifest.json" in str(ei.value)


def test_failed_data_operation_also_dirties_the_client(tmp_path: Path) -> None:
    ck = saved_checkpoint(tmp_path)
    c = make_client()
    with pytest.raises(KeyError):
        c.get_samples(["a"], "unknown", ["x"])
    with pytest.raises(RuntimeError, match="clean data-plane client"):
        c.load_checkpoint(ck)
    c2 = make_client()
    c2.save_checkpoint(tmp_path / "empty")  # saving is not a data operation
    assert c2.load_checkpoint(ck) == {"step": 1}


# --- what a restore brings back ---------------------------------------------------------


def test_restore_keeps_generations_cursors_and_resumes_the_counter(tmp_path: Path) -> None:
    c = make_client(3)
    first = fill(c, "p")
    c.register_partition("gone", ["x"], 1, ["train"])
    c.clear_samples(None, "gone")
    second = fill(c, "q", offset=10.0)
    claimed = c.claim_meta("q", "train", ["x"], 2)
    c.clear_samples(["q_r2"], "q")
    ck = tmp_path / "ck"
    metadata = {"step": 12, "nested": {"a": [1, 2.5, None, True]}}
    c.save_checkpoint(ck, metadata=metadata)

    r = make_client(3)
    got = r.load_checkpoint(ck)
    assert got == metadata
    got["nested"]["a"].append("mutated")  # a copy
    assert sorted(r.list_sample_ids("p")) == ["p_r0", "p_r1", "p_r2"]
    assert r.list_sample_ids("q") == ["q_r0", "q_r1"]
    # metas minted before the save still validate
    assert torch.equal(r.get_data(first)["x"], torch.arange(6.0).reshape(3, 2))
    assert torch.equal(materialize_local(r.get_data(claimed, ["x", "text"]))["x"], torch.arange(4.0).reshape(2, 2) + 10.0)
    assert materialize_local(r.get_data(claimed, ["text"]))["text"] == ["a", "b"]
    with pytest.raises(KeyError):
        r.get_data(second)  # q_r2 was cleared before the save
    # cursors: q's two rows were claimed already
    assert r.check_consumption_status("q", ["train"]) is True
    assert r.claim_meta("p", "train", ["x"], 3, blocking=False).size == 3
    # the counter resumes above every restored generation; new partitions register
    restored = {first.extra_info[LOCAL_PARTITION_GENERATION], second.extra_info[LOCAL_PARTITION_GENERATION]}
    fresh = fill(r, "new")
    assert fresh.extra_info[LOCAL_PARTITION_GENERATION] > max(restored)
    assert fresh.extra_info[LOCAL_PARTITION_GENERATION] not in restored
    # the restored partitions count against max_partitions and stay one-batch partitions
    with pytest.raises(RuntimeError, match="partition limit"):
        r.register_partition("another", ["x"], 1, ["t"])
    with pytest.raises(ValueError, match="duplicate writes"):
        r.put_samples(["z0", "z1", "z2"], "p", TensorDict({"x": torch.zeros(3, 2)}, batch_size=(3,)))


def test_saved_tensors_are_compact_live_rows(tmp_path: Path) -> None:
    c = make_client()
    c.register_partition("big", ["x", "r"], 4, ["t"])
    x = torch.randn(4, 1000)
    rows = [torch.arange(k) for k in (5, 1, 3, 2)]
    c.put_samples(
        ["a", "b", "c", "d"],
        "big",
        TensorDict({"x": x, "r": torch.nested.nested_tensor(rows, layout=torch.jagged)}, batch_size=(4,)),
    )
    c.clear_samples(["a", "c", "d"], "big")
    ck = tmp_path / "ck"
    c.save_checkpoint(ck)
    saved = load_tensor_table(ck / TENSORS_FILE)
    assert sum(t.numel() for t in saved.values()) == 1000 + 1 + 2  # one dense row, one jagged row
    r = make_client()
    assert r.load_checkpoint(ck) == {}
    out = r.get_samples(["b"], "big", ["x", "r"])
    assert torch.equal(out["x"], x[1:2])
    assert [t.tolist() for t in out.get("r").unbind()] == [[0]]


def test_too_many_partitions_for_this_client(tmp_path: Path) -> None:
    c = make_client(2)
    fill(c, "p")
    fill(c, "q")
    c.save_checkpoint(tmp_path / "ck")
    with pytest.raises(ValueError, match="partition limit"):
        make_client(1).load_checkpoint(tmp_path / "ck")


# --- the shared helper itself ----------------------------------------------------------------


def test_helper_refuses_a_writer_without_manifest_and_cleans_up(tmp_path: Path) -> None:
    ck = tmp_path / "deep" / "ck"

    def write_payload_only(tmp: Path) -> None:
        (tmp / "payload.bin").write_bytes(b"x")

    with pytest.raises(RuntimeError, match="manifest.json"):
        checkpoint_io.write_checkpoint_atomically(ck, write_payload_only)
    assert list(ck.parent.iterdir()) == []

    def write_ok(tmp: Path) -> None:
        checkpoint_io.write_manifest(tmp, {"format": "demo", "format_version": 2, "n": 1})

    assert checkpoint_io.write_checkpoint_atomically(ck, write_ok) == ck
    assert checkpoint_io.read_manifest(ck, expected_format="demo", supported_versions=(1, 2))["n"] == 1
    with pytest.raises(ValueError, match="format_version 2"):
        checkpoint_io.read_manifest(ck, expected_format="demo", supported_versions=(1,))
    with pytest.raises(ValueError, match="'other'"):
        checkpoint_io.read_manifest(ck, expected_format="other", supported_versions=(2,))
    with pytest.raises(ValueError):
        checkpoint_io.write_manifest(tmp_path, {"format": "demo", "format_version": True})
    file_path = tmp_path / "a_file"
    file_path.write_text("x")
    with pytest.raises(NotADirectoryError):
        checkpoint_io.write_checkpoint_atomically(file_path, write_ok)
    assert file_path.read_text() == "x"


def test_validate_json_metadata() -> None:
    src = {"a": (1, 2), "b": {"c": None}}
    out = checkpoint_io.validate_json_metadata(src)
    assert out == {"a": [1, 2], "b": {"c": None}}
    out["b"]["c"] = 1
    assert src["b"]["c"] is None
    assert checkpoint_io.validate_json_metadata(None) == {}
    with pytest.raises(TypeError):
        checkpoint_io.validate_json_metadata({"a": {1: "x"}})
    with pytest.raises(TypeError):
        checkpoint_io.validate_json_metadata({"a": torch.zeros(1)})
    with pytest.raises(ValueError):
        checkpoint_io.validate_json_metadata({"a": float("inf")})
    with pytest.raises(TypeError):
        checkpoint_io.validate_json_metadata([("a", 1)])  # type: ignore[arg-type]


# --- issue 10 item 1: every stored value comes back exactly (typed encoding) -----------------


def same(a: Any, b: Any) -> bool:
    """Type-strict deep equality: same types everywhere, NaN equals NaN, -0.0 differs from 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, complex):
        return same(a.real, b.real) and same(a.imag, b.imag)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return len(a) == len(b) and all(same(k1, k2) and same(v1, v2) for (k1, v1), (k2, v2) in zip(a.items(), b.items()))
    if isinstance(a, (set, frozenset)):
        return len(a) == len(b) and all(any(same(x, y) for y in b) for x in a)
    if isinstance(a, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.requires_grad == b.requires_grad
            and a.detach().contiguous().view(-1).view(torch.uint8).tolist()
            == b.detach().contiguous().view(-1).view(torch.uint8).tolist()
            if a.numel()
            else a.dtype == b.dtype and a.shape == b.shape
        )
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.hasobject:
            return all(same(x, y) for x, y in zip(a.reshape(-1), b.reshape(-1)))
        return a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    return a == b


def round_trip(tmp_path: Path, values: list[Any], tags: list[dict[str, Any]] | None = None) -> tuple[list[Any], list[dict] | None]:
    """Put ``values`` as one object column, save, load into a new client, read them back."""
    n = len(values)
    c = make_client()
    c.register_partition("p", ["o"], n, ["t"])
    ids = [f"r{i}" for i in range(n)]
    c.put_samples(ids, "p", local_batch_to_tensordict({"o": values}, batch_size=n), tags=tags)
    ck = tmp_path / "ck"
    c.save_checkpoint(ck)
    c.close()
    r = make_client()
    r.load_checkpoint(ck)
    got = materialize_local(r.get_samples(ids, "p", ["o"]))["o"]
    meta = r.claim_meta("p", "t", ["o"], n)
    r.close()
    return got, meta.tags


def test_issue_examples_come_back_exactly(tmp_path: Path) -> None:
    t = torch.arange(6, dtype=torch.int16).reshape(2, 3)
    values = [
        {3: 4, "k": (1, 2)},
        (1, "two", 3.0),
        {True: "yes", None: [1, {2.5: b"\x00\xff"}], (1, "a"): frozenset({1, 2})},
        b"raw \x00 bytes",
        bytearray(b"ba"),
        np.float32(1.5),
        np.int64(-7),
        np.bool_(True),
        np.str_("s"),
        np.arange(6, dtype=np.uint16).reshape(2, 3),
        np.array(["a", "bc"]),
        np.array([1, (2, 3), None], dtype=object),
        {"tensor": t, "grad": torch.ones(2, requires_grad=True), "bf16": torch.tensor([1.5], dtype=torch.bfloat16)},
        [float("nan"), float("inf"), -0.0, 2**80, -(10**5000), 1 + 2j, set(), {4, 5}],
        None,
    ]
    tags = [{"input_lengths": i, "shape": (i, "x")} for i in range(len(values))]
    got, got_tags = round_trip(tmp_path, values, tags)
    assert len(got) == len(values)
    for i, (want, have) in enumerate(zip(values, got)):
        assert same(want, have), (i, want, have)
    assert got_tags is not None and all(same(want, have) for want, have in zip(tags, got_tags))


def test_unencodable_value_fails_naming_field_and_sample_before_writing(tmp_path: Path) -> None:
    from collections import OrderedDict

    c, ck = client_with_checkpoint(tmp_path)
    before = files(ck)
    c.register_partition("objs", ["o"], 3, ["t"])
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    for bad in (object(), OrderedDict(a=1), cyclic):
        c2 = make_client()
        c2.register_partition("objs", ["o"], 3, ["t"])
        c2.put_samples(["a", "b", "c"], "objs", local_batch_to_tensordict({"o": [1, {"k": [bad]}, 3]}, batch_size=3))
        with pytest.raises(TypeError) as ei:
            c2.save_checkpoint(ck, metadata={"step": 2})
        text = str(ei.value)
        assert "'objs'" in text and "'o'" in text and "'b'" in text, text
        c2.close()
    assert siblings(ck) == []  # no temp dir left behind
    assert files(ck) == before  # previous checkpoint intact
    assert make_client().load_checkpoint(ck) == {"step": 1}


def test_corrupt_value_node_is_rejected_naming_the_file(tmp_path: Path) -> None:
    c = make_client()
    c.register_partition("p", ["o"], 1, ["t"])
    c.put_samples(["a"], "p", local_batch_to_tensordict({"o": [(1, np.arange(3))]}, batch_size=1))
    ck = tmp_path / "ck"
    c.save_checkpoint(ck)
    manifest_path = ck / "manifest.json"
    good = json.loads(manifest_path.read_text())
    for node in ({"t": "pickle", "v": "x"}, {"t": "tuple", "v": "no"}, [1, 2], {"t": "ndarray", "dtype": "<f8", "shape": [9], "key": "p0.c0.v.0"}):
        broken = json.loads(json.dumps(good))
        broken["partitions"][0]["columns"]["o"]["values"][0] = node
        manifest_path.write_text(json.dumps(broken))
        with pytest.raises(ValueError) as ei:
            make_client().load_checkpoint(ck)
        assert str(manifest_path) in str(ei.value) and "'a'" in str(ei.value)


_keys = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=5), st.binary(max_size=5),
    st.tuples(st.integers(), st.text(max_size=3)), st.frozensets(st.integers(), max_size=3),
)
_scalars = st.one_of(
    _keys,
    st.floats(allow_nan=True, allow_infinity=True),
    st.complex_numbers(allow_nan=True),
    st.binary(max_size=6).map(bytearray),
    hnp.arrays(hnp.scalar_dtypes(), ()).map(lambda a: a[()]),
    hnp.arrays(hnp.scalar_dtypes(), hnp.array_shapes(min_dims=0, max_dims=2, max_side=3)),
    hnp.arrays(st.sampled_from([np.float32, np.int64, np.bool_, np.uint8]), hnp.array_shapes(max_dims=2, max_side=3)).map(
        lambda a: torch.from_numpy(a.copy())
    ),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(_keys, inner, max_size=4),
        st.sets(_keys, max_size=3),
    ),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_values, min_size=1, max_size=3))
def test_property_checkpoint_round_trip_is_exact(tmp_path_factory: pytest.TempPathFactory, values: list[Any]) -> None:
    got, _ = round_trip(tmp_path_factory.mktemp("rt"), values)
    assert len(got) == len(values)
    for want, have in zip(values, got):
        assert same(want, have), (want, have)
