#!/usr/bin/env bash
# Set up, build and run the test suite. CPU tests always; the CUDA code is
# compiled whenever nvcc is present, and CUDA tests (label gpu) run only where a GPU is.
#   bash scripts/test.sh            # normal build: unit tests, fixture replays, exhaustive codec sweeps
#   KVCORE_SANITIZE=1 bash scripts/test.sh   # ASan/UBSan build, skips the exhaustive sweeps
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD=${KVCORE_BUILD_DIR:-build}
ARGS=(-DCMAKE_BUILD_TYPE=Release -DKVCORE_WERROR=${KVCORE_WERROR:-ON})
LABELS=()
if [ "${KVCORE_SANITIZE:-0}" = 1 ]; then
  BUILD=${KVCORE_BUILD_DIR:-build-asan}
  ARGS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVCORE_SANITIZE=ON -DKVCORE_CUDA=OFF -DKVCORE_WERROR=ON)
  LABELS=(-LE "gpu|exhaustive")
fi
# The Python module and its pytest suite (not under the sanitizers): a virtual environment in the
# build directory with nanobind, numpy and pytest from PyPI. (torch is not installed: PyPI's
# default torch wheel brings gigabytes of CUDA libraries; its tests skip without it.)
if [ "${KVCORE_SANITIZE:-0}" != 1 ] && [ "${KVCORE_PYTHON:-1}" = 1 ]; then
  VENV="$BUILD/pyenv"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/python" -c "import nanobind, numpy, pytest" 2>/dev/null ||
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check nanobind numpy pytest
  ARGS+=(-DKVCORE_PYTHON=ON "-DPython_EXECUTABLE=$(cd "$VENV/bin" && pwd)/python")
fi
# ccache, where installed, keeps rebuilds of unchanged files cheap (paths taken relative to the tree).
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="$(pwd)" CCACHE_NOHASHDIR=1
  ARGS+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$BUILD" -G Ninja "${ARGS[@]}" ${KVCORE_CMAKE_ARGS:-}
cmake --build "$BUILD"
if [ ${#LABELS[@]} -eq 0 ]; then
  # GPU tests only where a GPU answers
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then LABELS=(); else LABELS=(-LE gpu); fi
fi
cd "$BUILD"
ctest --output-on-failure -j "$(nproc)" "${LABELS[@]}"
