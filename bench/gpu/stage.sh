#!/usr/bin/env bash
# Stage here what the GPU machine lacks for bench/gpu-all.sh and the bench/gpu/ jobs, in two
# git-ignored folders that a device call carries (carry [".whl", ".gpu"], 64 MiB together):
#   .whl/      FlashInfer 0.6.0 and the two packages it needs beyond the image (wheels; pass
#              WHEELS=.whl to gpu-all.sh);
#   .gpu/deps/ the Debian packages kvcore builds against that the image lacks (Highway, xxHash,
#              DLPack's header), unpacked: export CMAKE_PREFIX_PATH=$PWD/.gpu/deps/usr and
#              LD_LIBRARY_PATH=$PWD/.gpu/deps/usr/lib/x86_64-linux-gnu there.
#   .gpu/tree-<commit>.tar.gz  the source of each commit named (bench/gpu/builds.sh builds them
#              beside this tree's, for measuring several states of the code in one job).
#   bash bench/gpu/stage.sh [commit ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
exclude=$(git rev-parse --git-path info/exclude)
for d in /.whl/ /.gpu/; do grep -qx "$d" "$exclude" 2>/dev/null || echo "$d" >> "$exclude"; done

rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  flashinfer-python==0.6.0 apache-tvm-ffi==0.1.15 nvidia-cudnn-frontend==1.32.0

rm -rf .gpu/deps .gpu/tree-*.tar.gz && mkdir -p .gpu/deps
for c in "$@"; do
  c=$(git rev-parse --short=7 "$c")
  git archive --prefix="$c/" "$c" -- . ':(exclude)bench/results' | gzip > ".gpu/tree-$c.tar.gz"
done
debs=$(mktemp -d) && chmod 777 "$debs"  # apt-get download writes as _apt
(cd "$debs" && apt-get download libhwy-dev libhwy1 libxxhash-dev libdlpack-dev >/dev/null)
for f in "$debs"/*.deb; do dpkg -x "$f" .gpu/deps; done
rm -rf "$debs"
du -sh .whl .gpu
echo "device calls: carry [\".whl\", \".gpu\"]; start with"
echo "  export CMAKE_PREFIX_PATH=\$PWD/.gpu/deps/usr LD_LIBRARY_PATH=\$PWD/.gpu/deps/usr/lib/x86_64-linux-gnu"
