#!/usr/bin/env bash
# GPU job: kvcore's attention benches beside FlashInfer's (and SDPA's) in one job. FlashInfer
# JIT-compiles its kernels on first use (minutes); that runs in the background while kvcore builds.
#   KVCORE_GIT_COMMIT=<hash> WHEELS=<folder of FlashInfer wheels> OUT=<dir> bash bench/gpu-flashinfer.sh
# Env: FI_CACHE (a .tgz of an earlier job's FlashInfer JIT cache; the cache goes back as $OUT/fi-cache.tgz).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl &&
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export FLASHINFER_CUDA_ARCH_LIST=9.0 FLASHINFER_WORKSPACE_BASE=/tmp/fiws MAX_JOBS=8
mkdir -p /tmp/fiws
[ -n "${FI_CACHE:-}" ] && [ -f "$FI_CACHE" ] && tar -C /tmp/fiws -xzf "$FI_CACHE"
(python3 bench/attention_flashinfer_baseline.py --warm-only > "$OUT/fi-warm.log" 2>&1) &
FI_PID=$!
GPU_RUN_STAGES="build bench" BUILD_TARGETS=kvcore_cli BENCH_TIMEOUT=150 bash bench/gpu-run.sh attention attention_prefill
echo "== $(date +%T) waiting for FlashInfer's JIT"
wait "$FI_PID"; tail -12 "$OUT/fi-warm.log"
echo "== $(date +%T) FlashInfer baseline"
timeout "${FI_TIMEOUT:-240}" python3 bench/attention_flashinfer_baseline.py --json "$OUT/baselines.jsonl" > "$OUT/baselines.log" 2>&1
tail -5 "$OUT/baselines.log"
tar -C /tmp/fiws -czf "$OUT/fi-cache.tgz" . && ls -la "$OUT/fi-cache.tgz"
echo "== $(date +%T) SDPA baseline"
timeout "${SDPA_TIMEOUT:-90}" python3 bench/attention_sdpa_baseline.py --json "$OUT/baselines.jsonl" --cases llama8b >> "$OUT/baselines.log" 2>&1
python3 bench/summarize.py "$OUT" > "$OUT/summary.md" 2>&1
echo "== $(date +%T) done"
