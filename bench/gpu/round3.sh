#!/usr/bin/env bash
# What issue 24 (GPU round 3) still has to measure, as phases of one GPU call or of two on the
# same warm machine (the build stays): the folders .whl and .gpu staged by bench/gpu/stage.sh
# [BEFORE's commit] and carried.
#   dsv4     this tree's tool and CUDA tests built (bench/gpu/builds.sh, BEFORE's tool beside it),
#            every CUDA test but the wgmma prefill ones and the two-GPU ones, then the DeepSeek-V4
#            decode step bench (automatic, the tuned opt-ins, the graph) and HF's baseline at 8k
#            and 64k in the same job;
#   wgmma    the wgmma prefill tests on their own, under a short limit: a kernel whose named
#            barriers never meet hangs instead of failing, and must not eat the call;
#   prefill  bench/gpu/prefill.sh: the prefill variants (BEFORE's beside), the append bench,
#            FlashInfer's prefill on the same shapes (its JIT warmed in the background from
#            the start of the call), Nsight profiles per PROFILE (default none); kvcore's rows
#            beside FlashInfer's with ratios in $OUT/prefill-summary.md.
# wgmma and prefill alone reuse the build an earlier dsv4 phase left on a warm machine (and
# configure one if the machine is fresh). FI_WARM=1 starts FlashInfer's JIT warm-up in a call
# without the prefill phase too (into build-fi/, which a later call on the warm machine reuses).
#   OUT=<dir> KVCORE_GIT_COMMIT=<hash> [BEFORE=<commit>] [PROFILE="tma pp"] [FI_WARM=1] bash bench/gpu/round3.sh [dsv4] [wgmma] [prefill]
source "$(dirname "$0")/job.sh"
export OUT
phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=(dsv4 wgmma prefill)
wants() { [[ " ${phases[*]} " == *" $1 "* ]]; }

fi_warm=""
if { wants prefill || [ -n "${FI_WARM:-}" ]; } && [ -d .whl ] && [ -z "${SKIP_FI:-}" ]; then
  flashinfer_env  # installed before the warm-up and prefill.sh look for it
  nice python3 bench/attention_flashinfer_baseline.py --warm-only --cases prefill > "$OUT/fi-warm.log" 2>&1 &
  fi_warm=$!
fi

if wants dsv4; then
  BUILD_J=${BUILD_J:-16} TREES=${BEFORE:-} TESTS=. CTEST_EXCLUDE='Wgmma|gpu2|Nccl' CTEST_J=4 ROUNDS=1 \
    HF_CONTEXTS="8192 65536" bash bench/gpu/builds.sh dsv4 "decode43 cache step" || log "dsv4 phase rc $?"
  grep -E "tests passed|\(Failed\)|\(Timeout\)|\*\*\*" "$OUT/tests.log" | head -20
  grep -E "step|top-k|scores" "$OUT/bench.log" | head -40
fi

configured() {  # a build folder for the later phases, when no dsv4 phase left one
  [ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DKVCORE_WERROR=OFF -DKVCORE_GIT_COMMIT="${KVCORE_GIT_COMMIT:-unknown}" > "$OUT/configure.log" 2>&1
}

if wants wgmma; then
  configured
  [ -x build/tests/kvcore_cuda_tests ] || cmake --build build -j "${BUILD_J:-16}" --target kvcore_cuda_tests > "$OUT/build-tests.log" 2>&1
  log "wgmma prefill tests"
  (cd build && timeout 120 ctest -L gpu -R Wgmma -j 4 --output-on-failure --timeout 40) > "$OUT/wgmma-tests.log" 2>&1 ||
    log "wgmma tests rc $?"
  grep -E "tests passed|\(Failed\)|\(Timeout\)" "$OUT/wgmma-tests.log" | tail -20
fi

if wants prefill; then
  configured
  [ -x build/kvcore ] || cmake --build build -j "${BUILD_J:-16}" --target kvcore_cli > "$OUT/build-cli.log" 2>&1
  OLD_TREES=${BEFORE:-} APPEND=1 FI_WARM_PID=$fi_warm PROFILE=${PROFILE:-} bash bench/gpu/prefill.sh
  # kvcore's prefill rows beside FlashInfer's with ratios (bench/summarize.py reads a job folder).
  mkdir -p "$OUT/prefill-job" && cp "$OUT/prefill.jsonl" "$OUT/prefill-job/bench.jsonl" 2>/dev/null &&
    cp "$OUT/baselines.jsonl" "$OUT/prefill-job/" 2>/dev/null
  python3 bench/summarize.py "$OUT/prefill-job" > "$OUT/prefill-summary.md" 2>&1 && rm -rf "$OUT/prefill-job"
fi
if [ -n "$fi_warm" ] && ! wants prefill; then  # the warm-up's JIT cache is the point: let it finish
  log "waiting for FlashInfer's warm-up"
  wait "$fi_warm"; tail -3 "$OUT/fi-warm.log"
fi
log "round3 done: ${phases[*]}"
