#!/usr/bin/env bash
# The Hopper wgmma prefill kernels (src/cuda/attention/prefill_wgmma*.cuh) on an H100 / H200:
# build, the CUDA tests of both kernels (each step under its own timeout, so a fault in one
# kernel leaves the other's results), then `kvcore bench attention_prefill` (rows: the automatic
# kernel, "_wgmma" warp-specialized, "_wgmma_sync" synchronous; notes: TFLOP/s and the ratios)
# and optionally the SDPA baseline of the same shapes.
#   OUT=<dir> bash bench/gpu/wgmma_prefill.sh            (SDPA=1 adds bench/attention_sdpa_baseline.py)
# Env: TEST_TIMEOUT (s per test group, default 240), BENCH_TIMEOUT (default 300).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
log() { echo "== $(date +%T) $*" | tee -a "$OUT/wgmma.log"; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee -a "$OUT/wgmma.log"
log "build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >> "$OUT/build.log" 2>&1 &&
  cmake --build build -j "$(nproc)" --target kvcore_cli kvcore_cuda_tests >> "$OUT/build.log" 2>&1 ||
  { grep -E 'error|Error' -A3 "$OUT/build.log" | head -40; exit 1; }
for f in 'AttnCuda.WgmmaPrimitives' '*WgmmaPrefillCuda.*/Sync' '*WgmmaPrefillCuda.*/Serial' '*WgmmaPrefillCuda.*/Ws' 'AttnCuda.Prefill*'; do
  log "tests $f"
  timeout "${TEST_TIMEOUT:-240}" ./build/tests/kvcore_cuda_tests --gtest_filter="$f" >> "$OUT/wgmma.log" 2>&1
  echo "exit $?" | tee -a "$OUT/wgmma.log"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|\[wgmma" "$OUT/wgmma.log" | tail -30
done
log "bench attention_prefill"
timeout "${BENCH_TIMEOUT:-300}" ./build/kvcore bench attention_prefill --device cuda --json "$OUT/bench.jsonl" 2>&1 | tee -a "$OUT/wgmma.log" | grep -v "^\[bench\]"
echo "exit $?" | tee -a "$OUT/wgmma.log"
if [ "${SDPA:-0}" = 1 ]; then
  log "SDPA baseline"
  timeout 120 python3 bench/attention_sdpa_baseline.py --json "$OUT/baselines.jsonl" --cases llama8b_prefill 2>&1 | tee -a "$OUT/wgmma.log" | tail -12
fi
log "done"
