# The start that GPU job scripts share (sourced, not run): strict pipes, the repository root as
# the working directory, $OUT (default out/) created, CUDA's tools on PATH, unbuffered Python, and
# log(), which stamps a line with the clock and the seconds since the job began.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
START=$(date +%s)
log() { echo "== $(date +%T) (+$(( $(date +%s) - START )) s) $*"; }
