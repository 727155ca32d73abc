#!/usr/bin/env bash
# The prefill attention kernels beside FlashInfer in one GPU job, on a machine where
# bench/gpu/builds.sh (or any job) already built ./build/kvcore: `kvcore bench attention_prefill`
# (the automatic kernel and wgmma variants 5 to 10 on each shape), FlashInfer's
# BatchPrefillWithPagedKVCacheWrapper on the same shapes (wheels from .whl, installed into
# /tmp/site; its JIT cache in build-fi/, which an earlier call's
# `attention_flashinfer_baseline.py --warm-only --cases prefill` may have filled), PyTorch's SDPA on
# the same shapes (bench/attention_sdpa_baseline.py), then Nsight Compute profiles with stall
# samples of the kernels named in PROFILE (default: variants 5 and 7 at ctx 8192, 2048 new tokens;
# pp: variant 8, sync: 6, wide: 9). Rows: $OUT/prefill.jsonl, $OUT/baselines.jsonl (FlashInfer),
# $OUT/sdpa.jsonl; logs beside. SKIP_FI=1, SKIP_SDPA=1 leave a baseline out.
#   OUT=<dir> [OLD_TREES=<commits>] [PROFILE="ws tma pp sync"] [APPEND=1: also `kvcore bench append`, before FlashInfer] bash bench/gpu/prefill.sh
source "$(dirname "$0")/job.sh"
[ -x build/kvcore ] || { log "no build/kvcore: run a job that builds it first"; exit 1; }
flashinfer_env
log "kvcore attention_prefill"
timeout 150 ./build/kvcore bench attention_prefill --device cuda --json "$OUT/prefill.jsonl" > "$OUT/prefill.log" 2>&1 ||
  log "attention_prefill rc $?"
grep -E "prefill" "$OUT/prefill.log" | head -40
# OLD_TREES: commits whose tool bench/gpu/builds.sh built in this call (/tmp/build-<c>/kvcore): the
# same bench with their kernels, rows in $OUT/prefill-<c>.jsonl.
for c in ${OLD_TREES:-}; do
  [ -x "/tmp/build-$c/kvcore" ] || continue
  log "attention_prefill at $c"
  timeout 120 "/tmp/build-$c/kvcore" bench attention_prefill --device cuda --json "$OUT/prefill-$c.jsonl" \
    > "$OUT/prefill-$c.log" 2>&1 || log "attention_prefill at $c rc $?"
done
if [ -n "${APPEND:-}" ]; then
  log "kvcore append"
  timeout 90 ./build/kvcore bench append --device cuda --json "$OUT/append.jsonl" > "$OUT/append.log" 2>&1 || log "append rc $?"
  grep -E "step_" "$OUT/append.log" | head -20
fi
if [ -z "${SKIP_FI:-}" ]; then  # SKIP_FI=1: no FlashInfer
  # FI_WARM_PID: a FlashInfer warm-up started earlier in the same call (its JIT finishes first).
  while [ -n "${FI_WARM_PID:-}" ] && kill -0 "$FI_WARM_PID" 2>/dev/null; do sleep 2; done
  log "FlashInfer prefill"
  timeout 200 python3 bench/attention_flashinfer_baseline.py --cases prefill --json "$OUT/baselines.jsonl" \
    > "$OUT/baselines.log" 2>&1 || log "FlashInfer rc $?"
  tail -6 "$OUT/baselines.log"
fi
if [ -z "${SKIP_SDPA:-}" ]; then  # SKIP_SDPA=1: no PyTorch SDPA (cuDNN / flash backends) on the same shapes
  log "SDPA prefill"
  timeout 90 python3 bench/attention_sdpa_baseline.py --cases prefill --json "$OUT/sdpa.jsonl" > "$OUT/sdpa.log" 2>&1 ||
    log "SDPA rc $?"
fi
targets=""
for k in ${PROFILE-ws tma}; do
  case $k in
    ws) targets+="attention_prefill | llama8b_prefill_f16_b1_ctx8192_new2048_wgmma | prefill_wgmma_ws_kernel | 1 | prefill-ws-8k"$'\n' ;;
    tma) targets+="attention_prefill | llama8b_prefill_f16_b1_ctx8192_new2048_wgmma_tma | prefill_wgmma_tma_kernel | 1 | prefill-tma-8k"$'\n' ;;
    pp) targets+="attention_prefill | llama8b_prefill_f16_b1_ctx8192_new2048_wgmma_tma_pp | prefill_wgmma_tma_kernel | 1 | prefill-tma-pp-8k"$'\n' ;;
    sync) targets+="attention_prefill | llama8b_prefill_f16_b1_ctx8192_new2048_wgmma_sync | prefill_wgmma_kernel | 1 | prefill-sync-8k"$'\n' ;;
    wide) targets+="attention_prefill | llama8b_prefill_f16_b1_ctx8192_new2048_wgmma_wide | prefill_wgmma_wide_kernel | 1 | prefill-wide-8k"$'\n' ;;
  esac
done
if [ -n "$targets" ]; then
  log "Nsight Compute: ${PROFILE-ws tma}"
  OUT=$OUT NCU_SASS=1 PROFILE_TARGETS="$targets" bash bench/ncu-profile.sh
fi
log done
