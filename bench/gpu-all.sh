#!/usr/bin/env bash
# Everything one GPU session needs in one call (device machine): build every target with the
# Python module, the CUDA tests (CUDA against the CPU), the 2-GPU tests (they skip on one GPU),
# the pytest suite on CUDA (one process per file, so a crash names its file and the rest still run;
# PYTEST_FIRST, default test_cuda.py, right after the CUDA tests),
# the demo, the benches, Python's per-call overhead beside FlashInfer's run(), and the FlashInfer
# and SDPA baselines. FlashInfer JIT-compiles while kvcore builds. Stages are ordered by what a
# missing result costs most and skipped, never cut, once the job's budget runs short.
#   KVCORE_GIT_COMMIT=<hash> OUT=<dir> [WHEELS=<dir>] bash bench/gpu-all.sh [bench names...]
# Env: JOB_BUDGET_S (default 570), FI_CACHE (see below), CTEST_EXCLUDE (a ctest -E regex: those tests run after
# the rest, one at a time under APART_TIMEOUT s each, default 45: new kernels whose fault could hang),
# FI_CASES / SDPA_CASES (case substrings of the baselines; default every FlashInfer case, SDPA llama8b),
# BUILD_TARGETS (default every target), PYTEST_MIN_LEFT / BENCH_MIN_LEFT (s of budget a stage needs, default 200),
# SKIP_TESTS=1 (no CUDA tests, pytest or demo: a second call on a warm machine), SKIP_BASELINES=1 (no FlashInfer/SDPA). Files in $OUT (the device returns at most 8): build.log
# tests.log bench.log bench.jsonl baselines.log baselines.jsonl summary.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
if [ -d .gpu/deps/usr ]; then  # the Debian packages bench/gpu/stage.sh unpacked
  export CMAKE_PREFIX_PATH="$PWD/.gpu/deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$PWD/.gpu/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
START=$(date +%s)
BUDGET=${JOB_BUDGET_S:-570}
COMMIT=${KVCORE_GIT_COMMIT:-unknown}
log() { echo "== $(date +%T) (+$(( $(date +%s) - START )) s) $*"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
PY=$(command -v python3)

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee "$OUT/build.log"
if [ -n "${WHEELS:-}" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl &&
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export FLASHINFER_CUDA_ARCH_LIST=9.0 FLASHINFER_WORKSPACE_BASE=/tmp/fiws
mkdir -p /tmp/fiws
# FI_CACHE: the parts (<prefix>.00, .01, ...) of a gzipped tar of an earlier job's /tmp/fiws, carried
# in: FlashInfer then loads its compiled modules instead of JIT-compiling them for minutes.
if [ -n "${FI_CACHE:-}" ] && ls "$FI_CACHE".* >/dev/null 2>&1; then
  cat "$FI_CACHE".* | gzip -dc | tar xf - -C /tmp && echo "FlashInfer cache from $FI_CACHE: $(find /tmp/fiws -name '*.so' | wc -l) modules"
fi
if [ -z "${SKIP_BASELINES:-}" ] && "$PY" -c "import flashinfer" 2>/dev/null; then
  (nice "$PY" bench/attention_flashinfer_baseline.py --warm-only > /tmp/fi-warm.log 2>&1) &
  FI_PID=$!
fi

# NCCL: beside CUDA where the toolkit has it, else PyTorch's wheel of it (nvidia-nccl-*).
NCCL_ARGS=()
nccl_dir=$("$PY" -c "import importlib.util as u; s = u.find_spec('nvidia.nccl'); print(s.submodule_search_locations[0])" 2>/dev/null)
if [ -n "$nccl_dir" ] && [ -f "$nccl_dir/include/nccl.h" ] && ls "$nccl_dir"/lib/libnccl.so* >/dev/null 2>&1; then
  NCCL_ARGS=(-DKVCORE_NCCL_INCLUDE="$nccl_dir/include" -DKVCORE_NCCL_LIBRARY="$(ls "$nccl_dir"/lib/libnccl.so* | head -1)")
fi
log "build $COMMIT (every target, Python module)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DKVCORE_WERROR=OFF \
      -DKVCORE_PYTHON=ON -DPython_EXECUTABLE="$PY" -DKVCORE_GIT_COMMIT="$COMMIT" "${NCCL_ARGS[@]}" >> "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
grep -E "kvcore: " "$OUT/build.log" | head
cmake --build build -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} >> "$OUT/build.log" 2>&1 || { grep -E 'error' -A3 "$OUT/build.log" | head -60; exit 1; }
log "built"

# pytest files on CUDA, one process per file (a crash names its file and the rest still run).
run_pytest() {
  for f in "$@"; do
    [ "$(left)" -gt "${PYTEST_MIN_LEFT:-200}" ] || { log "skip $f (budget)"; continue; }
    PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}" timeout 150 "$PY" -X faulthandler -m pytest -q -rs -p no:cacheprovider "$f" \
      > /tmp/pytest.log 2>&1
    rc=$?
    echo "---- $f rc $rc" >> "$OUT/tests.log"
    cat /tmp/pytest.log >> "$OUT/tests.log"
    echo "$f rc $rc: $(tail -1 /tmp/pytest.log)"
    if [ $rc -ge 128 ] || grep -q "Fatal Python error" /tmp/pytest.log; then
      if command -v gdb >/dev/null; then
        PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}" timeout 60 gdb -batch -ex run -ex bt \
          --args "$PY" -m pytest -q -x -p no:cacheprovider "$f" 2>&1 | grep -E "^#|signal" | head -30 | tee -a "$OUT/tests.log"
      fi
    fi
  done
}

