#!/usr/bin/env bash
# CPU before/after comparison with baselines, in rounds so that the host's drifting load
# hits every variant alike: each round runs, per thread count, the kvcore benches of the
# build under test, of an older build (optional) and the ggml / NumPy baselines.
# Usage: bench/cpu/compare.sh OUT_DIR AFTER_KVCORE [BEFORE_KVCORE]
#   env ROUNDS (default 3), THREADS (default "1 2"), BENCHES (default "attention attention_prefill rope shift fp8"),
#   PAGED_ARGS (default "--quick": the paged bench's small CPU sizes),
#   PRIO (default empty): a command prefix for every timed command, e.g. "chrt -f 10": on a host
#   shared with busy processes, calls longer than a scheduler slice are otherwise preempted
#   mid-call and time the other processes too (SCHED_FIFO leaves them 5% of each core).
# Writes OUT_DIR/{after,before}-t{N}.jsonl, baselines-t{N}.jsonl, log.txt (lscpu, uptime per step).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: compare.sh OUT_DIR AFTER_KVCORE [BEFORE_KVCORE]}
after=${2:?after binary}
before=${3:-}
mkdir -p "$out"
log="$out/log.txt"
{ lscpu | head -20; echo; } >>"$log"
for round in $(seq 1 "${ROUNDS:-3}"); do
  for t in ${THREADS:-1 2}; do
    for side in after before; do
      bin=$after
      [ "$side" = before ] && bin=$before
      [ -n "$bin" ] || continue
      echo "round $round threads $t $side: $(uptime)" >>"$log"
      OMP_NUM_THREADS=$t ${PRIO:-} "$bin" bench ${BENCHES:-attention attention_prefill rope shift fp8} --device cpu --json "$out/$side-t$t.jsonl" >>"$log" 2>&1
      OMP_NUM_THREADS=$t ${PRIO:-} "$bin" bench paged --device cpu ${PAGED_ARGS:---quick} --json "$out/$side-t$t.jsonl" >>"$log" 2>&1
    done
    echo "round $round threads $t baselines: $(uptime)" >>"$log"
    ${PRIO:-} "$root/bench/cpu/baselines.sh" "$out/baselines-t$t.jsonl" "$t" >>"$log" 2>&1
  done
done
echo "done: $(uptime)" >>"$log"
