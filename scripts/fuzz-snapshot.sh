#!/usr/bin/env bash
# Fuzz the snapshot loader with libFuzzer (clang, ASan + UBSan).
#   bash scripts/fuzz-snapshot.sh [SECONDS] [extra libFuzzer flags...]     (default 600 s)
# Builds build-fuzz/ (the library with -fsanitize=fuzzer-no-link,address,undefined and checksums
# accepted whatever they say, so mutations reach the structure checks), then runs the target on a
# scratch copy of fuzz/corpus/snapshot. Crashes land in build-fuzz/artifacts/. New inputs stay in
# build-fuzz/corpus: copy small interesting ones into fuzz/corpus/snapshot by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-600}
shift || true
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
need=()
for p in clang libclang-rt-14-dev; do have_pkg "$p" || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
bash scripts/deps.sh
# HWY_COMPILE_ONLY_EMU128: the CPU kernels in portable C++ lanes only; Debian 12's clang 14 crashes in its x86
# backend on Highway's SSE/AVX targets under these sanitizers, and the loader under test uses no SIMD kernel.
FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -DKVCORE_FUZZ_ACCEPT_ANY_CHECKSUM -DHWY_COMPILE_ONLY_EMU128=1"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVCORE_CUDA=OFF -DKVCORE_BUILD_TESTS=OFF \
  -DKVCORE_BUILD_CLI=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_FLAGS="$FLAGS" \
  ${KVCORE_CMAKE_ARGS:-}
cmake --build build-fuzz --target kvcore
clang++ -std=c++20 -O1 -g $FLAGS -DKVCORE_LIBFUZZER -fsanitize=fuzzer -Iinclude fuzz/snapshot_fuzz.cpp \
  build-fuzz/libkvcore.a -lhwy -fopenmp -o build-fuzz/snapshot_fuzz
mkdir -p build-fuzz/corpus build-fuzz/artifacts
cp -n fuzz/corpus/snapshot/* build-fuzz/corpus/ 2>/dev/null || true
OMP_NUM_THREADS=1 ./build-fuzz/snapshot_fuzz build-fuzz/corpus -max_total_time="$SECS" -max_len=16384 -rss_limit_mb=2048 \
  -artifact_prefix=build-fuzz/artifacts/ -print_final_stats=1 "$@"
