"""File manifests: a truncated, zeroed, missing or altered checkpoint file is reported by path.

Reproduces issue 14 problem 4 (a truncated or zeroed state file gave raw torch errors naming no
file): the loader's first step, ``verify_manifest``, now names the file and what is wrong.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from nemo_dp.utils.manifest import (
    FILE_MANIFEST_NAME,
    CheckpointCorruptError,
    build_manifest,
    has_manifest,
    read_file_manifest,
    verify_manifest,
    write_manifest,
)


def _checkpoint(tmp_path: Path) -> Path:
    ckpt = tmp_path / "step_00000003"
    (ckpt / "policy").mkdir(parents=True)
    torch.save({"w": torch.arange(1000, dtype=torch.float32)}, ckpt / "state.pt")
    (ckpt / "manifest.json").write_text(json.dumps({"format": "x", "format_version": 1}))
    (ckpt / "policy" / "config.json").write_text('{"d_model": 8}')
    write_manifest(ckpt)
    return ckpt


def test_round_trip_covers_every_file_recursively(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path)
    manifest = read_file_manifest(ckpt)
    assert sorted(manifest["files"]) == ["manifest.json", "policy/config.json", "state.pt"]
    assert manifest["files"]["state.pt"]["size"] == (ckpt / "state.pt").stat().st_size
    report = verify_manifest(ckpt)
    assert report.files == 3
    assert report.total_bytes == sum(
        (ckpt / rel).stat().st_size for rel in ("manifest.json", "policy/config.json", "state.pt")
    )
    assert report.extra_files == []
    assert has_manifest(ckpt)
    assert build_manifest(ckpt)["files"] == manifest["files"]
    # No temp file is left behind by the atomic write.
    assert sorted(p.name for p in ckpt.iterdir()) == [
        FILE_MANIFEST_NAME,
        "manifest.json",
        "policy",
        "state.pt",
    ]


def test_truncated_state_file_is_named(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path)
    state = ckpt / "state.pt"
    data = state.read_bytes()
    state.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointCorruptError, match="truncated") as info:
        verify_manifest(ckpt)
    assert info.value.path == state
    assert info.value.reason == "truncated"
    assert str(state) in str(info.value)
    assert f"{len(data) // 2} bytes" in str(info.value) and f"{len(data)} bytes" in str(info.value)


def test_zeroed_state_file_is_named(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path)
    state = ckpt / "state.pt"
    state.write_bytes(b"\0" * state.stat().st_size)
    # Without the manifest this is the raw torch error naming no file (the problem reproduced).
    with pytest.raises(Exception) as raw:
        torch.load(state, weights_only=True)
    assert not isinstance(raw.value, CheckpointCorruptError)
    with pytest.raises(CheckpointCorruptError, match="altered") as info:
        verify_manifest(ckpt)
    assert info.value.path == state and info.value.reason == "altered"
    # A sizes-only scan cannot see a same-size change; the full check is the default.
    assert verify_manifest(ckpt, check_hashes=False).files == 3


def test_missing_and_grown_files(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path)
    (ckpt / "policy" / "config.json").unlink()
    with pytest.raises(CheckpointCorruptError, match="missing") as info:
        verify_manifest(ckpt)
    assert info.value.path == ckpt / "policy" / "config.json"

    ckpt2 = _checkpoint(tmp_path / "b")
    with open(ckpt2 / "state.pt", "ab") as fh:
        fh.write(b"x")
    with pytest.raises(CheckpointCorruptError) as info:
        verify_manifest(ckpt2)
    assert info.value.reason == "grown" and info.value.path == ckpt2 / "state.pt"


def test_unlisted_files_are_reported_and_refused_when_strict(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path)
    (ckpt / "stray.bin").write_bytes(b"1")
    assert verify_manifest(ckpt).extra_files == ["stray.bin"]
    with pytest.raises(CheckpointCorruptError, match="not listed") as info:
        verify_manifest(ckpt, strict=True)
    assert info.value.path == ckpt / "stray.bin" and info.value.reason == "unexpected"


def test_missing_or_corrupt_manifest(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path)
    manifest = ckpt / FILE_MANIFEST_NAME
    text = manifest.read_text()
    manifest.write_text(text[: len(text) // 2])
    with pytest.raises(CheckpointCorruptError, match="not valid JSON") as info:
        verify_manifest(ckpt)
    assert info.value.path == manifest and info.value.reason == "bad_manifest"

    manifest.write_text(json.dumps({"format": "nemo_dp.file_manifest", "format_version": 99, "files": {}}))
    with pytest.raises(CheckpointCorruptError, match="format_version 99"):
        verify_manifest(ckpt)

    bad_entry = {
        "format": "nemo_dp.file_manifest",
        "format_version": 1,
        "files": {"../x": {"size": 1, "sha256": "0" * 64}},
    }
    manifest.write_text(json.dumps(bad_entry))
    with pytest.raises(CheckpointCorruptError, match="not a relative path"):
        verify_manifest(ckpt)

    manifest.unlink()
    with pytest.raises(CheckpointCorruptError, match="has no file_manifest.json") as info:
        verify_manifest(ckpt)
    assert info.value.reason == "no_manifest"
    assert not has_manifest(ckpt)


def test_symlinks_are_refused_before_writing(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (tmp_path / "outside.bin").write_bytes(b"x")
    os.symlink(tmp_path / "outside.bin", ckpt / "link.bin")
    with pytest.raises(ValueError, match="link.bin"):
        write_manifest(ckpt)
    assert not has_manifest(ckpt)
    with pytest.raises(NotADirectoryError):
        write_manifest(tmp_path / "nope")


def test_rewriting_the_manifest_covers_the_new_content(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path)
    (ckpt / "extra.json").write_text("{}")
    write_manifest(ckpt)
    assert "extra.json" in read_file_manifest(ckpt)["files"]
    assert FILE_MANIFEST_NAME not in read_file_manifest(ckpt)["files"]
    assert verify_manifest(ckpt, strict=True).extra_files == []
