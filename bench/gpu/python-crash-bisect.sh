#!/usr/bin/env bash
# Device job that found why the Python module crashed on the H200 image (bench/results/
# 2026-12-05-runC-python-crash-bisect.md): builds the module four ways (CPU abi3, CPU version-
# specific, CPU abi3 with PyPI's nanobind, CUDA version-specific), runs four crashing calls
# (bench/gpu/python_crash_repro.py) and three pytest files on each, takes a cuda-gdb backtrace of
# the first crash, and JIT-warms FlashInfer meanwhile (its cache comes back as $OUT/fiws.tar.zst.NN).
#   OUT=<dir> [NB_WHEELS=<folder with a nanobind wheel>] bash bench/gpu/python-crash-bisect.sh
set -uo pipefail
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"; L=$OUT/debug.log
START=$(date +%s)
log() { echo "== +$(( $(date +%s) - START ))s $*" | tee -a $L; }
PY=$(command -v python3)
{ $PY -c "import sys, nanobind; print(sys.version); print('nanobind', nanobind.__version__, nanobind.__file__)"
  cmake --version | head -1; command -v c++ g++ gcc cc; c++ --version | head -1; ls -d /opt/gcc* 2>/dev/null
  echo "CC=${CC:-} CXX=${CXX:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"; ldconfig -p | grep libstdc++; 
  $PY -c "import numpy; print('numpy', numpy.__version__)"; command -v cuda-gdb gdb; } >> $L 2>&1
cat $L
# FlashInfer JIT warm-up in the background; its cache comes back as a tarball for the next job.
mkdir -p /tmp/site && $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export FLASHINFER_CUDA_ARCH_LIST=9.0 FLASHINFER_WORKSPACE_BASE=/tmp/fiws
mkdir -p /tmp/fiws
(PYTHONPATH=/tmp/site nice $PY bench/attention_flashinfer_baseline.py --warm-only > $OUT/fi-warm.log 2>&1; echo "fi rc $?" >> $OUT/fi-warm.log) &
FI=$!
$PY -m pip install -q --no-index --no-deps --target /tmp/nbpypi ${NB_WHEELS:-.gpu/nb}/*.whl
NB_PYPI=$(PYTHONPATH=/tmp/nbpypi $PY -m nanobind --cmake_dir)
echo "pypi nanobind: $NB_PYPI" >> $L
variant() { # name jobs cmake-args...
  local n=$1 j=$2; shift 2
  cmake -S . -B /tmp/b-$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_WERROR=OFF -DKVCORE_PYTHON=ON \
    -DPython_EXECUTABLE=$PY "$@" > /tmp/b-$n.log 2>&1 && cmake --build /tmp/b-$n -j $j --target kvcore_python kvcore_python_files >> /tmp/b-$n.log 2>&1
  echo "build $n rc $?" >> $L
}
variant cuda_noabi3 8 -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DKVCORE_PYTHON_STABLE_ABI=OFF &
V1=$!
variant cpu_abi3 3 -DKVCORE_CUDA=OFF &
P2=$!
variant cpu_noabi3 3 -DKVCORE_CUDA=OFF -DKVCORE_PYTHON_STABLE_ABI=OFF &
P3=$!
variant cpu_abi3_pypinb 2 -DKVCORE_CUDA=OFF -Dnanobind_DIR=$NB_PYPI &
P4=$!
wait $P2 $P3 $P4
log "cpu variants built"
probe() { # variant
  local n=$1
  [ -d /tmp/b-$n/python/kvcore ] || { echo "$n: no module" >> $L; tail -20 /tmp/b-$n.log >> $L; return; }
  ls /tmp/b-$n/python/kvcore/*.so >> $L
  for w in raise raise_std newarray repr; do
    PYTHONPATH=/tmp/b-$n/python timeout 60 $PY bench/gpu/python_crash_repro.py $w > /tmp/r.log 2>&1; rc=$?
    echo "[$n $w] rc $rc: $(tr '\n' '|' < /tmp/r.log | cut -c1-600)" >> $L
    if [ $rc -ge 128 ] && command -v cuda-gdb > /dev/null && [ ! -f /tmp/bt-$n ]; then
      touch /tmp/bt-$n
      PYTHONPATH=/tmp/b-$n/python timeout 120 cuda-gdb -batch -ex run -ex bt -ex "info sharedlibrary" --args $PY bench/gpu/python_crash_repro.py $w 2>&1 | grep -vE "^\[New Thread|^\[Thread" | head -120 >> $OUT/bt-$n.log
    fi
  done
  (cd python/tests && PYTHONPATH=/tmp/b-$n/python timeout 120 $PY -X faulthandler -m pytest -q -x -p no:cacheprovider test_errors.py test_ops.py test_paged_cache.py 2>&1 | tail -5 | sed "s/^/[$n pytest] /") >> $L
}
for n in cpu_abi3 cpu_noabi3 cpu_abi3_pypinb; do probe $n; done
log "cpu probes done"; cat $L | tail -40
for i in $(seq 1 400); do kill -0 $V1 2>/dev/null || break; [ $(( $(date +%s) - START )) -lt 450 ] || break; sleep 2; done; log "cuda build wait over"; probe cuda_noabi3
log "cuda probe done"
if [ -d /tmp/b-cuda_noabi3/python/kvcore ]; then
  for f in python/tests/test_*.py; do
    PYTHONPATH=/tmp/b-cuda_noabi3/python:/tmp/site timeout 120 $PY -X faulthandler -m pytest -q -p no:cacheprovider $f > /tmp/p.log 2>&1
    echo "[cuda_noabi3 $f] rc $?: $(tail -1 /tmp/p.log)" >> $L
    [ $(( $(date +%s) - START )) -lt 420 ] || break
  done
fi
for i in $(seq 1 400); do kill -0 $FI 2>/dev/null || break; [ $(( $(date +%s) - START )) -lt 530 ] || break; sleep 2; done; tail -5 $OUT/fi-warm.log
Z='zstd -q -T8 -10'; command -v zstd >/dev/null || Z='gzip -6'; (cd /tmp && tar cf - fiws | $Z > /tmp/fiws.tar.zst) && ls -la /tmp/fiws.tar.zst && split -b 15m -d /tmp/fiws.tar.zst $OUT/fiws.tar.zst.
log "done"; cat $L | tail -60
