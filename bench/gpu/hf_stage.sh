#!/usr/bin/env bash
# Stage what bench/gpu/hf.sh needs for the real model on the GPU machine, which fetches nothing and
# takes at most 64 MiB a call: the SmolLM2 GGUF (98 MB) split in two halves, the `gguf` wheel
# (pure Python) and the Debian Reference text, in two git-ignored folders for two calls.
#   bash bench/gpu/hf_stage.sh        # here; then the two device calls it prints
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
grep -qx '/.hf-stage-a/' "$(git rev-parse --git-path info/exclude)" 2>/dev/null || printf '/.hf-stage-a/\n/.hf-stage-b/\n' >> "$(git rev-parse --git-path info/exclude)"
dir=$(PYTHONPATH=python "$PY" -c "
import importlib.util as u, sys
spec = u.spec_from_file_location('smollm2', 'python/kvcore/hf/smollm2.py')
m = u.module_from_spec(spec); spec.loader.exec_module(m); print(m.fetch()[0])")
rm -rf .hf-stage-a .hf-stage-b && mkdir -p .hf-stage-a .hf-stage-b
split -n 2 -d "$dir/SmolLM2-135M-Instruct.Q4_1.gguf" .hf-stage-a/gguf.part
mv .hf-stage-a/gguf.part01 .hf-stage-b/
"$PY" -m pip download -q --no-deps --only-binary=:all: -d .hf-stage-a gguf
text=/usr/share/debian-reference/debian-reference.en.txt.gz
[ -f "$text" ] || text=$(ls ~/.cache/kvcore/debian-reference.en.txt.gz)
cp "$text" .hf-stage-b/
du -sh .hf-stage-a .hf-stage-b
cat <<'CALLS'
device call 1, carry [".hf-stage-a"]:
  mkdir -p /tmp/smollm2 && cp .hf-stage-a/* /tmp/smollm2/ && HF_STAGES="build tests throughput" bash bench/gpu/hf.sh
device call 2 (same warm machine), carry [".hf-stage-b"]:
  cat /tmp/smollm2/gguf.part00 .hf-stage-b/gguf.part01 > /tmp/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf &&
  cp .hf-stage-b/*.gz /tmp/smollm2/ && python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/smollm2/gguf-*.whl &&
  PYTHONPATH=/tmp/site KVCORE_SMOLLM2_DIR=/tmp/smollm2 HF_STAGES="build demo ppl" bash bench/gpu/hf.sh
CALLS
