# A/B run of 2026-12-04 (device machine): prefill key passes (KVCORE_PREFILL_PASSES) and the decode
# copies' L2 prefetch size (a second build with KVCORE_CP_ASYNC_L2_PREFETCH=256), interleaved.
# (The L2 prefetch flag was removed after this run: 1-3% slower on every 16-bit case, results run R.)
set -o pipefail
OUT=${OUT:-out}
OUT=$OUT GPU_TEST_FILTER='AttnCuda.*' BENCH_TIMEOUT=150 BENCH_CMDS="$(cat bench/ab/2026-12-04-prefill-passes.txt)" bash bench/gpu-run-focus.sh 2>&1 | tail -60
echo "== PASSES=1 tests"
KVCORE_PREFILL_PASSES=1 ./build/tests/kvcore_cuda_tests --gtest_filter='AttnCuda.Prefill*:AttnCuda.Position*' 2>&1 | grep -E "^\[  (PASSED|FAILED)|Failure" | head
echo "== $(date +%T) build with L2::256B prefetch"
cmake -S . -B build_l2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_CUDA_FLAGS=-DKVCORE_CP_ASYNC_L2_PREFETCH=256 > "$OUT/build_l2.log" 2>&1 &&
  cmake --build build_l2 -j "$(nproc)" --target kvcore >> "$OUT/build_l2.log" 2>&1 || { tail -20 "$OUT/build_l2.log"; exit 1; }
for b in build build_l2 build build_l2; do
  echo "== $(date +%T) $b"
  ./$b/kvcore bench attention --device cuda --case f16_b16_ctx32768 --case f16_b16_ctx131072 --case f16_b64_ctx32768 \
    --case fp8_b16_ctx32768 --case fp8_b1_ctx131072 2>&1 | grep -E "^attention" | grep -v simt
done
