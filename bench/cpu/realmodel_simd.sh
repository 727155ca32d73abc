#!/usr/bin/env bash
# Issue #23 item 5: the real-model demo (python -m kvcore.hf.demo, SmolLM2-135M on the CPU) with kvcore's
# CPU kernels scalar (KVCORE_CPU_SIMD=off) and SIMD (the default dispatch), interleaved in rounds, 1 thread,
# every run under $PRIO (e.g. "chrt -f 10"). Prints the demo's tokens/s line per run and the load.
#   PY=build/pyenv/bin/python BUILD=build ROUNDS=2 PRIO="chrt -f 10" bash bench/cpu/realmodel_simd.sh
# env CASES: "format:window:new_tokens ..." (default "f16:128:256 fp8:128:256 f16:1024:1280 fp8:1024:1280").
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
BUILD=${BUILD:-build}
export PYTHONPATH="$BUILD/python" OMP_NUM_THREADS=${THREADS:-1} PYTHONUNBUFFERED=1
for round in $(seq 1 "${ROUNDS:-2}"); do
  for c in ${CASES:-f16:128:256 fp8:128:256 f16:1024:1280 fp8:1024:1280}; do
    IFS=: read -r fmt window n <<<"$c"
    for simd in off on; do
      echo "round $round $fmt window $window simd $simd load $(cut -d' ' -f1-3 /proc/loadavg)"
      if [ "$simd" = off ]; then export KVCORE_CPU_SIMD=off; else unset KVCORE_CPU_SIMD; fi
      ${PRIO:-} "$PY" -m kvcore.hf.demo --k-format "$fmt" --v-format "$fmt" --window "$window" \
        --max-new-tokens "$n" 2>&1 | grep '^kvcore:'
    done
  done
done
