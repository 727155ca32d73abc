import faulthandler, sys
faulthandler.enable()
import numpy as np
import kvcore
what = sys.argv[1]
print("kvcore", kvcore.version(), "cuda", kvcore.cuda_compiled(), flush=True)
if what == "raise":
    try:
        kvcore.fp8_round_trip_rows(np.ones((2, 64), np.float32), 3)
    except kvcore.Error as e:
        print("raised ok:", type(e).__name__, e, flush=True)
elif what == "raise_std":
    try:
        kvcore.PagedCache(n_layers=0, n_kv_heads=2, head_dim=64, num_blocks=32,
                          rope=kvcore.RopeSpec.plain(64, 10000.0), block_size=8)
    except Exception as e:
        print("raised ok:", type(e).__name__, e, flush=True)
elif what == "newarray":
    y = kvcore.fp8_round_trip_rows(np.ones((2, 64), np.float32))
    print("new array ok:", type(y), y.shape, flush=True)
elif what == "repr":
    c = kvcore.PagedCache(n_layers=2, n_kv_heads=2, head_dim=64, num_blocks=32,
                          rope=kvcore.RopeSpec.plain(64, 10000.0), block_size=8)
    s = c.create()
    i = c.info(s)
    print("info ok", i.n_live, flush=True)
    print("repr:", repr(i), flush=True)
print("done", what, flush=True)
