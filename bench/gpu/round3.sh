#!/usr/bin/env bash
# What issue 24 (GPU round 3) still has to measure, as steps of one GPU call, run in the order
# given, each cut to the time the call has left (JOB_BUDGET_S, default 575 s from the start), so
# that a call that runs out keeps what the earlier steps measured. The folders .whl and .gpu
# staged by bench/gpu/stage.sh [BEFORE's commit] are carried.
#   build    this tree's tool and CUDA tests (and BEFORE's tool beside them, if given);
#   wgmma    the wgmma prefill tests on their own, under a short limit: a kernel whose named
#            barriers never meet hangs instead of failing, and must not eat the call;
#   dsv4     the DeepSeek-V4 CUDA tests, then its decode step bench (automatic, the tuned opt-ins,
#            the graph);
#   prefill  bench/gpu/prefill.sh: the prefill variants (BEFORE's beside), the append bench,
#            FlashInfer's prefill on the same shapes (its JIT warmed in the background from the
#            start of the call), Nsight profiles per PROFILE (default none); kvcore's rows beside
#            FlashInfer's with ratios in $OUT/prefill-summary.md;
#   tests    every other CUDA test (not the wgmma, two-GPU or NCCL ones, nor DeepSeek-V4's when
#            the dsv4 step ran them);
#   hf       HF's DeepSeek-V4 baseline at 8k and 64k (bench/dsv4_hf_baseline.py), same job.
# Default order: build wgmma dsv4 prefill tests hf. The other steps use the build step's build:
# of the same call, or of an earlier call on the same warm machine. FI_WARM=1 warms FlashInfer's JIT (into build-fi/)
# without the prefill step too. BUILD_TARGETS narrows the build (e.g. kvcore_cuda_tests for a short
# call that only tests).
#   OUT=<dir> KVCORE_GIT_COMMIT=<hash> [BEFORE=<commit>] [PROFILE="tma pp"] [JOB_BUDGET_S=575] bash bench/gpu/round3.sh [step ...]
source "$(dirname "$0")/job.sh"
export OUT
COMMIT=${KVCORE_GIT_COMMIT:-unknown}
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(build wgmma dsv4 prefill tests hf)
wants() { [[ " ${steps[*]} " == *" $1 "* ]]; }
left() { echo $(( ${JOB_BUDGET_S:-575} - ($(date +%s) - START) )); }
# fits <seconds>: whether a step that needs that long still fits; says so when it does not.
fits() { [ "$(left)" -ge "$1" ] || { log "skipped: $2 needs $1 s, $(left) s left"; return 1; }; }

fi_warm="" dsv4_tested=""
if { wants prefill || [ -n "${FI_WARM:-}" ]; } && [ -d .whl ] && [ -z "${SKIP_FI:-}" ]; then
  start_flashinfer_warm
fi

for step in "${steps[@]}"; do
  case $step in
    build)
      old=""
      if [ -n "${BEFORE:-}" ]; then
        build_old_tool "$BEFORE" &
        old=$!
      fi
      log "build $COMMIT: ${BUILD_TARGETS:-kvcore_cli kvcore_cuda_tests}${BEFORE:+, and the tool of $BEFORE}"
      # shellcheck disable=SC2086  # the targets are separate words
      build_this_tree ${BUILD_TARGETS:-kvcore_cli kvcore_cuda_tests} || { log "build failed"; exit 1; }
      [ -n "$old" ] && { wait "$old" || { log "build of $BEFORE failed"; tail -20 "/tmp/build-$BEFORE.log"; }; }
      log "built" ;;
    wgmma)
      fits 60 "wgmma tests" || continue
      log "wgmma prefill tests"
      (cd build && timeout 120 ctest -L gpu -R Wgmma -j 4 --output-on-failure --timeout 40) > "$OUT/wgmma-tests.log" 2>&1 ||
        log "wgmma tests rc $?"
      grep -E "tests passed|\(Failed\)|\(Timeout\)" "$OUT/wgmma-tests.log" | tail -20 ;;
    prefill)
      fits 120 "prefill" || continue
      OLD_TREES=${BEFORE:-} APPEND=1 FI_WARM_PID=$fi_warm PROFILE=${PROFILE:-} timeout $(( $(left) - 10 )) bash bench/gpu/prefill.sh
      # kvcore's prefill rows beside FlashInfer's with ratios (bench/summarize.py reads a job folder).
      mkdir -p "$OUT/prefill-job" && cp "$OUT/prefill.jsonl" "$OUT/prefill-job/bench.jsonl" 2>/dev/null &&
        cp "$OUT/baselines.jsonl" "$OUT/prefill-job/" 2>/dev/null
      python3 bench/summarize.py "$OUT/prefill-job" > "$OUT/prefill-summary.md" 2>&1 && rm -rf "$OUT/prefill-job"
      head -40 "$OUT/prefill-summary.md" ;;
    dsv4)
      fits 100 "dsv4 tests and bench" || continue
      log "DeepSeek-V4 CUDA tests"
      dsv4_tested=1
      (cd build && timeout 90 ctest -L gpu -R Dsv4 -j 4 --output-on-failure --timeout 60) > "$OUT/dsv4-tests.log" 2>&1 ||
        log "dsv4 tests rc $?"
      grep -E "tests passed|\(Failed\)|\(Timeout\)" "$OUT/dsv4-tests.log" | tail -10
      log "dsv4 bench"
      limit=$(left); [ "$limit" -le 200 ] || limit=200
      timeout "$limit" ./build/kvcore bench dsv4 --device cuda --case decode43 cache step \
        --json "$OUT/bench-$COMMIT.jsonl" > "$OUT/bench.log" 2>&1 || log "dsv4 bench rc $?"
      grep -E "step|top-k|scores" "$OUT/bench.log" | head -40 ;;
    tests)
      fits 90 "CUDA tests" || continue
      log "CUDA tests (not wgmma, two-GPU, NCCL)"
      skip='Wgmma|gpu2|Nccl'
      [ -n "$dsv4_tested" ] && skip+='|Dsv4'
      (cd build && timeout $(( $(left) - 60 )) ctest -L gpu -E "$skip" -j "${CTEST_J:-4}" --output-on-failure --timeout 120) \
        > "$OUT/tests.log" 2>&1 || log "tests rc $?"
      grep -E "tests passed|\(Failed\)|\(Timeout\)|\*\*\*" "$OUT/tests.log" | head -20 ;;
    hf)
      fits 60 "HF baseline" || continue
      log "HF baseline, contexts 8192 65536"
      KVCORE_GIT_COMMIT="$COMMIT" timeout $(( $(left) - 5 )) python3 bench/dsv4_hf_baseline.py --device cuda --reps 5 \
        --contexts 8192 65536 --json "$OUT/dsv4-hf.jsonl" > "$OUT/dsv4-hf.log" 2>&1 || log "HF baseline rc $?"
      tail -8 "$OUT/dsv4-hf.log" ;;
    *) log "unknown step $step" ;;
  esac
done
if [ -n "$fi_warm" ] && kill -0 "$fi_warm" 2>/dev/null && ! wants prefill; then
  log "waiting for FlashInfer's warm-up (its JIT cache is for a later call)"
  timeout "$(left)" tail --pid="$fi_warm" -f /dev/null
fi
log "round3 done: ${steps[*]}"
