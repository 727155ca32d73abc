set -o pipefail
OUT=$OUT GPU_TEST_FILTER='AttnCuda.*' BENCH_TIMEOUT=150 BENCH_CMDS="$(cat bench/ab/2026-12-04-prefill-passes.txt)" bash bench/gpu-run-focus.sh 2>&1 | tail -60
echo "== PASSES=1 tests"
KVCORE_PREFILL_PASSES=1 ./build/tests/kvcore_cuda_tests --gtest_filter='AttnCuda.Prefill*:AttnCuda.Position*' 2>&1 | grep -E "^\[  (PASSED|FAILED)|Failure" | head
