"""The committed type stubs equal what python/make_stubs.py makes from this build, and every
public name has a docstring."""

import os
import subprocess
import sys

import pytest

import kvcore

HERE = os.path.dirname(os.path.abspath(__file__))


def test_stubs_are_current(tmp_path):
    pytest.importorskip("nanobind")
    if not kvcore.redis_compiled():
        pytest.skip("the committed stubs are those of a build with hiredis (kvcore.RedisStore)")
    committed = os.path.join(HERE, "..", "kvcore", "_ext.pyi")
    fresh = tmp_path / "_ext.pyi"
    subprocess.run([sys.executable, os.path.join(HERE, "..", "make_stubs.py"), str(fresh)], check=True)
    with open(committed) as f:
        assert f.read() == fresh.read_text(), "python/kvcore/_ext.pyi is stale: run python/make_stubs.py"


def test_every_public_name_is_documented():
    for name in kvcore.__all__ if hasattr(kvcore, "__all__") else dir(kvcore):
        if name.startswith("_") or name in ("tensors",):
            continue
        obj = getattr(kvcore, name)
        if callable(obj):
            assert obj.__doc__ and len(obj.__doc__.strip()) > 10, name
