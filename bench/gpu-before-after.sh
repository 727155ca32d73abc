#!/usr/bin/env bash
# One GPU job (device machine) that measures a change against the code before it, in the same job:
# builds this tree (everything, with the Python module) and an older tree given as a source folder
# (kvcore_cli only), runs the CUDA tests, the pytest suite on CUDA and the demo, then every named
# bench on both builds, interleaved (after, before, after, ...) so that drift hits both alike, then
# FlashInfer's and SDPA's baselines. Stages past the job's budget are skipped, never half-written.
#   KVCORE_GIT_COMMIT=<hash> BEFORE_SRC=<dir> BEFORE_COMMIT=<hash> OUT=<dir> \
#     bash bench/gpu-before-after.sh [bench names...]
# Env: WHEELS (folder of wheels to install under /tmp/site: FlashInfer and its needs), FI_CACHE (a
# tar of FlashInfer's JIT cache from an earlier job, unpacked before use and written back to
# $OUT/fi-cache.tgz), BEFORE_BENCHES (bench names the older build runs; default: the same names),
# JOB_BUDGET_S (default 560), PYTEST_ARGS (extra pytest args), EXTRA_GPU_CMDS (a command line run after the pytest suite).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
START=$(date +%s)
BUDGET=${JOB_BUDGET_S:-560}
COMMIT=${KVCORE_GIT_COMMIT:-unknown}
log() { echo "== $(date +%T) (+$(( $(date +%s) - START )) s) $*"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee "$OUT/build.log"
if [ -n "${WHEELS:-}" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export FLASHINFER_CUDA_ARCH_LIST=9.0 FLASHINFER_WORKSPACE_BASE=/tmp/fiws
mkdir -p /tmp/fiws
[ -n "${FI_CACHE:-}" ] && [ -f "$FI_CACHE" ] && tar -C /tmp/fiws -xzf "$FI_CACHE"

log "build $COMMIT (all targets, Python module) and ${BEFORE_COMMIT:-no older tree}"
PY=$(command -v python3)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DKVCORE_WERROR=OFF \
      -DKVCORE_PYTHON=ON -DPython_EXECUTABLE="$PY" -DKVCORE_GIT_COMMIT="$COMMIT" >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
if [ -n "${BEFORE_SRC:-}" ]; then
  (cmake -S "$BEFORE_SRC" -B build-before -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
         -DKVCORE_WERROR=OFF -DKVCORE_GIT_COMMIT="${BEFORE_COMMIT:-before}" > /tmp/build-before.log 2>&1 &&
   nice cmake --build build-before -j 6 --target kvcore_cli >> /tmp/build-before.log 2>&1) &
  BEFORE_PID=$!
fi
cmake --build build -j "$(nproc)" >> "$OUT/build.log" 2>&1 || { grep -E 'error' -A3 "$OUT/build.log" | head -60; exit 1; }
log "built"
./build/kvcore info | head -5

# FlashInfer compiles its kernels while the tests run (CPU work; the tests are GPU work).
if python3 -c "import flashinfer" 2>/dev/null; then
  (python3 bench/attention_flashinfer_baseline.py --warm-only > /tmp/fi-warm.log 2>&1) &
  FI_PID=$!
fi

log "CUDA tests"
(cd build && ctest -L gpu --output-on-failure --timeout 300 -j 4) > "$OUT/tests.log" 2>&1
grep -E "tests passed|Failed|\*\*\*|Exception" "$OUT/tests.log" | head -30
log "pytest (CUDA build of the module, torch $(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null))"
PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}" timeout 300 python3 -m pytest -q -p no:cacheprovider python/tests ${PYTEST_ARGS:-} \
  >> "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
if [ -n "${EXTRA_GPU_CMDS:-}" ]; then
  log "extra: $EXTRA_GPU_CMDS"
  (eval "$EXTRA_GPU_CMDS") >> "$OUT/tests.log" 2>&1
  tail -5 "$OUT/tests.log"
fi
log "demo"
timeout 120 ./build/kvcore demo --device cuda --quick >> "$OUT/tests.log" 2>&1 && echo "demo ok" || echo "demo FAILED"

if [ -n "${BEFORE_PID:-}" ]; then wait "$BEFORE_PID"; log "older build: $(ls build-before/kvcore 2>/dev/null || echo MISSING)"; cat /tmp/build-before.log >> "$OUT/build.log"; fi
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(ceilings attention attention_prefill shift dsv4 attention_overhead)
read -r -a before_names <<< "${BEFORE_BENCHES:-${names[*]}}"
for n in "${names[@]}"; do
  [ "$(left)" -gt 90 ] || { log "skip bench $n (budget)"; continue; }
  log "bench $n (after)"
  timeout 150 ./build/kvcore bench "$n" --device cuda --json "$OUT/bench-after.jsonl" >> "$OUT/bench.log" 2>&1 || log "bench $n rc $?"
  if [ -x build-before/kvcore ] && [[ " ${before_names[*]} " == *" $n "* ]] && [ "$(left)" -gt 90 ]; then
    log "bench $n (before)"
    timeout 150 ./build-before/kvcore bench "$n" --device cuda --json "$OUT/bench-before.jsonl" >> "$OUT/bench.log" 2>&1 || log "bench $n before rc $?"
  fi
done
if [ -n "${FI_PID:-}" ]; then
  wait "$FI_PID"; tail -8 /tmp/fi-warm.log; cat /tmp/fi-warm.log >> "$OUT/baselines.log"
  if [ "$(left)" -gt 60 ]; then
    log "FlashInfer baseline"
    timeout $(( $(left) - 40 )) python3 bench/attention_flashinfer_baseline.py --json "$OUT/baselines.jsonl" >> "$OUT/baselines.log" 2>&1
    tail -4 "$OUT/baselines.log"
  fi
  tar -C /tmp/fiws -czf "$OUT/fi-cache.tgz" . 2>/dev/null && ls -la "$OUT/fi-cache.tgz"
fi
if [ "$(left)" -gt 70 ]; then
  log "SDPA baseline"
  timeout $(( $(left) - 15 )) python3 bench/attention_sdpa_baseline.py --json "$OUT/baselines.jsonl" >> "$OUT/baselines.log" 2>&1
fi
log "done"
