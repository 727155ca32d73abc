#!/usr/bin/env bash
# The whole GPU job in one call (device machine: CUDA 13, cmake, ninja, PyTorch; no network):
# build for sm_90, run the CUDA tests (CUDA against CPU), every benchmark with the ceilings
# measured in the same job, the PyTorch/HF baselines, and a summary with ratios.
#   KVCORE_GIT_COMMIT=<hash> OUT=<dir> bash bench/gpu-run.sh [bench names...]
# Pass KVCORE_GIT_COMMIT as a literal from the machine that sent the tree: a copied tree's git
# metadata can name an older commit (run A of 2026-12-03 printed the landed main's hash).
# Env: GPU_RUN_STAGES="build tests bench baselines" (default all), BENCH_ARGS (extra args to kvcore bench),
#      GPU_TEST_FILTER (a gtest filter: only those CUDA tests, no CPU suite), BASELINES (scripts to run,
#      default every bench/*_baseline.py), BUILD_TARGETS (default: everything).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
STAGES=${GPU_RUN_STAGES:-"build tests demo bench baselines"}
COMMIT=${KVCORE_GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
has() { [[ " $STAGES " == *" $1 "* ]]; }
log() { echo "== $(date +%T) $*"; }

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee "$OUT/build.log"
# At most 8 files come back from the device: build.log tests.log bench.log bench.jsonl baselines.log baselines.jsonl summary.md
if has build; then
  log "build (commit $COMMIT)"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DKVCORE_GIT_COMMIT="$COMMIT" >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  cmake --build build -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} >> "$OUT/build.log" 2>&1 || { grep -E 'error|Error' -A3 "$OUT/build.log" | head -60; exit 1; }
  ./build/kvcore info
fi
if has tests; then
  if [ -n "${GPU_TEST_FILTER:-}" ]; then
    log "CUDA tests matching $GPU_TEST_FILTER"
    ./build/tests/kvcore_cuda_tests --gtest_filter="$GPU_TEST_FILTER" > "$OUT/tests.log" 2>&1
    grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Exception|\[attn|tests ran" "$OUT/tests.log" | head -60
  else
    log "CUDA tests (CUDA against CPU) and the CPU suite"
    (cd build && ctest -L gpu --output-on-failure --timeout 600 -j 4) > "$OUT/tests.log" 2>&1
    grep -E "tests passed|Failed|\*\*\*|Exception" "$OUT/tests.log" | head -40
    (cd build && ctest -L cpu -j 16 --timeout 300) >> "$OUT/tests.log" 2>&1
    grep -E "tests passed" "$OUT/tests.log" | tail -1
  fi
fi
if has demo; then
  log "demo on the GPU (quick sizes: the float64 checks run on the host)"
  ./build/kvcore demo --device cuda --quick 2>&1 | tee -a "$OUT/tests.log" | grep -E "^==|FAILED|passed|ok \(|demo " | head -60
fi
if has bench; then
  log "benchmarks"
  names=("$@")
  [ ${#names[@]} -gt 0 ] || names=($(./build/kvcore info | awk '/^benchmarks:/{b=1;next} b&&/^  /{print $1}'))
  for n in "${names[@]}"; do
    log "bench $n"
    timeout "${BENCH_TIMEOUT:-300}" ./build/kvcore bench "$n" --device cuda --json "$OUT/bench.jsonl" ${BENCH_ARGS:-} 2>&1 \
      | tee -a "$OUT/bench.log" | grep -v "^\[bench\]"
  done
fi
if has baselines; then
  log "PyTorch / HF baselines"
  for s in ${BASELINES:-bench/*_baseline.py}; do
    [ -f "$s" ] || continue
    log "$s"
    python3 "$s" --json "$OUT/baselines.jsonl" 2>&1 | tee -a "$OUT/baselines.log" | tail -25
  done
fi
if [ -f bench/summarize.py ]; then
  python3 bench/summarize.py "$OUT" > "$OUT/summary.md" 2>&1; cat "$OUT/summary.md"
fi
log "done"
