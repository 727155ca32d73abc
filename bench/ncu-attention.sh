#!/usr/bin/env bash
# Profile the tensor-core decode kernel with Nsight Compute on the device machine, after timing
# the attention cases once. Needs a GPU; builds the kvcore tool (and the
# CUDA tests when GPU_TEST_FILTER names some).
#   OUT=<dir> bash bench/ncu-attention.sh [case names...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(llama8b_fp8_b16_ctx32768 llama8b_f16_b16_ctx8192)
if [ ! -x build/kvcore ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build.log" 2>&1
  cmake --build build -j "$(nproc)" --target kvcore ${GPU_TEST_FILTER:+kvcore_cuda_tests} >> "$OUT/build.log" 2>&1 ||
    { grep -E 'error' -A3 "$OUT/build.log" | head -40; exit 1; }
fi
if [ -n "${GPU_TEST_FILTER:-}" ]; then
  ./build/tests/kvcore_cuda_tests --gtest_filter="$GPU_TEST_FILTER" > "$OUT/tests.log" 2>&1
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|tests ran" "$OUT/tests.log" | head -30
fi
./build/kvcore bench ceilings --device cuda 2>&1 | grep -v "^\[bench\]" | tee -a "$OUT/ab.log"
# shellcheck disable=SC2086
./build/kvcore bench attention --device cuda --case ${ABCASES:-b16_ctx8192 b16_ctx32768 b64_ctx8192} \
  2>&1 | grep -v "^\[bench\]" | grep -v _simt | tee -a "$OUT/ab.log"
for c in "${cases[@]}"; do
  echo "== ncu $c"
  ncu --clock-control none -k regex:mma_decode --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
      ./build/kvcore bench attention --device cuda --case "$c" --reps 3 > "$OUT/ncu-$c.txt" 2>&1
  grep -E "DRAM Throughput|Memory Throughput|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issued Ipc|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Block Limit" "$OUT/ncu-$c.txt" | head -30
done
