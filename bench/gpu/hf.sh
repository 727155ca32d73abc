#!/usr/bin/env bash
# kvcore.hf on the GPU machine (CUDA 13, PyTorch 2.11, transformers 5.17, accelerate; no network):
# build the Python module with CUDA, run the kvcore.hf tests' CUDA cases (tiny random models:
# logits vs HF eager, shift vs the float64 reference, padding, beams, crop), then decode tokens/s
# of generate-style steps with kvcore's cache against HF's DynamicCache + sdpa (random weights of
# SmolLM2's and Llama-3-8B's shapes, bf16).
#   KVCORE_GIT_COMMIT=<hash> OUT=<dir> bash bench/gpu/hf.sh            # tests + throughput
#   HF_STAGES="tests" bash bench/gpu/hf.sh                                # only the tests (~1-2 min)
# The real SmolLM2 GGUF (98 MB) is larger than what one device call carries (64 MiB):
# bench/gpu/hf_stage.sh splits it in two for two calls (it prints them). Where the model is present
# (KVCORE_SMOLLM2_DIR holding SmolLM2-135M-Instruct.Q4_1.gguf, and the `gguf` package importable),
# the demo and the StreamingLLM perplexity run on CUDA too (stages demo, ppl).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
BUILD=${BUILD:-build}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
STAGES=${HF_STAGES:-"build tests throughput demo ppl"}
COMMIT=${KVCORE_GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
export KVCORE_GIT_COMMIT="$COMMIT"
has() { [[ " $STAGES " == *" $1 "* ]]; }
log() { echo "== $(date +%T) $*"; }
PY=$(command -v python3)

if has build; then
  log "build the Python module with CUDA (commit $COMMIT)"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCORE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DKVCORE_PYTHON=ON -DPython_EXECUTABLE="$PY" -DKVCORE_GIT_COMMIT="$COMMIT" > "$OUT/hf-build.log" 2>&1 ||
    { tail -30 "$OUT/hf-build.log"; exit 1; }
  cmake --build "$BUILD" -j "$(nproc)" --target kvcore_python kvcore_python_files >> "$OUT/hf-build.log" 2>&1 ||
    { grep -E 'error|Error' -A3 "$OUT/hf-build.log" | head -40; exit 1; }
fi
export PYTHONPATH="$(pwd)/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import kvcore, torch, transformers; print('kvcore', kvcore.version(), 'cuda', kvcore.cuda_compiled(), \
kvcore.cuda_device_count(), 'torch', torch.__version__, 'transformers', transformers.__version__)"

if has tests; then
  log "kvcore.hf tests, CUDA cases"
  "$PY" -m pytest -q -p no:cacheprovider -W ignore::FutureWarning -k cuda python/tests/test_hf_generate.py \
    python/tests/test_hf_shift.py python/tests/test_hf_batch.py python/tests/test_hf_streaming.py 2>&1 | tee "$OUT/hf-tests.log" | tail -15
fi
if has throughput; then
  log "decode throughput, SmolLM2 shape (random weights, bf16)"
  "$PY" bench/hf/throughput.py --model smollm2-shape --device cuda --batches 1 16 64 --contexts 1024 8192 32768 \
    --steps 16 --hf-impls sdpa --hf-paged --hf-paged-max-tokens 524288 --json "$OUT/hf-throughput-smollm2.jsonl" 2>&1 | grep -v Warning | tee "$OUT/hf-throughput.log"
  log "decode throughput, Llama-3-8B shape (32 layers, random weights, bf16)"
  "$PY" bench/hf/throughput.py --model llama3-8b-shape --device cuda --batches 1 16 64 --contexts 1024 8192 32768 \
    --steps 8 --hf-impls sdpa --hf-paged --hf-paged-max-tokens 131072 --json "$OUT/hf-throughput-llama8b.jsonl" 2>&1 | grep -v Warning | tee -a "$OUT/hf-throughput.log"
fi
if has demo && [ -n "${KVCORE_SMOLLM2_DIR:-}" ]; then
  log "demo: SmolLM2-135M-Instruct on CUDA"
  "$PY" -m kvcore.hf.demo --device cuda --compare 2>&1 | tail -8 | tee "$OUT/hf-demo.log"
fi
if has ppl && [ -n "${KVCORE_SMOLLM2_DIR:-}" ]; then
  log "StreamingLLM perplexity: 16k tokens of the Debian Reference, windows 256 512 1024"
  # every method but llamacpp (llama-cpp-python is CPU-only and runs here, not there); ~1-3 min on an H200
  "$PY" bench/hf/streaming_ppl.py --device cuda --tokens 16384 --windows 256 512 1024 \
    --methods sink4_on_read_f16 window_f16 full recompute sink4_stored_f16 sink4_on_read_fp8 sink4_stored_fp8 \
    --text-file "$KVCORE_SMOLLM2_DIR/debian-reference.en.txt.gz" --gguf-dir "$KVCORE_SMOLLM2_DIR" \
    --out "$OUT/hf-ppl" 2>&1 | grep -v Warn | tail -30
fi
