#!/usr/bin/env bash
# Install kvcore (CPU build) into a temporary prefix and build + run a consumer project against it.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake -S "$root" -B "$tmp/build" -G Ninja -DKVCORE_CUDA=OFF -DKVCORE_BUILD_TESTS=OFF -DKVCORE_BUILD_CLI=OFF -DCMAKE_INSTALL_PREFIX="$tmp/prefix" >/dev/null
cmake --build "$tmp/build" >/dev/null
cmake --install "$tmp/build" >/dev/null
cmake -S "$root/tests/package" -B "$tmp/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
"$tmp/consumer/consumer"
