#!/usr/bin/env bash
# The whole GPU job in one call (device machine: CUDA 13, cmake, ninja, PyTorch; no network):
# build for sm_90, run the CUDA tests (CUDA against CPU), every benchmark with the ceilings
# measured in the same job, the PyTorch/HF baselines, and a summary with ratios.
#   KVCORE_GIT_COMMIT=<hash> OUT=<dir> bash bench/gpu-run.sh [bench names...]
# Env: GPU_RUN_STAGES="build tests bench baselines" (default all), BENCH_ARGS (extra args to kvcore bench).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
STAGES=${GPU_RUN_STAGES:-"build tests bench baselines"}
COMMIT=${KVCORE_GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
has() { [[ " $STAGES " == *" $1 "* ]]; }
log() { echo "== $(date +%T) $*"; }

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if has build; then
  log "build (commit $COMMIT)"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DKVCORE_GIT_COMMIT="$COMMIT" > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
  cmake --build build -j "$(nproc)" > "$OUT/build.log" 2>&1 || { grep -E 'error|Error' -A3 "$OUT/build.log" | head -60; exit 1; }
  ./build/kvcore info
fi
if has tests; then
  log "CUDA tests (CUDA against CPU) and the CPU suite"
  (cd build && ctest -L gpu --output-on-failure --timeout 600 -j 4) > "$OUT/gpu-tests.log" 2>&1
  tail -15 "$OUT/gpu-tests.log"
  (cd build && ctest -L cpu -j 16 --timeout 300) > "$OUT/cpu-tests.log" 2>&1
  tail -3 "$OUT/cpu-tests.log"
fi
if has bench; then
  log "benchmarks"
  rm -f "$OUT/bench.jsonl"
  ./build/kvcore bench --device cuda --json "$OUT/bench.jsonl" ${BENCH_ARGS:-} "$@" 2> "$OUT/bench.err" | tee "$OUT/bench.txt"
  tail -5 "$OUT/bench.err"
fi
if has baselines; then
  log "PyTorch / HF baselines"
  for s in bench/*_baseline.py; do
    [ -f "$s" ] || continue
    log "$s"
    python3 "$s" --json "$OUT/baselines.jsonl" 2>&1 | tail -40
  done
fi
if [ -f bench/summarize.py ]; then
  python3 bench/summarize.py "$OUT" > "$OUT/summary.md" 2>&1; cat "$OUT/summary.md"
fi
log "done"
