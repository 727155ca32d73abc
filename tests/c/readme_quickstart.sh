#!/usr/bin/env bash
# Compile the README's C quick start as written (C99, warnings as errors) against this build's
# headers and libkvcore.so, and run it.
# usage: readme_quickstart.sh README.md INCLUDE_DIR LIB_DIR CC [EXTRA_FLAGS (the sanitizer build's)]
set -euo pipefail
readme=$1 inc=$2 libdir=$3 cc=$4 extra=${5:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$(dirname "$0")/../../python/tests/readme_blocks.py" "$readme" c > "$tmp/main.c"
"$cc" -std=c99 -Wall -Wextra -pedantic -Werror $extra "$tmp/main.c" -I"$inc" -L"$libdir" -lkvcore -Wl,-rpath,"$libdir" -o "$tmp/main"
out=$("$tmp/main")
echo "$out"
grep -q '^out\[0\] = ' <<<"$out"
