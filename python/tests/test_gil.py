"""kvcore releases the GIL while it works: a Python thread keeps running during a long call."""

import threading
import time

import numpy as np

import kvcore


def test_gil_released_during_shift_dense():
    cap, heads, dim = 16000, 8, 128
    k = np.random.default_rng(0).standard_normal((cap, heads, dim)).astype(np.float32)
    rope = kvcore.RopeSpec.plain(dim, 10000.0)
    t0 = time.perf_counter()
    kvcore.shift_dense([k], None, rope, cap, 1, 1)
    solo = time.perf_counter() - t0
    gaps, done = [], threading.Event()

    def work():
        for _ in range(2):
            kvcore.shift_dense([k], None, rope, cap, 1, 1)
        done.set()

    th = threading.Thread(target=work)
    last = time.perf_counter()
    th.start()
    while not done.is_set():  # this loop needs the GIL to make progress
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
        time.sleep(0.0005)
    th.join()
    # Holding the GIL through a call would stall this loop for about `solo` seconds at a time.
    assert len(gaps) > 10 and max(gaps) < max(0.5 * solo, 0.05), (max(gaps), solo, len(gaps))
