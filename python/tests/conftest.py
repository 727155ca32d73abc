"""Shared helpers of the kvcore pytest suite: float64 references (RoPE, attention, FP8 E4M3 with
UE8M0 block scales, bf16 rounding) written from the specs, not from kvcore's code, and a fake
CUDA tensor for CPU-build checks."""

import ctypes

import numpy as np
import pytest

import kvcore


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# ---- RoPE -------------------------------------------------------------------------------------
def rope_freqs(n_rot, theta):
    return theta ** (-2.0 * np.arange(n_rot // 2) / n_rot)


def rotate_neox(x, pos, n_rot, theta):
    """x [..., head_dim] float64 rotated at positions pos (broadcast over leading dims); NeoX pairs
    (i, i + n_rot/2) over the first n_rot dims."""
    x = np.array(x, dtype=np.float64, copy=True)
    w = rope_freqs(n_rot, theta)
    ang = np.asarray(pos, dtype=np.float64)[..., None] * w
    c, s = np.cos(ang), np.sin(ang)
    while c.ndim < x.ndim:
        c, s = c[..., None, :], s[..., None, :]
    h = n_rot // 2
    a, b = x[..., :h].copy(), x[..., h:n_rot].copy()
    x[..., :h] = a * c - b * s
    x[..., h:n_rot] = a * s + b * c
    return x


def rotate_interleaved_tail(x, pos, n_rot, theta):
    """Interleaved pairs (2i, 2i+1) over the last n_rot dims."""
    x = np.array(x, dtype=np.float64, copy=True)
    w = rope_freqs(n_rot, theta)
    ang = np.asarray(pos, dtype=np.float64)[..., None] * w
    c, s = np.cos(ang), np.sin(ang)
    while c.ndim < x.ndim:
        c, s = c[..., None, :], s[..., None, :]
    t = x[..., x.shape[-1] - n_rot:]
    a, b = t[..., 0::2].copy(), t[..., 1::2].copy()
    t[..., 0::2] = a * c - b * s
    t[..., 1::2] = a * s + b * c
    return x


# ---- attention --------------------------------------------------------------------------------
def attention_f64(q, k, v, scale, causal_q_pos=None, k_pos=None):
    """q [n_q_heads, D], k [n, n_kv_heads, D], v [n, n_kv_heads, Dv] (rotated already) -> [n_q_heads, Dv]."""
    hq, hk = q.shape[0], k.shape[1]
    out = np.zeros((hq, v.shape[2]))
    for h in range(hq):
        kh = h // (hq // hk)
        s = (k[:, kh, :].astype(np.float64) @ q[h].astype(np.float64)) * scale
        if causal_q_pos is not None:
            s = np.where(np.asarray(k_pos) <= causal_q_pos, s, -np.inf)
        if not np.isfinite(s).any():
            continue
        p = np.exp(s - s.max())
        out[h] = p @ v[:, kh, :].astype(np.float64) / p.sum()
    return out


# ---- FP8 E4M3 (fn) with UE8M0 block scales --------------------------------------------------------
def _e4m3_table():
    vals = []
    for code in range(0x7F):  # 0x7f is NaN
        e, m = code >> 3, code & 7
        vals.append(m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(vals)


E4M3 = _e4m3_table()


def e4m3_round(x):
    """Round float64 values (|x| <= 448) to the nearest E4M3 value, ties to the even code."""
    a = np.abs(x)
    i = np.clip(np.searchsorted(E4M3, a), 1, len(E4M3) - 1)
    lo, hi = E4M3[i - 1], E4M3[i]
    pick_hi = (a - lo > hi - a) | ((a - lo == hi - a) & ((i % 2) == 0))
    return np.sign(x) * np.where(pick_hi, hi, lo)


def fp8_round_trip_ref(x, n_rot):
    """Per row: blocks of 64 over the first cols - n_rot dims, scale 2^ceil(log2(max(amax, 1e-4) / 448)),
    values rounded to E4M3 at that scale; the tail unchanged."""
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    n_nope = x.shape[-1] - n_rot
    for b0 in range(0, n_nope, 64):
        blk = x[..., b0:min(b0 + 64, n_nope)]
        amax = np.maximum(np.abs(blk).max(axis=-1, keepdims=True), 1e-4)
        scale = 2.0 ** np.ceil(np.log2(amax / 448.0))
        out[..., b0:b0 + blk.shape[-1]] = e4m3_round(blk / scale) * scale
    return out


def bf16_round(x):
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


# ---- a CUDA tensor that is not there ---------------------------------------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class FakeCudaTensor:
    """Exports, through DLPack, a float32 tensor said to live on cuda:0 at an address nothing may
    touch: a CPU build must refuse it without reading it."""

    def __init__(self, shape, code=2, bits=32, address=0x10000):
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._mt = _DLManagedTensor()
        t = self._mt.dl_tensor
        t.data = address
        t.device = _DLDevice(2, 0)
        t.ndim = len(shape)
        t.dtype = _DLDataType(code, bits, 1)
        t.shape = self._shape
        t.strides = None

    def __dlpack__(self, **kwargs):
        return _capsule_new(ctypes.addressof(self._mt), b"dltensor", None)

    def __dlpack_device__(self):
        return (2, 0)


def small_cache(**kw):
    args = dict(n_layers=2, n_kv_heads=2, head_dim=64, num_blocks=32, rope=kvcore.RopeSpec.plain(64, 10000.0),
                block_size=8)
    args.update(kw)
    return kvcore.PagedCache(**args)
