#!/usr/bin/env bash
# The CPU rows of issue #21's tables, for a quiet machine (2 threads at most; load averages recorded):
#   1. llama.cpp's own context shift (llama-cpp-python) on SmolLM2's GGUF: perplexity over 16k tokens
#      of the Debian Reference at windows 256 512 1024, 4 kept tokens;
#   2. decode tokens/s, SmolLM2 f32: HF generate steps with kvcore's cache (f16, FP8) vs HF's default
#      cache (sdpa, eager), contexts 16 / 1k / 4k, 1 and 2 threads, best of 3 rounds, kvcore's share of a
#      step; llama.cpp's decode tokens/s beside (its Q4_1 matmuls);
#   3. optionally kvcore's own perplexity rows on this CPU (PPL_KVCORE="sink4_on_read_f16 window_f16").
# Then the table and plot are rewritten from every JSON given in PPL_MERGE (e.g. the H200 run's hf-ppl.json).
#   PY=build/pyenv/bin/python LLAMACPP_SITE=<dir with llama_cpp> OUT=bench/results/2026-12-05-hf bash bench/hf/cpu_tables.sh
# llama-cpp-python: built from its PyPI sdist once (bench/hf/llamacpp_ppl.py says how), not in CI.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
OUT=${OUT:-out/hf-cpu}
BUILD=${BUILD:-build}
mkdir -p "$(dirname "$OUT")"
export PYTHONPATH="$BUILD/python${LLAMACPP_SITE:+:$LLAMACPP_SITE}${EXTRA_SITE:+:$EXTRA_SITE}" PYTHONUNBUFFERED=1
load() { echo "$(date -u +%FT%TZ) $1: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT-load.txt"; }
: > "$OUT-load.txt"
STEPS=${STEPS:-"ppl decode throughput"}
has() { [[ " $STEPS " == *" $1 "* ]]; }

if has ppl; then
  load "before llama.cpp perplexity"
  nice -n 5 "$PY" bench/hf/streaming_ppl.py --tokens 16384 --windows 256 512 1024 --methods llamacpp \
    ${PPL_KVCORE:+$PPL_KVCORE} --threads 2 --out "$OUT-ppl-cpu" 2>&1 | grep -v -i warn
  load "after llama.cpp perplexity"
fi
if has decode; then
  load "before llama.cpp decode"
  : > "$OUT-llamacpp-decode.jsonl"
  nice -n 5 "$PY" bench/hf/llamacpp_ppl.py --contexts 16 1024 4096 --threads 1 2 --json "$OUT-llamacpp-decode.jsonl"
  load "after llama.cpp decode"
fi
if has throughput; then
  for th in 1 2; do
    load "before HF/kvcore decode, $th threads"
    nice -n 5 "$PY" bench/hf/throughput.py --model smollm2 --contexts 16 1024 4096 --threads "$th" --rounds 3 --share \
      --json "$OUT-throughput-t$th.jsonl" 2>&1 | grep -v -i warn
  done
  load "after HF/kvcore decode"
fi
if [ -n "${PPL_MERGE:-}" ]; then
  # shellcheck disable=SC2086
  "$PY" bench/hf/streaming_ppl.py --from-json $PPL_MERGE "$OUT-ppl-cpu.json" --out "$OUT-ppl-16k"
fi
