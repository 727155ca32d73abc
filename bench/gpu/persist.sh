#!/usr/bin/env bash
# The offload tier's GPU job (issue 22) in one call: build, the CUDA tests of BlockOffloader
# (CPU vs CUDA bytes, holder keeping blocks under a queued copy, loads waiting for the copy, the
# offload copy overlapping a kernel on the compute stream: PersistOffloadCuda.*), then
# `kvcore bench persist --device cuda` (snapshots on a CUDA cache vs dd; offload to pinned memory
# and back vs cudaMemcpyAsync; an 8k-token Llama-3-8B prefix served from device blocks and from
# pinned memory vs recomputing its prefill attention).
#   OUT=<dir> KVCORE_GIT_COMMIT=<hash> bash bench/gpu/persist.sh
# Files in $OUT: build.log tests.log bench.log bench.jsonl. Set BUILD to reuse a configured CUDA build.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BUILD=${BUILD:-build}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
COMMIT=${KVCORE_GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/build.log"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DKVCORE_GIT_COMMIT="$COMMIT" >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" --target kvcore_cli kvcore_cuda_tests >> "$OUT/build.log" 2>&1 \
  || { grep -E 'error|Error' -A3 "$OUT/build.log" | head -60; exit 1; }
echo "== offload tests"
timeout 300 "./$BUILD/tests/kvcore_cuda_tests" --gtest_filter='PersistOffloadCuda.*' > "$OUT/tests.log" 2>&1; rc=$?
grep -E "^\[  (PASSED|FAILED) |Failure|offload overlap|tests ran" "$OUT/tests.log" | head -40
echo "== bench persist --device cuda"
KVCORE_BENCH_DIR=${KVCORE_BENCH_DIR:-/tmp/kvcore-bench-persist} timeout 400 "./$BUILD/kvcore" bench persist --device cuda \
  --json "$OUT/bench.jsonl" 2>&1 | tee "$OUT/bench.log"
echo "tests rc=$rc"
