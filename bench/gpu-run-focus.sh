#!/usr/bin/env bash
# A focused GPU job (device machine) for A/B work between full runs: build the tool and the CUDA
# tests, run a gtest filter, then the given `kvcore bench` invocations, with the ceilings first.
#   OUT=<dir> [BUILD_TARGETS=kvcore] GPU_TEST_FILTER='AttnCuda.*' BENCH_CMDS=$'attention --case b1_ctx32768\n...' bash bench/gpu-run-focus.sh
# A line of BENCH_CMDS may start with VAR=value words (environment for that line only).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
log() { echo "== $(date +%T) $*"; }
log "build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build.log" 2>&1 &&
  cmake --build build -j "$(nproc)" --target ${BUILD_TARGETS:-kvcore kvcore_cuda_tests} >> "$OUT/build.log" 2>&1 ||
  { grep -E 'error' -A3 "$OUT/build.log" | head -40; exit 1; }
if [ -n "${GPU_TEST_FILTER:-}" ]; then
  log "CUDA tests $GPU_TEST_FILTER"
  ./build/tests/kvcore_cuda_tests --gtest_filter="$GPU_TEST_FILTER" > "$OUT/tests.log" 2>&1
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Exception|tests ran" "$OUT/tests.log" | head -40
fi
./build/kvcore bench ceilings --device cuda 2>&1 | grep -v "^\[bench\]"
while IFS= read -r line; do
  [ -n "$line" ] || continue
  log "bench $line"
  envpart=$(echo "$line" | grep -oE '^([A-Z_]+=[^ ]+ )*')
  rest=${line#"$envpart"}
  eval "timeout ${BENCH_TIMEOUT:-200} env $envpart ./build/kvcore bench $rest --device cuda" 2>&1 \
    | tee -a "$OUT/bench.log" | grep -v "^\[bench\] llama" | grep -v "_simt"
done <<< "${BENCH_CMDS:-}"
log "done"
