#!/usr/bin/env bash
# The Python package on the GPU machine (CUDA 13, cmake, ninja, python3 with torch, nanobind,
# numpy and pytest; no network): build kvcore._ext with CUDA for sm_90 into BUILD (default
# `build`, the directory bench/gpu-run.sh builds: after its build stage only the module compiles),
# probe that a kvcore error reaches Python as an exception (abi3 module; when that crashes, the
# module is rebuilt version-specific, -DKVCORE_PYTHON_STABLE_ABI=OFF, and probed again: the log
# says which), run the whole pytest suite with CUDA tensors (test_cuda.py: side streams, graph
# capture, FP8 views, engine-allocated pools; test_torch.py's cuda cases), then the per-call
# overhead bench on cuda:0 with FlashInfer's run() beside kvcore's when flashinfer is importable
# (carry its wheel). Everything goes to one file, $OUT/python.log (OUT defaults to out).
#   OUT=<dir> bash bench/gpu-python.sh [BUILD]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT=${OUT:-out}
mkdir -p "$OUT"
LOG="$OUT/python.log"
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
PY=$(command -v python3)
log() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
build() {  # $1: ON or OFF (stable ABI)
  log "configure + build kvcore_python (CUDA, sm_90, stable ABI $1) in $BUILD"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DKVCORE_PYTHON=ON -DKVCORE_PYTHON_STABLE_ABI="$1" -DPython_EXECUTABLE="$PY" >> "$LOG" 2>&1 ||
    { tail -30 "$LOG"; exit 1; }
  rm -f "$BUILD"/python/kvcore/_ext*.so
  cmake --build "$BUILD" -j "$(nproc)" --target kvcore_python kvcore_overhead_cpp >> "$LOG" 2>&1 ||
    { grep -E 'error|Error' -A3 "$LOG" | head -60; exit 1; }
  ls "$BUILD"/python/kvcore/_ext*.so | tee -a "$LOG"
}
cat > /tmp/kvcore_probe.py <<'PYEOF'
import sys
if sys.argv[1] == "torch":
    import torch  # noqa: F401
import kvcore
try:
    kvcore.PagedCache(1, 1, 64, 0, rope=kvcore.RopeSpec.plain(64, 1e4))
except ValueError as e:
    print("probe (" + sys.argv[1] + " first): kvcore error raised as", type(e).__name__)
try:
    kvcore.PagedCache("x", 1, 64, 8, rope=kvcore.RopeSpec.plain(64, 1e4))
except TypeError:
    print("probe (" + sys.argv[1] + " first): argument error raised as TypeError")
PYEOF
probe() {  # a kvcore error and a nanobind argument error, with torch imported first and without
  local ok=0
  for first in torch none; do
    PYTHONPATH="$BUILD/python" timeout 120 "$PY" -X faulthandler /tmp/kvcore_probe.py "$first" >> "$LOG" 2>&1
    local rc=$?
    log "probe with $first imported first: exit $rc"
    if [ "$rc" -ne 0 ]; then
      ok=1
      local dbg=$(command -v gdb || command -v cuda-gdb || true)  # the image has cuda-gdb, no gdb
      [ -n "$dbg" ] && PYTHONPATH="$BUILD/python" timeout 120 "$dbg" -batch -ex run -ex bt \
        --args "$PY" /tmp/kvcore_probe.py "$first" 2>&1 | grep -E "^#|signal|SIG" | head -40 | tee -a "$LOG"
    fi
  done
  return $ok
}
build ON
"$PY" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tee -a "$LOG"
if ! probe; then
  log "the abi3 module crashed raising an exception: rebuilding version-specific"
  build OFF
  probe || log "the version-specific module crashes too"
fi
log "pytest with CUDA tensors"
PYTHONPATH="$BUILD/python" timeout 600 "$PY" -X faulthandler -m pytest -q -rs -p no:cacheprovider python/tests 2>&1 |
  tee -a "$LOG" | tail -25
rc=${PIPESTATUS[0]}
log "pytest exit $rc"
log "per-call overhead on cuda:0 (FlashInfer run() beside kvcore's when importable)"
OMP_NUM_THREADS=1 PYTHONPATH="$BUILD/python" timeout 300 "$PY" python/bench/overhead.py \
  "$BUILD/python/kvcore_overhead_cpp" --device cuda 2>&1 | tee -a "$LOG"
exit "$rc"
