#!/usr/bin/env bash
# libkvcore.so must export the C API (kvc_*) and the public C++ API (namespace kvcore) and nothing
# else: no backend namespaces, no libstdc++ or OpenMP symbols; SONAME libkvcore.so.0.
# usage: exports.sh libkvcore.so
set -euo pipefail
lib=$1
nm=${NM:-nm}
syms=$("$nm" -D --defined-only "$lib" | awk 'NF==3 {sub(/@.*/, "", $3); print $3}')
cxx=$(grep -v '^kvc_' <<<"$syms" | grep -v '^KVCORE_0$' | c++filt)
bad=$(grep -v -E '^(kvcore::|(vtable|typeinfo|typeinfo name) for kvcore::)' <<<"$cxx" || true)
internal=$(grep -E 'kvcore::(cpu|cuda|ops|capi|checks|dsv4|dsv4_checks|detail|persist|PagedTxn|PagedMeta|AttentionPlanAccess)::|::Impl::' <<<"$cxx" || true)
for need in kvc_paged_create kvc_paged_reserve kvc_attention_run kvc_shift_dense kvc_fp8_pack_rows kvc_dsv4_create \
            kvc_last_error kvc_paged_create_with_pools kvc_snapshot_load kvc_prefix_create kvc_offloader_create \
            kvc_tiered_store_create kvc_redis_store_create kvc_redis_store_ping; do
  grep -qx "$need" <<<"$syms" || { echo "exports.sh: $need is not exported"; exit 1; }
done
grep -q '^kvcore::PagedCache::create()' <<<"$cxx" || { echo "exports.sh: the C++ API is not exported"; exit 1; }
soname=$(readelf -d "$lib" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = libkvcore.so.0 ] || { echo "exports.sh: SONAME is '$soname', not libkvcore.so.0"; exit 1; }
if [ -n "$bad$internal" ]; then
  echo "exports.sh: symbols outside the API:"
  printf '%s\n%s\n' "$bad" "$internal" | grep -v '^$' | head -20
  exit 1
fi
echo "exports.sh: $(grep -c '^kvc_' <<<"$syms") C symbols, $(grep -c . <<<"$cxx") C++ symbols, SONAME $soname"
