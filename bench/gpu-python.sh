#!/usr/bin/env bash
# The Python package on the GPU machine (CUDA 13, cmake, ninja, python3 with torch, nanobind,
# numpy and pytest; no network): build kvcore._ext with CUDA for sm_90 into BUILD (default
# `build`, the directory bench/gpu-run.sh builds: after its build stage only the module compiles),
# run the whole pytest suite with CUDA tensors (test_cuda.py: side streams, graph capture, FP8
# views, engine-allocated pools; test_torch.py's cuda cases), then the per-call overhead bench
# on cuda:0 with FlashInfer's run() beside kvcore's when flashinfer is importable (carry its wheel).
# Everything goes to one file, $OUT/python.log (OUT defaults to out).
#   OUT=<dir> bash bench/gpu-python.sh [BUILD]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT=${OUT:-out}
mkdir -p "$OUT"
LOG="$OUT/python.log"
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
PY=$(command -v python3)
log() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
log "configure + build kvcore_python (CUDA, sm_90) in $BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DKVCORE_PYTHON=ON -DPython_EXECUTABLE="$PY" >> "$LOG" 2>&1 || { tail -30 "$LOG"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" --target kvcore_python kvcore_overhead_cpp >> "$LOG" 2>&1 ||
  { grep -E 'error|Error' -A3 "$LOG" | head -60; exit 1; }
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tee -a "$LOG"
log "pytest with CUDA tensors"
PYTHONPATH="$BUILD/python" timeout 600 "$PY" -m pytest -q -rs -p no:cacheprovider python/tests 2>&1 | tee -a "$LOG" | tail -25
rc=${PIPESTATUS[0]}
log "per-call overhead on cuda:0 (FlashInfer run() beside kvcore's when importable)"
OMP_NUM_THREADS=1 PYTHONPATH="$BUILD/python" timeout 300 "$PY" python/bench/overhead.py \
  "$BUILD/python/kvcore_overhead_cpp" --device cuda 2>&1 | tee -a "$LOG"
exit "$rc"
