#!/usr/bin/env bash
# The Python environment of a build directory, shared by test.sh and demo.sh: a virtual environment
# at <build>/pyenv with nanobind, numpy and pytest from PyPI and, unless KVCORE_HF=0, what kvcore.hf
# needs: torch, transformers (>= 5.17, < 6), gguf and accelerate (GGUF loading). PyPI's default torch
# wheel brings its CUDA libraries (about 100 s and 5.6 GB; PyPI has no CPU-only torch, and that
# wheel does not import without them). Installs only what is missing.
#   bash scripts/pyenv.sh <build dir>
set -euo pipefail
VENV="$1/pyenv"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -c "import nanobind, numpy, pytest" 2>/dev/null ||
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check nanobind numpy pytest
if [ "${KVCORE_HF:-1}" = 1 ]; then
  "$VENV/bin/python" -c "import torch, transformers, gguf, accelerate" 2>/dev/null ||
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check torch "transformers>=5.17,<6" gguf accelerate
fi