if [ -z "${SKIP_TESTS:-}" ]; then
log "CUDA tests"
(cd build && ctest -L gpu ${CTEST_EXCLUDE:+-E "$CTEST_EXCLUDE"} --output-on-failure --timeout 300 -j 4) > "$OUT/tests.log" 2>&1
grep -E "tests passed|Failed|\*\*\*|Exception" "$OUT/tests.log" | head -30
PY_INFO=$("$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tail -1)
first=(${PYTEST_FIRST:-python/tests/test_cuda.py})
log "pytest on CUDA, first: ${first[*]} ($PY_INFO)"
run_pytest "${first[@]}"
if [ -n "${CTEST_EXCLUDE:-}" ]; then
  log "CUDA tests run apart: $CTEST_EXCLUDE"
  (cd build && ctest -L gpu -R "$CTEST_EXCLUDE" --output-on-failure --timeout "${APART_TIMEOUT:-45}" -j 1) >> "$OUT/tests.log" 2>&1
  grep -E "Test +#.*($CTEST_EXCLUDE)|tests passed" "$OUT/tests.log" | tail -14
fi
if [ -x build/tests/kvcore_gpu2_tests ]; then
  timeout 120 ./build/tests/kvcore_gpu2_tests >> "$OUT/tests.log" 2>&1
  log "2-GPU tests rc $? ($(nvidia-smi -L | wc -l) GPU here)"
fi
rest=()
for f in python/tests/test_*.py; do [[ " ${first[*]} " == *" $f "* ]] || rest+=("$f"); done
log "pytest on CUDA, the other files"
run_pytest "${rest[@]}"


log "demo"
timeout 60 ./build/kvcore demo --device cuda --quick >> "$OUT/tests.log" 2>&1 && echo "demo ok" || echo "demo FAILED"
fi

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(ceilings attention attention_overhead dsv4 dsv4_shift transfer paged)
for n in "${names[@]}"; do
  [ "$(left)" -gt "${BENCH_MIN_LEFT:-200}" ] || { log "skip bench $n (budget)"; continue; }
  log "bench $n"
  timeout 90 ./build/kvcore bench "$n" --device cuda --json "$OUT/bench.jsonl" >> "$OUT/bench.log" 2>&1 || log "bench $n rc $?"
done

if [ -n "${FI_PID:-}" ]; then
  wait "$FI_PID"; tail -6 /tmp/fi-warm.log; cat /tmp/fi-warm.log >> "$OUT/baselines.log"
  if [ "$(left)" -gt 60 ]; then
    log "Python per-call overhead with FlashInfer's run()"
    OMP_NUM_THREADS=1 PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}" timeout 60 "$PY" python/bench/overhead.py \
      build/python/kvcore_overhead_cpp --device cuda >> "$OUT/baselines.log" 2>&1
    log "FlashInfer baseline"
    timeout $(( $(left) - 35 )) "$PY" bench/attention_flashinfer_baseline.py --json "$OUT/baselines.jsonl" ${FI_CASES:+--cases $FI_CASES} >> "$OUT/baselines.log" 2>&1
    tail -3 "$OUT/baselines.log"
  fi
fi
if [ -z "${SKIP_BASELINES:-}" ] && [ "$(left)" -gt 30 ]; then
  log "SDPA baseline (Llama cases)"
  timeout $(( $(left) - 8 )) "$PY" bench/attention_sdpa_baseline.py --json "$OUT/baselines.jsonl" --cases ${SDPA_CASES:-llama8b} >> "$OUT/baselines.log" 2>&1
fi
"$PY" bench/summarize.py "$OUT" > "$OUT/summary.md" 2>&1
log "done"
