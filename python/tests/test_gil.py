"""kvcore releases the GIL while it works: a Python thread keeps running during a long call."""

import math
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
    # About 0.2 s of calls, whatever this machine's speed (a fixed count of fast calls would give
    # the loop below too few ticks to judge).
    reps = max(3, math.ceil(0.2 / solo))
    gaps, done = [], threading.Event()

    def work():
        for _ in range(reps):
            kvcore.shift_dense([k], None, rope, cap, 1, 1)
        done.set()

    th = threading.Thread(target=work)
    last = time.perf_counter()
    th.start()
    while not done.is_set():  # this loop needs the GIL to make progress
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
        time.sleep(0.0002)
    th.join()
    # Holding the GIL through each call would let this loop tick only between calls: about one gap
    # of `solo` seconds a call. Released, it ticks every sleep, several times a call. The median gap
    # stands up to the scheduler's occasional delays (the call's threads take every core), where a
    # maximum would not.
    median = sorted(gaps)[len(gaps) // 2]
    assert len(gaps) >= 2 * reps and median < 0.5 * solo, (median, solo, len(gaps), reps)
