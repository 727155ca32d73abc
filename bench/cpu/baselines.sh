#!/usr/bin/env bash
# CPU baselines next to `kvcore bench attention|rope --device cpu`: ggml (llama.cpp's CPU
# kernels, PyPI ggml-python, built from source by pip for this machine) and NumPy.
# Usage: bench/cpu/baselines.sh OUT.jsonl [threads...]   (default threads: 1 2)
# The virtual environment lives in $KVCORE_BASELINE_VENV (default build/cpu-baseline-venv).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: baselines.sh OUT.jsonl [threads...]}
shift
threads=("$@")
[ ${#threads[@]} -gt 0 ] || threads=(1 2)
venv=${KVCORE_BASELINE_VENV:-$root/build/cpu-baseline-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q ggml-python==0.0.45 numpy
fi
for t in "${threads[@]}"; do
  OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t "$venv/bin/python" "$root/bench/cpu/ggml_baseline.py" --threads "$t" \
    --json "$out" ${KVCORE_BASELINE_ARGS:-}
done
