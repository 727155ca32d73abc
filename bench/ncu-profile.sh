#!/usr/bin/env bash
# Nsight Compute profiles of chosen kernels on the device machine: one line per target,
#   "<bench> | <case substring> | <kernel regex> | <launch skip> | <tag>"
# in PROFILE_TARGETS (newline separated). Writes $OUT/ncu-<tag>.txt (sections) and, with
# NCU_SASS=1, $OUT/ncu-<tag>-sass.csv (per-instruction stall samples and executed instructions;
# NCU_SAMPLING=<0-31> sets the sampling interval). Builds the kvcore tool.
#   OUT=<dir> PROFILE_TARGETS="..." bash bench/ncu-profile.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
if [ ! -x build/kvcore ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_CUDA_FLAGS="-lineinfo" > "$OUT/build.log" 2>&1
  cmake --build build -j "$(nproc)" --target kvcore >> "$OUT/build.log" 2>&1 ||
    { grep -E 'error' -A3 "$OUT/build.log" | head -40; exit 1; }
fi
./build/kvcore bench ceilings --device cuda 2>&1 | grep -v "^\[bench\]"
sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats
          --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis)
while IFS='|' read -r bench kase kern skip tag; do
  bench=$(echo $bench); kern=$(echo $kern); skip=$(echo $skip); tag=$(echo $tag); kase=$(echo "$kase" | sed 's/^ *//;s/ *$//')
  [ -n "$bench" ] || continue
  echo "== ncu $tag ($bench / $kase / $kern, skip $skip)"
  extra=()
  # NCU_SAMPLING: the warp-state sampling interval (2^(5 + n) cycles; 0 = every 32 cycles), for short kernels
  # whose default interval leaves a handful of samples.
  [ "${NCU_SASS:-0}" = 1 ] && extra=(--section SourceCounters --import-source no -o "$OUT/rep-$tag" -f
                                     ${NCU_SAMPLING:+--warp-sampling-interval $NCU_SAMPLING})
  timeout 240 ncu --clock-control none -k "regex:$kern" --launch-skip "$skip" --launch-count 1 "${sections[@]}" "${extra[@]}" \
      ./build/kvcore bench "$bench" --device cuda --case "$kase" --reps 3 > "$OUT/ncu-$tag.txt" 2>&1
  if [ "${NCU_SASS:-0}" = 1 ] && [ -f "$OUT/rep-$tag.ncu-rep" ]; then
    ncu -i "$OUT/rep-$tag.ncu-rep" "${sections[@]}" > "$OUT/ncu-$tag.txt" 2>&1
    ncu -i "$OUT/rep-$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu-$tag-sass.csv" 2>/dev/null
    rm -f "$OUT/rep-$tag.ncu-rep"
  fi
  grep -E "^  [a-zA-Z_].*\(|DRAM Throughput|Memory Throughput|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issued Ipc|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Block Limit|L2 Hit|L1/TEX Hit|Grid Size" "$OUT/ncu-$tag.txt" | head -30
done <<< "${PROFILE_TARGETS:-}"
