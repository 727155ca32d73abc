#!/usr/bin/env bash
# KV transfer's GPU job (issue 25) in one call: build, the single-GPU tests (CUDA block copies
# against the CPU, loopback transfers between two caches on one GPU), the 2-GPU tests (NCCL within
# one process and between two; they skip, saying why, on one GPU) and `kvcore bench transfer`
# (pack/unpack and loopback on one GPU; NCCL, cudaMemcpyPeer and flat NCCL rows need two).
#   OUT=<dir> KVCORE_GIT_COMMIT=<hash> bash bench/gpu/transfer.sh
# Files in $OUT: build.log tests.log bench.log bench.jsonl. NVLink SHARP stays off.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH" NCCL_NVLS_ENABLE=0
COMMIT=${KVCORE_GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/build.log"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DKVCORE_GIT_COMMIT="$COMMIT" >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
grep "NCCL transport" "$OUT/build.log"
cmake --build build -j "$(nproc)" --target kvcore_cli kvcore_cuda_tests kvcore_gpu2_tests >> "$OUT/build.log" 2>&1 \
  || { grep -E 'error|Error' -A3 "$OUT/build.log" | head -60; exit 1; }
echo "== single-GPU tests"
./build/tests/kvcore_cuda_tests --gtest_filter='TransferCuda*' > "$OUT/tests.log" 2>&1; rc1=$?
echo "== 2-GPU tests"
timeout 300 ./build/tests/kvcore_gpu2_tests >> "$OUT/tests.log" 2>&1; rc2=$?
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|Failure|Skipped|needs 2 GPUs|tests ran" "$OUT/tests.log" | head -40
echo "== bench transfer"
timeout 540 ./build/kvcore bench transfer --device cuda --json "$OUT/bench.jsonl" 2>&1 | tee "$OUT/bench.log"
echo "tests: single-GPU rc=$rc1, 2-GPU rc=$rc2"
