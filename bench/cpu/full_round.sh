#!/usr/bin/env bash
# Every CPU bench of issue #23 in rounds, for a quiet machine: per round bench/cpu/compare.sh (attention,
# attention_prefill, rope, shift, fp8, rope_shift_rows, paged, the ggml / NumPy baselines; the build under test and an older one), then per
# thread count the harness ceilings against plain streaming loops and
# the DeepSeek-V4 ops (compressor / indexer prefill, sparse attention, the 43-layer decode step).
#   PRIO="chrt -f 10" ROUNDS=2 bash bench/cpu/full_round.sh OUT_DIR AFTER_KVCORE [BEFORE_KVCORE]
# Then: python3 bench/cpu/summarize.py OUT_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: full_round.sh OUT_DIR AFTER_KVCORE [BEFORE_KVCORE]}
after=${2:?after binary}
before=${3:-}
mkdir -p "$out"
for round in $(seq 1 "${ROUNDS:-2}"); do
  ROUNDS=1 BENCHES="${BENCHES:-attention attention_prefill rope shift fp8 rope_shift_rows}" "$root/bench/cpu/compare.sh" "$out" "$after" $before
  for t in ${THREADS:-1 2}; do
    echo "round $round threads $t extras: $(uptime)" >>"$out/log.txt"
    OMP_NUM_THREADS=$t ${PRIO:-} "$after" bench ceilings --device cpu --json "$out/ceilings-check-t$t.jsonl" >>"$out/log.txt" 2>&1
    for side in after before; do
      bin=$after
      [ "$side" = before ] && bin=$before
      [ -n "$bin" ] || continue
      OMP_NUM_THREADS=$t ${PRIO:-} "$bin" bench dsv4 --device cpu --quick --case "prefill csa" "prefill indexer" "prefill hca" \
        --json "$out/$side-t$t.jsonl" >>"$out/log.txt" 2>&1
      OMP_NUM_THREADS=$t ${PRIO:-} "$bin" bench dsv4 --device cpu --quick --reps 3 --case "decode43 cache step" \
        --json "$out/$side-t$t.jsonl" >>"$out/log.txt" 2>&1
      [ -z "${EXTRA_BENCH:-}" ] || OMP_NUM_THREADS=$t ${PRIO:-} "$bin" bench $EXTRA_BENCH --device cpu \
        --json "$out/$side-t$t.jsonl" >>"$out/log.txt" 2>&1 || true
    done
  done
done
echo "all done: $(uptime)" >>"$out/log.txt"
