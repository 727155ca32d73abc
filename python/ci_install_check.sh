#!/usr/bin/env bash
# CI: `pip install .` exactly as the README says, into a fresh virtual environment, then import
# kvcore from outside the source tree, run the README's Python quick start as written, and the
# pytest suite against the installed package (catches files the install rules forget).
# CMAKE_ARGS (read by scikit-build-core) defaults to a CPU build to keep CI short; set
# KVCORE_CI_PIP_CUDA=1 to build the CUDA backend too where nvcc is present.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
py="$tmp/venv/bin/python"
if [ "${KVCORE_CI_PIP_CUDA:-0}" != 1 ]; then export CMAKE_ARGS="${CMAKE_ARGS:-} -DKVCORE_CUDA=OFF"; fi
export SKBUILD_BUILD_DIR="$tmp/build"
"$tmp/venv/bin/pip" install -q --disable-pip-version-check .
cd "$tmp"
"$py" -c "import kvcore; print('kvcore', kvcore.version(), 'from', kvcore.__file__, 'cuda', kvcore.cuda_compiled())"
"$py" -c "import kvcore, os; assert os.path.exists(os.path.join(os.path.dirname(kvcore.__file__), '_ext.pyi'))"
"$py" -c "import kvcore, os; assert os.path.exists(os.path.join(os.path.dirname(kvcore.__file__), 'hf', 'cache.py'))"
python3 "$root/python/tests/readme_blocks.py" "$root/README.md" python > quickstart.py
"$py" quickstart.py
"$tmp/venv/bin/pip" install -q --disable-pip-version-check pytest
"$py" -m pytest -q -p no:cacheprovider "$root/python/tests"
