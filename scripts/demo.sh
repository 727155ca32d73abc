#!/usr/bin/env bash
# Set up, build and run the main job: `kvcore demo` (CPU by default, CUDA when a GPU is present).
#   bash scripts/demo.sh [demo options, e.g. --device cpu --quick]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD=${KVCORE_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_BUILD_TESTS=OFF ${KVCORE_CMAKE_ARGS:-}
cmake --build "$BUILD" --target kvcore_cli
"$BUILD/kvcore" demo "$@"
