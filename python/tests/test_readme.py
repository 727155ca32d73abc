"""The README's Python quick start runs as written and prints what it promises."""

import os
import subprocess
import sys

from readme_blocks import quickstart

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")


def test_python_quickstart_runs():
    with open(README) as f:
        code = quickstart(f.read(), "python")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "(1, 4, 64) SeqInfo(n_live=4" in r.stdout, r.stdout
