#!/usr/bin/env bash
# MLA's shared layout (PagedCacheConfig::v_from_k_latent: V read in place from K's 512-dim latent)
# on an H100 / H200: build, the CUDA tests that read V through a strided view (the MLA cache
# against the CPU cache and float64, V in pools of its own and shared; every head dim's decode
# and prefill, whose V indexing changed), then `kvcore bench attention_mla` (rows "_separate" and
# "_shared": bf16 / FP8 at batch x context 1 x 128k, 16 x 32k, 64 x 8k, 64 x 32k) and the
# a few Llama-3-8B decode rows of `kvcore bench attention` (the separate-V kernels' before/after check:
# compare with the same rows of main's build on the same card).
#   OUT=<dir> bash bench/gpu/mla_shared_v.sh
# Env: TEST_TIMEOUT (s per test group, default 300), BENCH_TIMEOUT (default 300).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
log() { echo "== $(date +%T) $*" | tee -a "$OUT/mla.log"; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee -a "$OUT/mla.log"
log "build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >> "$OUT/build.log" 2>&1 &&
  cmake --build build -j "$(nproc)" --target kvcore_cli kvcore_cuda_tests >> "$OUT/build.log" 2>&1 ||
  { grep -E 'error|Error' -A3 "$OUT/build.log" | head -40; exit 1; }
for f in 'Formats/PagedMlaCuda.*' 'AttnHeadDimsCuda.*' 'AttnCuda.*'; do
  log "tests $f"
  timeout "${TEST_TIMEOUT:-300}" ./build/tests/kvcore_cuda_tests --gtest_filter="$f" >> "$OUT/mla.log" 2>&1
  echo "exit $?" | tee -a "$OUT/mla.log"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|\[paged mla cuda\]" "$OUT/mla.log" | tail -40
done
log "bench attention_mla"
timeout "${BENCH_TIMEOUT:-300}" ./build/kvcore bench attention_mla --device cuda --json "$OUT/bench.jsonl" 2>&1 | tee -a "$OUT/mla.log"
echo "exit $?" | tee -a "$OUT/mla.log"
log "bench attention (llama8b decode rows)"
timeout "${BENCH_TIMEOUT:-300}" ./build/kvcore bench attention --device cuda --case llama8b_f16_b16_ctx8192 llama8b_fp8_b16_ctx8192 llama8b_f16_b64_ctx32768 llama8b_fp8_b1_ctx131072 --json "$OUT/bench.jsonl" 2>&1 | tee -a "$OUT/mla.log" | grep -v "^\[bench\]"
echo "exit $?" | tee -a "$OUT/mla.log"
log "done"
