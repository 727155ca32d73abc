#!/usr/bin/env bash
# Several states of the code in one GPU job, for a change made of steps: builds the kvcore tool of
# each older commit from its source tarball (.gpu/tree-<commit>.tar.gz: bash bench/gpu/stage.sh
# <commit> ..., carried to the device) in parallel with this tree's tool and CUDA tests, runs
# this tree's CUDA tests that match TESTS (a ctest regex), then one bench, interleaved over the
# builds (oldest first, ROUNDS times) so that drift hits every state alike. Each state's
# rows go to $OUT/bench-<commit>.jsonl (this tree's: bench-$KVCORE_GIT_COMMIT.jsonl).
# With HF_CONTEXTS (e.g. "8192 65536"), HF's DeepSeek-V4 baseline (bench/dsv4_hf_baseline.py) runs
# last, in the same job, into $OUT/dsv4-hf.jsonl.
# CTEST_EXCLUDE (a regex) leaves tests out of those that TESTS matches; CTEST_J runs that many at once;
# BUILD_J: parallel jobs of this tree's build (default 8, beside the older trees' 4 each).
#   KVCORE_GIT_COMMIT=<hash> TREES="<c1> <c2>" OUT=<dir> [TESTS=Dsv4] [CTEST_EXCLUDE=Wgmma] [ROUNDS=2] [HF_CONTEXTS=...] \
#     bash bench/gpu/builds.sh <bench> [case ...]
source "$(dirname "$0")/job.sh"
COMMIT=${KVCORE_GIT_COMMIT:-unknown}
bench=$1
shift
cases=("$@")

pids=()
for c in ${TREES:-}; do
  build_old_tool "$c" &
  pids+=($!)
done
log "this tree ($COMMIT): kvcore_cli and the CUDA tests; older trees: ${TREES:-none}"
BUILD_J=${BUILD_J:-8} build_this_tree kvcore_cli kvcore_cuda_tests || exit 1
if [ -n "${TESTS:-}" ]; then
  log "CUDA tests matching $TESTS"
  (cd build && ctest -L gpu -R "$TESTS" ${CTEST_EXCLUDE:+-E "$CTEST_EXCLUDE"} -j "${CTEST_J:-1}" --output-on-failure --timeout 120) > "$OUT/tests.log" 2>&1
  tail -3 "$OUT/tests.log"
fi
for p in "${pids[@]}"; do wait "$p"; done
bins=()
for c in ${TREES:-}; do
  if [ -x "/tmp/build-$c/kvcore" ]; then bins+=("$c"); else log "build of $c failed"; tail -20 "/tmp/build-$c.log"; fi
done
bins+=("$COMMIT")
args=()
[ ${#cases[@]} -gt 0 ] && args=(--case "${cases[@]}")
for round in $(seq "${ROUNDS:-2}"); do
  for c in "${bins[@]}"; do
    bin=/tmp/build-$c/kvcore
    [ "$c" = "$COMMIT" ] && bin=./build/kvcore
    log "bench $bench $c round $round"
    timeout 200 "$bin" bench "$bench" --device cuda "${args[@]}" --json "$OUT/bench-$c.jsonl" >> "$OUT/bench.log" 2>&1 ||
      log "bench rc $?"
  done
done
if [ -n "${HF_CONTEXTS:-}" ]; then
  log "HF baseline, contexts $HF_CONTEXTS"
  # shellcheck disable=SC2086  # the contexts are separate arguments
  KVCORE_GIT_COMMIT="$COMMIT" timeout 150 python3 bench/dsv4_hf_baseline.py --device cuda --reps 5 --contexts $HF_CONTEXTS \
    --json "$OUT/dsv4-hf.jsonl" > "$OUT/dsv4-hf.log" 2>&1 || log "HF baseline rc $?"
  tail -8 "$OUT/dsv4-hf.log"
fi
log done
