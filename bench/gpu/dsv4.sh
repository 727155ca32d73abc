#!/usr/bin/env bash
# The DeepSeek-V4 job of a GPU session (device machine), for work on its kernels: builds the kvcore
# tool and the CUDA tests, runs the DeepSeek-V4 CUDA tests (CUDA against the CPU on fresh random
# inputs), `kvcore bench dsv4` and HF's baseline of the same work (bench/dsv4_hf_baseline.py) in
# one job, then the Nsight Compute profiles named in PROFILE_TARGETS (bench/ncu-profile.sh).
#   KVCORE_GIT_COMMIT=<hash> OUT=<dir> [PROFILE_TARGETS=...] [SKIP_HF=1] bash bench/gpu/dsv4.sh
source "$(dirname "$0")/job.sh"
log "build ${KVCORE_GIT_COMMIT:-unknown}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DKVCORE_WERROR=OFF \
      -DCMAKE_CUDA_FLAGS="-lineinfo" -DKVCORE_GIT_COMMIT="${KVCORE_GIT_COMMIT:-unknown}" > "$OUT/build.log" 2>&1 &&
  cmake --build build -j "$(nproc)" --target kvcore_cli kvcore_cuda_tests >> "$OUT/build.log" 2>&1 ||
  { grep -E 'error' -A3 "$OUT/build.log" | head -40; exit 1; }
log "DeepSeek-V4 CUDA tests"
(cd build && ctest -L gpu -R Dsv4 --output-on-failure --timeout 120) > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
log "kvcore bench dsv4"
timeout 200 ./build/kvcore bench dsv4 --device cuda --json "$OUT/dsv4.jsonl" > "$OUT/dsv4.log" 2>&1 || log "bench rc $?"
grep -E "indexer|decode43" "$OUT/dsv4.log" | cut -c1-130
if [ -z "${SKIP_HF:-}" ]; then
  log "HF baseline"
  KVCORE_GIT_COMMIT="${KVCORE_GIT_COMMIT:-unknown}" timeout 150 python3 bench/dsv4_hf_baseline.py --device cuda --reps 5 --contexts 8192 65536 --json "$OUT/dsv4-hf.jsonl" \
    > "$OUT/dsv4-hf.log" 2>&1 || log "HF baseline rc $?"
  tail -8 "$OUT/dsv4-hf.log"
fi
if [ -n "${PROFILE_TARGETS:-}" ]; then
  log "profiles"
  OUT="$OUT" bash bench/ncu-profile.sh
fi
log done
