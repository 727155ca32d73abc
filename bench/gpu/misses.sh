#!/usr/bin/env bash
# What bounds issue 24's misses, measured in one GPU call on a fresh or warm machine:
#   - the appends, with the copy replayed from a CUDA graph beside the graph store (`kvcore bench append`);
#   - Nsight Compute profiles (stall samples per SASS line) of the DeepSeek-V4 indexer's kernels in
#     the 43-layer step: the tensor-core scorer at 8k and 64k, the cluster top-k at 64k;
#   - Nsight Compute on FlashInfer's prefill kernel at 8k context, 2048 new tokens, beside kvcore's
#     automatic wgmma kernel on the same shape (the tensor pipe's share in each).
# The folders .whl and .gpu staged by bench/gpu/stage.sh are carried.
#   OUT=<dir> KVCORE_GIT_COMMIT=<hash> bash bench/gpu/misses.sh
source "$(dirname "$0")/job.sh"
export OUT
COMMIT=${KVCORE_GIT_COMMIT:-unknown}
fi_warm=""
[ -d .whl ] && start_flashinfer_warm
log "build $COMMIT"
build_this_tree kvcore_cli || { log "build failed"; exit 1; }

log "append"
timeout 90 ./build/kvcore bench append --device cuda --json "$OUT/append.jsonl" > "$OUT/append.log" 2>&1 || log "append rc $?"
grep -E "of a same-size copy" "$OUT/append.log"

# Launch skips land past the bench's checks and warm-up, on a timed call. The indexer's kernels
# take 8-16 us: a sample every 32 cycles (NCU_SAMPLING=0) gives them some 1,500-5,000 samples, the
# default interval about 50.
OUT=$OUT NCU_SASS=1 NCU_SAMPLING=${NCU_SAMPLING:-0} PROFILE_TARGETS="
dsv4 | decode43 cache step+indexer ctx=65536 | score_mma_kernel | 60 | dsv4-scores-64k
dsv4 | decode43 cache step+indexer ctx=65536 | topk_cluster_kernel | 60 | dsv4-topk-64k
dsv4 | decode43 cache step+indexer ctx=8192 | score_mma_kernel | 60 | dsv4-scores-8k
dsv4 | decode43 cache step+indexer ctx=8192 | topk_compact_kernel | 60 | dsv4-topk-8k
attention_prefill | llama8b_prefill_f16_b1_ctx8192_new2048 | prefill_wgmma_kernel | 1 | prefill-auto-8k
" timeout 300 bash bench/ncu-profile.sh

if [ -n "$fi_warm" ]; then
  timeout 200 tail --pid="$fi_warm" -f /dev/null
  log "ncu: FlashInfer prefill"
  # The second case's kernels (ctx 8192, 2048 new): past the first case's warm-up and timed calls.
  timeout 200 ncu --clock-control none -k "regex:[Pp]refill" --launch-skip 40 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
    --section ComputeWorkloadAnalysis \
    python3 bench/attention_flashinfer_baseline.py --cases prefill --reps 30 --warmup 5 > "$OUT/ncu-fi-prefill.txt" 2>&1 ||
    log "ncu FlashInfer rc $?"
  grep -E "^  [a-zA-Z_].*\(|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Grid Size|Block Size|pipeline" \
    "$OUT/ncu-fi-prefill.txt" | head -20
fi
# One archive comes back whole (a call returns few files): everything else is removed.
cd "$OUT" && tar czf /tmp/misses.tgz ./* && rm -rf ./* && mv /tmp/misses.tgz . && log "done"
