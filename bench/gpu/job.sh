# The start that GPU job scripts share (sourced, not run): strict pipes, the repository root as
# the working directory, $OUT (default out/) created, CUDA's tools on PATH, unbuffered Python, the
# Debian packages staged by bench/gpu/stage.sh (.gpu/deps) found by CMake and the loader, and
# log(), which stamps a line with the clock and the seconds since the job began.
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
