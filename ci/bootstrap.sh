#!/usr/bin/env bash
# Set up a working environment from scratch: a virtualenv in .venv with PyTorch and this package.
#
#   bash ci/bootstrap.sh            # .venv with the CPU build of torch (explicit: no multi-GB CUDA pull)
#   KDENGINE_TORCH=skip bash ...    # keep whatever torch the interpreter already has (a GPU runner's)
#   KDENGINE_VENV=path bash ...     # another venv location; KDENGINE_VENV=none installs into the
#                                   # current interpreter (a throwaway GPU image only)
#   KDENGINE_SYSTEM_SITE=1 bash ... # the new venv also sees the interpreter's packages (a GPU runner's
#                                   # CUDA torch) but installs into itself: a fresh venv per CI job
# Idempotent: a second run only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${KDENGINE_VENV:-.venv}"
PY="${PYTHON:-python3}"
if [[ "$VENV" != "none" ]]; then
  if [[ ! -x "$VENV/bin/python" ]]; then
    echo "[bootstrap] creating $VENV"
    if [[ "${KDENGINE_SYSTEM_SITE:-0}" == "1" ]]; then
      "$PY" -m venv --system-site-packages "$VENV"
    else
      "$PY" -m venv "$VENV"
    fi
  fi
  PY="$VENV/bin/python"
fi
PIP=("$PY" -m pip install --disable-pip-version-check -q)

if [[ "${KDENGINE_TORCH:-cpu}" != "skip" ]] && ! "$PY" -c "import torch" 2>/dev/null; then
  # The CPU build, pinned: an unpinned torch would pull a CUDA build of several GB.
  echo "[bootstrap] installing torch==2.13.0 (CPU build)"
  "${PIP[@]}" "torch==2.13.0"
fi
echo "[bootstrap] installing kdengine[dev] (editable)"
"${PIP[@]}" -e ".[dev]"
"$PY" -c "import torch, kdengine; print('[bootstrap] ok: torch', torch.__version__, '| kdengine', kdengine.__version__)"
