# The start that GPU job scripts share (sourced, not run): strict pipes, the repository root as
# the working directory, $OUT (default out/) created, CUDA's tools on PATH, unbuffered Python, the
# Debian packages staged by bench/gpu/stage.sh (.gpu/deps) found by CMake and the loader,
# log(), which stamps a line with the clock and the seconds since the job began, and
# flashinfer_env(), which readies FlashInfer for the baseline scripts.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
if [ -d .gpu/deps/usr ]; then
  export CMAKE_PREFIX_PATH="$PWD/.gpu/deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$PWD/.gpu/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
START=$(date +%s)
log() { echo "== $(date +%T) (+$(( $(date +%s) - START )) s) $*"; }
# FlashInfer for the baseline scripts: the wheels carried in .whl installed into /tmp/site (once a
# machine), found by Python, JIT-compiled for sm_90 into build-fi/ (kept for the rest of the job).
flashinfer_env() {
  if [ -d .whl ] && [ ! -d /tmp/site/flashinfer ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} FLASHINFER_CUDA_ARCH_LIST=9.0 FLASHINFER_WORKSPACE_BASE=$PWD/build-fi
  mkdir -p build-fi
}
