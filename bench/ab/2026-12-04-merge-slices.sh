# A/B run of 2026-12-04 (device machine): the split-K merge with a CTA per 32 dims when (row, head)
# pairs are fewer than the SMs, against one CTA per pair (KVCORE_ATTN_MERGE_SLICES=0), interleaved,
# with PyTorch SDPA on the same batch-1 shapes in the same job. All CUDA tests first.
set -o pipefail
OUT=${OUT:-out}
OUT=$OUT GPU_TEST_FILTER='*' BENCH_CMDS="" bash bench/gpu-run-focus.sh 2>&1 | tail -8
cases="--case f16_b1_ctx8192 --case f16_b1_ctx32768 --case f16_b1_ctx131072 --case fp8_b1_ctx8192 --case fp8_b1_ctx32768 --case fp8_b1_ctx131072 --case f16_b16_ctx8192"
for knob in 1 0 1 0; do
  echo "== $(date +%T) KVCORE_ATTN_MERGE_SLICES=$knob"
  KVCORE_ATTN_MERGE_SLICES=$knob ./build/kvcore bench attention --device cuda $cases 2>&1 | grep -E "^attention" | grep -v simt
done
echo "== $(date +%T) SDPA"
python3 bench/attention_sdpa_baseline.py --cases llama8b_f16_b1_ctx8192 llama8b_f16_b1_ctx32768 llama8b_f16_b1_ctx131072 \
  llama8b_fp8_b1_ctx8192 llama8b_fp8_b1_ctx32768 llama8b_fp8_b1_ctx131072 --json "$OUT/sdpa.jsonl" 2>&1 | tail -3
python3 -c "
import json,sys
for l in open('$OUT/sdpa.jsonl'):
    r=json.loads(l)
    if r.get('variant')=='dense': print(r['case'], round(r['median_us'],1))
"
echo "== $(date +%T) done"
