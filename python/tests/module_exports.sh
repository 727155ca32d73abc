#!/usr/bin/env bash
# kvcore._ext must export PyInit__ext and nothing else. Anything more (a statically linked
# libstdc++, kvcore's or nanobind's own symbols) can be interposed by another copy loaded in the
# same Python process, which mixes two versions of the code at run time.
# usage: module_exports.sh _ext.so
set -euo pipefail
mod=$1
nm=${NM:-nm}
syms=$("$nm" -D --defined-only "$mod" | awk 'NF==3 {sub(/@.*/, "", $3); print $3}')
grep -qx PyInit__ext <<<"$syms" || { echo "module_exports.sh: PyInit__ext is not exported by $mod"; exit 1; }
extra=$(grep -v -x -E 'PyInit__ext|_init|_fini|_edata|_end|__bss_start' <<<"$syms" || true)
if [ -n "$extra" ]; then
  echo "module_exports.sh: $mod exports $(grep -c . <<<"$extra") symbols beyond PyInit__ext, e.g.:"
  c++filt <<<"$extra" | head -10
  exit 1
fi
echo "module_exports.sh: only PyInit__ext exported"
