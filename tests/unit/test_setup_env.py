"""``scripts/setup_env.sh`` picks the torch build from ``NEMO_DP_TORCH`` (CPU by default).

The script runs on a copy of the repository's set-up files with ``PYTHON`` pointing at a
recorder: its ``-m venv`` creates a ``.venv`` whose ``pip`` and ``python`` only log their
arguments.  That isolates the script's own decisions (which index, which stamp) from pip and
the network; what pip then installs is pip's business.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

RECORDER = """#!/usr/bin/env bash
# A stand-in interpreter: `-m venv DIR` makes DIR/bin/{pip,python} that append their arguments
# to calls.log; anything else is logged the same way (the heredoc check reads stdin).
log="$(dirname "$0")/calls.log"
if [[ "$1" == "-m" && "$2" == "venv" ]]; then
    mkdir -p "$3/bin"
    for tool in pip python; do
        printf '#!/usr/bin/env bash\\necho "%s $*" >> %q\\ncat > /dev/null\\n' "$tool" "$log" > "$3/bin/$tool"
        chmod +x "$3/bin/$tool"
    done
    exit 0
fi
echo "interpreter $*" >> "$log"
"""


def _setup(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True, exist_ok=True)
    for name in ("scripts/setup_env.sh", "pyproject.toml", "constraints.txt"):
        shutil.copy(REPO / name, root / name)
    fake = root / "fake_python"
    fake.write_text(RECORDER)
    fake.chmod(0o755)
    (root / "calls.log").unlink(missing_ok=True)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("NEMO_DP_TORCH")}
    full_env.update({"PYTHON": str(fake), **env})
    proc = subprocess.run(["bash", "scripts/setup_env.sh"], cwd=root, env=full_env, capture_output=True,
                          text=True, timeout=60)
    log = root / "calls.log"
    return proc, log.read_text().splitlines() if log.is_file() else []


def _torch_install(calls: list[str]) -> str:
    (line,) = [c for c in calls if c.startswith("pip install") and "torch==2.13.0" in c]
    return line


def test_cpu_is_the_default_and_keeps_its_stamp(tmp_path: Path) -> None:
    proc, calls = _setup(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "--index-url" not in _torch_install(calls)
    stamp = (tmp_path / "repo" / ".venv" / ".nemo_dp_installed").read_text().strip()
    legacy = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + (REPO / "constraints.txt").read_bytes())
    assert stamp == legacy.hexdigest()  # an existing CPU environment stays up to date


def test_a_cuda_build_comes_from_pytorchs_index_and_gets_its_own_stamp(tmp_path: Path) -> None:
    proc, calls = _setup(tmp_path, NEMO_DP_TORCH="cu128")
    assert proc.returncode == 0, proc.stderr
    assert "--index-url https://download.pytorch.org/whl/cu128" in _torch_install(calls)
    assert "installing torch (cu128, pinned)" in proc.stdout
    cuda_stamp = (tmp_path / "repo" / ".venv" / ".nemo_dp_installed").read_text()
    proc, calls = _setup(tmp_path, NEMO_DP_TORCH="cu128", NEMO_DP_TORCH_INDEX_URL="file:///mirror/cu128")
    assert "--index-url file:///mirror/cu128" in _torch_install(calls)
    proc, calls = _setup(tmp_path)  # back to CPU: the CUDA stamp does not count as up to date
    assert calls and "--index-url" not in _torch_install(calls)
    assert (tmp_path / "repo" / ".venv" / ".nemo_dp_installed").read_text() != cuda_stamp


def test_cuda_means_the_cu128_build(tmp_path: Path) -> None:
    proc, calls = _setup(tmp_path, NEMO_DP_TORCH="cuda")
    assert proc.returncode == 0, proc.stderr
    assert "--index-url https://download.pytorch.org/whl/cu128" in _torch_install(calls)


@pytest.mark.parametrize("variant", ["rocm", "gpu", "cu"])
def test_an_unknown_variant_is_refused_naming_the_legal_values(tmp_path: Path, variant: str) -> None:
    proc, calls = _setup(tmp_path, NEMO_DP_TORCH=variant)
    assert proc.returncode == 2 and calls == []
    assert f"NEMO_DP_TORCH={variant}: legal values are cpu (the default), cuda (= cu128) or cu<NNN>" in proc.stderr
