# The start that GPU job scripts share (sourced, not run): strict pipes, the repository root as
# the working directory, $OUT (default out/) created, CUDA's tools on PATH, unbuffered Python, the
# Debian packages staged by bench/gpu/stage.sh (.gpu/deps) found by CMake and the loader,
# log(), which stamps a line with the clock and the seconds since the job began,
# flashinfer_env(), which readies FlashInfer for the baseline scripts, start_flashinfer_warm(),
# configure_release(), build_this_tree() and build_old_tool(), which builds the tool of an older
# commit staged as a source tarball.
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
# start_flashinfer_warm: FlashInfer's prefill modules JIT-compiled in the background (log in
# $OUT/fi-warm.log); fi_warm is set to its pid.
# shellcheck disable=SC2034  # fi_warm is read by the sourcing script
start_flashinfer_warm() {
  flashinfer_env
  nice python3 bench/attention_flashinfer_baseline.py --warm-only --cases prefill > "$OUT/fi-warm.log" 2>&1 &
  fi_warm=$!
}
# configure_release <source dir> <build dir> <commit>: the Release CUDA build for sm_90 the jobs
# measure, with the commit baked into its results (run again on a warm machine: a new commit).
configure_release() {
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DKVCORE_WERROR=OFF -DKVCORE_GIT_COMMIT="$3"
}
# build_this_tree <target> ...: this tree configured into build/ for commit $COMMIT and the targets
# built with BUILD_J jobs (default 16); the log in $OUT/build.log, its errors printed on failure.
build_this_tree() {
  (configure_release . build "${COMMIT:-unknown}" && cmake --build build -j "${BUILD_J:-16}" --target "$@") \
    > "$OUT/build.log" 2>&1 || { grep -E 'error' -A3 "$OUT/build.log" | head -40; return 1; }
}
# build_old_tool <commit>: the kvcore tool of an older commit (.gpu/tree-<commit>.tar.gz, staged by
# bench/gpu/stage.sh) in /tmp/build-<commit>, at low priority with 4 jobs beside this tree's build;
# its log in /tmp/build-<commit>.log.
build_old_tool() {
  rm -rf "/tmp/$1" && tar -C /tmp -xzf ".gpu/tree-$1.tar.gz" &&
    (configure_release "/tmp/$1" "/tmp/build-$1" "$1" && nice cmake --build "/tmp/build-$1" -j 4 --target kvcore_cli) \
      > "/tmp/build-$1.log" 2>&1
}
