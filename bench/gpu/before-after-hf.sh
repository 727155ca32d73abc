#!/usr/bin/env bash
# A second GPU job of a session, meant to follow bench/gpu-all.sh on the same (still warm) machine:
# builds an older tree (kvcore_cli only) from a source tarball while HF transformers' decode
# throughput runs (bench/gpu/hf.sh throughput: kvcore's cache against DynamicCache + sdpa and HF's
# paged continuous batching), then the named benches on both builds, interleaved (after, before,
# after, before) so that drift hits both alike. A cold machine builds this tree first.
#   KVCORE_GIT_COMMIT=<hash> BEFORE_TGZ=<tar.gz whose top folder is before/> BEFORE_COMMIT=<hash> OUT=<dir> \
#     bash bench/gpu/before-after-hf.sh [bench[:case,case...] ...]
# Env: JOB_BUDGET_S (default 560), SKIP_HF=1 (no throughput stage).
source "$(dirname "$0")/job.sh"
BUDGET=${JOB_BUDGET_S:-560}
COMMIT=${KVCORE_GIT_COMMIT:-unknown}
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
PY=$(command -v python3)

if [ -n "${BEFORE_TGZ:-}" ]; then
  rm -rf /tmp/before && tar -C /tmp -xzf "$BEFORE_TGZ" &&
  (cmake -S /tmp/before -B /tmp/build-before -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON \
         -DCMAKE_CUDA_ARCHITECTURES=90 -DKVCORE_WERROR=OFF -DKVCORE_GIT_COMMIT="${BEFORE_COMMIT:-before}" > /tmp/bb.log 2>&1 &&
   nice cmake --build /tmp/build-before -j 12 --target kvcore_cli >> /tmp/bb.log 2>&1; echo "older build rc $?" >> /tmp/bb.log) &
  BEFORE_PID=$!
fi
log "this tree ($COMMIT): kvcore_cli and the Python module (a no-op on a warm machine)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DKVCORE_WERROR=OFF \
      -DKVCORE_PYTHON=ON -DPython_EXECUTABLE="$PY" -DKVCORE_GIT_COMMIT="$COMMIT" > "$OUT/build2.log" 2>&1 &&
  cmake --build build -j 6 --target kvcore_cli kvcore_python kvcore_python_files >> "$OUT/build2.log" 2>&1 ||
  { grep -E 'error' -A3 "$OUT/build2.log" | head -40; exit 1; }
log "built"
if [ -z "${SKIP_HF:-}" ]; then
  log "HF decode throughput (while the older tree builds)"
  HF_STAGES="throughput" BUILD=build OUT="$OUT" KVCORE_GIT_COMMIT="$COMMIT" timeout $(( $(left) / 2 )) bash bench/gpu/hf.sh
  log "HF throughput rc $?"
fi
if [ -n "${BEFORE_PID:-}" ]; then wait "$BEFORE_PID"; log "$(tail -1 /tmp/bb.log)"; tail -1 /tmp/bb.log | grep -q "rc 0" || tail -20 /tmp/bb.log; fi
for round in 1 2; do
  for spec in "$@"; do
    n=${spec%%:*}; cases=(); [ "$spec" != "$n" ] && IFS=, read -r -a cases <<< "${spec#*:}"
    args=(); [ ${#cases[@]} -gt 0 ] && args=(--case "${cases[@]}")
    for side in after before; do
      bin=./build/kvcore; [ $side = before ] && bin=/tmp/build-before/kvcore
      [ -x "$bin" ] || continue
      [ "$(left)" -gt 40 ] || { log "skip $n $side round $round (budget)"; continue; }
      log "bench $n $side round $round"
      timeout $(( $(left) - 20 )) "$bin" bench "$n" --device cuda "${args[@]}" --json "$OUT/bench-$side.jsonl" >> "$OUT/bench2.log" 2>&1 ||
        log "bench $n $side rc $?"
    done
  done
done
log "done"
