# A/B run of 2026-12-04 (device machine, run X): decode CTAs that share their tiles through a counter,
# one 16-warp CTA an SM for FP8 pages (default) against 4-warp CTAs (KVCORE_ATTN_FP8_WARPS=4), and
# 8-warp CTAs for 16-bit pages (KVCORE_ATTN_16BIT_WARPS=8) against 4-warp ones (default),
# interleaved. All CUDA tests first (and the attention tests with 8-warp 16-bit CTAs), then the
# decode_trace timelines of both.
set -o pipefail
OUT=${OUT:-out}
mkdir -p "$OUT/trace"
OUT=$OUT BUILD_TARGETS="kvcore_cli kvcore_cuda_tests" GPU_TEST_FILTER='*' BENCH_CMDS="" bash bench/gpu-run-focus.sh 2>&1 | tail -8
echo "== $(date +%T) attention tests with KVCORE_ATTN_16BIT_WARPS=8 KVCORE_ATTN_FP8_WARPS=4"
KVCORE_ATTN_16BIT_WARPS=8 KVCORE_ATTN_FP8_WARPS=4 ./build/tests/kvcore_cuda_tests --gtest_filter='AttnCuda.*' 2>&1 | grep -E "^\[  (PASSED|FAILED) |Failure" | head
echo "== $(date +%T) decode_trace (default)"
KVCORE_TRACE_DIR=$OUT/trace ./build/kvcore bench decode_trace --device cuda 2>&1 | grep -v "^\[bench\]"
echo "== $(date +%T) decode_trace (FP8 4 warps, 16-bit 8 warps)"
KVCORE_ATTN_FP8_WARPS=4 KVCORE_ATTN_16BIT_WARPS=8 ./build/kvcore bench decode_trace --device cuda 2>&1 | grep -v "^\[bench\]"
cases="--case fp8_b1_ctx8192 --case fp8_b1_ctx32768 --case fp8_b1_ctx131072 --case fp8_b16_ctx8192 --case fp8_b16_ctx32768 --case fp8_b64_ctx1024 --case fp8_b64_ctx8192 --case fp8_b64_ctx131072 --case f16_b1_ctx32768 --case f16_b16_ctx8192 --case f16_b16_ctx131072 --case f16_b64_ctx1024 --case f16_b64_ctx131072"
for cfg in A B A B; do
  if [ $cfg = A ]; then env=""; else env="KVCORE_ATTN_FP8_WARPS=4 KVCORE_ATTN_16BIT_WARPS=8"; fi
  echo "== $(date +%T) config $cfg ($env)"
  env $env ./build/kvcore bench attention --device cuda $cases 2>&1 | grep -E "^attention " | grep -v simt
done
echo "== $(date +%T) done"
# (Run X used these knobs; since then the FP8 choice is automatic (mma_attn::fat_decode) with
# KVCORE_ATTN_FAT_CTAS=0 as its off switch, and the 8-warp 16-bit variant is gone: +2% at batch
# 16 / 8k only, worse at batch 1 and 64.)
