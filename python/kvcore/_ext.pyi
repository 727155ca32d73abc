"""kvcore's compiled bindings; import kvcore instead."""

from collections.abc import Sequence
from typing import overload

from kvcore import (
    CorruptError as CorruptError,
    DeviceError as DeviceError,
    Error as Error,
    InvalidArgumentError as InvalidArgumentError,
    NotSupportedError as NotSupportedError,
    OutOfMemoryError as OutOfMemoryError
)

import os
from typing import Any, TypeAlias

Tensor: TypeAlias = Any
"""Any object with __dlpack__: numpy.ndarray, torch.Tensor, ... (used in place, never copied)."""


class RopeSpec:
    """
    A model's rotary embedding: which dims rotate (n_rot, slice), how they pair, the base
    frequency theta and the scaling variant (none, linear, llama3, yarn).

    Build one with RopeSpec(n_rot, theta, ...) or a preset: RopeSpec.llama3_8b(),
    RopeSpec.deepseek_v4_compressed(), RopeSpec.deepseek_v4_window().
    """

    def __init__(self, n_rot: int, theta: float = 10000.0, *, pairing: str = 'neox', slice: str = 'head', scaling: str = 'none', factor: float = 1.0, low_freq_factor: float = 1.0, high_freq_factor: float = 4.0, original_max_position: int = 8192, beta_fast: float = 32.0, beta_slow: float = 1.0, yarn_truncate: bool = True, freq_factors: Sequence[float] = [], attention_factor: float = 1.0) -> None:
        """
        n_rot: rotated dims (even, <= head_dim); pairing 'neox' (halves) or 'interleaved' (adjacent);
        slice 'head' (first n_rot dims) or 'tail' (last n_rot); scaling 'none', 'linear', 'llama3' or
        'yarn' with its factors; freq_factors: optional n_rot/2 divisors; attention_factor scales cos
        and sin at write time only (YaRN mscale).
        """

    @staticmethod
    def plain(n_rot: int, theta: float = 10000.0) -> RopeSpec:
        """Unscaled NeoX RoPE over the first n_rot dims."""

    @staticmethod
    def llama3_8b() -> RopeSpec:
        """Llama-3-8B: 128 dims, theta 500000, Llama-3 scaling."""

    @staticmethod
    def deepseek_v4_compressed() -> RopeSpec:
        """
        DeepSeek-V4 compressed rows: tail 64 dims, interleaved, theta 160000, YaRN 16 / 65536.
        """

    @staticmethod
    def deepseek_v4_window() -> RopeSpec:
        """DeepSeek-V4 window rows: tail 64 dims, interleaved, theta 10000."""

    @property
    def n_rot(self) -> int: ...

    @property
    def theta(self) -> float: ...

    @property
    def pairing(self) -> str: ...

    @property
    def slice(self) -> str: ...

    @property
    def scaling(self) -> str: ...

    @property
    def factor(self) -> float: ...

    @property
    def attention_factor(self) -> float: ...

    def validate(self, head_dim: int) -> None:
        """
        Raise InvalidArgumentError naming the field when the spec does not fit head_dim.
        """

    def frequencies(self) -> list[float]:
        """The n_rot/2 frequencies (radians per position) as float32 values."""

    def frequencies_f64(self) -> list[float]:
        """The same frequencies in float64."""

    def __repr__(self) -> str: ...

def version() -> str:
    """The library version, e.g. '0.1.0'."""

def cuda_compiled() -> bool:
    """Was this build made with the CUDA backend?"""

def cuda_device_count() -> int:
    """CUDA devices visible (0 without the CUDA backend or a GPU)."""

def rope_apply(x: Tensor, positions: Tensor, rope: RopeSpec, *, apply_attention_factor: bool = True, out: Tensor | None = None, stream: int | Any | None = None) -> Tensor:
    """
    Rotate rows x [tokens, heads, head_dim] (f32/f16/bf16) at positions (int32/int64 [tokens]).
    In place unless out (same shape and dtype) is given; returns the tensor written.
    apply_attention_factor: scale cos/sin by rope.attention_factor (what a model does when it
    writes keys); False for a pure rotation (a shift, an inverse).
    """

def fp8_round_trip_rows(src: Tensor, n_rot: int = 0, *, out: Tensor | None = None, stream: int | Any | None = None) -> Tensor:
    """
    FP8-round the first cols - n_rot dims of each f32 row (E4M3 with one UE8M0 scale per 64),
    copy the n_rot tail. out=src runs in place; out=None returns a new f32 tensor.
    """

def fp8_pack_rows(src: Tensor, n_rot: int = 0, *, codes: Tensor | None = None, scales: Tensor | None = None, tail: Tensor | None = None, tail_dtype: str = 'float16', stream: int | Any | None = None) -> tuple:
    """
    Pack rows src [..., cols] (f32/f16/bf16) into FP8: returns (codes uint8 [..., n_nope],
    scales uint8 [..., ceil(n_nope/64)] UE8M0, tail [..., n_rot] f16/bf16 or None), n_nope = cols - n_rot.
    Pass codes/scales/tail to write into your tensors.
    """

def fp8_unpack_rows(codes: Tensor, scales: Tensor, tail: Tensor | None = None, *, out: Tensor | None = None, dtype: str = 'float32', stream: int | Any | None = None) -> Tensor:
    """
    Decode fp8_pack_rows' output into rows [..., n_nope + n_rot] of dtype (or into out).
    """

def dsv4_pack_rows(src: Tensor, *, out: Tensor | None = None, stream: int | Any | None = None) -> Tensor:
    """
    Pack f32 rows [..., 512] into DeepSeek-V4's 584-byte rows (uint8 [..., 584]): 448 e4m3 codes,
    64 bf16 rope dims, 7 UE8M0 scales, 1 pad byte.
    """

def dsv4_unpack_rows(packed: Tensor, *, out: Tensor | None = None, dtype: str = 'float32', stream: int | Any | None = None) -> Tensor:
    """
    Decode 584-byte DeepSeek-V4 rows into [..., 512] rows of dtype (or into out).
    """

def shift_dense(k: list, v: Tensor, rope: RopeSpec | Sequence[RopeSpec], length: int, n_keep: int, n_discard: int, *, k_scales: Tensor | None = None, stream: int | Any | None = None) -> None:
    """
    Context shift of a dense cache you own, in place, every layer in one call: keep tokens
    [0, n_keep), drop [n_keep, n_keep + n_discard), move later tokens (< length) down by n_discard and
    re-rotate their keys by -n_discard.
    k: list of per-layer K [capacity, n_kv_heads, head_dim] (f32/f16/bf16; uint8 e4m3 codes with
    k_scales; uint8 [capacity, (heads,) 584] DeepSeek-V4 rows without k_scales); v: list of V or None;
    rope: one RopeSpec or one per layer.
    """

def rope_shift_rows(k: Tensor, delta: Tensor, rope: RopeSpec, *, k_scales: Tensor | None = None, stream: int | Any | None = None) -> None:
    """
    Rotate K rows in place, row r by delta[r] (int32) positions (a pure rotation).
    """

def kv_store(src: Tensor, slots: Tensor, pool: Tensor, *, scales: Tensor | None = None, positions: Tensor | None = None, rope: RopeSpec | None = None, stream: int | Any | None = None) -> None:
    """
    Write rows src [n_tokens, n_heads, head_dim] (f32/f16/bf16) into the cells slots (int32 [n_tokens],
    block * block_size + slot; negative skips) of a paged pool [num_blocks, block_size, n_heads, width].
    The pool's dtype picks the format: f32/f16/bf16 rows; uint8 e4m3 codes with scales (UE8M0
    [.., head_dim / 64]); uint8 [.., 584] DeepSeek-V4 rows without scales. positions + rope: rotate each
    row at its position first (rope-stored caches).
    """

def attention_decode(q: Tensor, k: Tensor, v: Tensor, indptr: Tensor, indices: Tensor, last_page_len: Tensor, *, out: Tensor | None = None, k_scale: Tensor | None = None, v_scale: Tensor | None = None, positions: Tensor | None = None, valid: Tensor | None = None, pos_offset: Tensor | None = None, softmax_scale: float = 0.0, sinks: Tensor | None = None, window: int = 0, q_positions: Tensor | None = None, rope_on_read: RopeSpec | None = None, num_splits: int = 0, max_seq_cells: int = 0, workspace: Tensor | None = None, check_tables: bool = True, stream: int | Any | None = None) -> Tensor:
    """
    Decode attention (one query row per sequence) over pages you own:
    q [batch, n_q_heads, head_dim] -> out (same shape).
    k, v: pages [num_blocks, block_size, n_kv_heads, head_dim] (f32/f16/bf16, or uint8 e4m3 codes with
    k_scale / v_scale: UE8M0 [.., head_dim / 64] or f32 [num_blocks, block_size, n_kv_heads]);
    indptr [batch + 1], indices, last_page_len [batch] int32: block tables in CSR form; positions int32
    [num_blocks, block_size] (window, causal, rope_on_read); valid uint8 (None: every cell live);
    pos_offset int32 [batch]; softmax_scale (0: head_dim**-0.5); sinks f32 [n_q_heads]; window: keys with
    q_pos - k_pos < window (0: all); q_positions int32 [n_rows]; rope_on_read: the RopeSpec of keys
    stored unrotated (attention then rotates keys and the unrotated q); workspace: scratch bytes
    (attention_workspace_bytes). One call plans and runs; a PagedCache's plan() serves every layer.
    """

def attention_prefill(q: Tensor, qo_indptr: Tensor, k: Tensor, v: Tensor, indptr: Tensor, indices: Tensor, last_page_len: Tensor, *, out: Tensor | None = None, k_scale: Tensor | None = None, v_scale: Tensor | None = None, positions: Tensor | None = None, valid: Tensor | None = None, pos_offset: Tensor | None = None, softmax_scale: float = 0.0, sinks: Tensor | None = None, window: int = 0, q_positions: Tensor | None = None, rope_on_read: RopeSpec | None = None, num_splits: int = 0, max_seq_cells: int = 0, workspace: Tensor | None = None, check_tables: bool = True, stream: int | Any | None = None) -> Tensor:
    """
    Causal prefill attention over pages you own: q [n_tokens, n_q_heads, head_dim], rows
    qo_indptr[b] .. qo_indptr[b+1] (int32 [batch + 1]) of sequence b at q_positions (required);
    the chunk's own keys must be in the pages already.
    k, v: pages [num_blocks, block_size, n_kv_heads, head_dim] (f32/f16/bf16, or uint8 e4m3 codes with
    k_scale / v_scale: UE8M0 [.., head_dim / 64] or f32 [num_blocks, block_size, n_kv_heads]);
    indptr [batch + 1], indices, last_page_len [batch] int32: block tables in CSR form; positions int32
    [num_blocks, block_size] (window, causal, rope_on_read); valid uint8 (None: every cell live);
    pos_offset int32 [batch]; softmax_scale (0: head_dim**-0.5); sinks f32 [n_q_heads]; window: keys with
    q_pos - k_pos < window (0: all); q_positions int32 [n_rows]; rope_on_read: the RopeSpec of keys
    stored unrotated (attention then rotates keys and the unrotated q); workspace: scratch bytes
    (attention_workspace_bytes). One call plans and runs; a PagedCache's plan() serves every layer.
    """

def attention_dsv4_decode(q: Tensor, window_kv: Tensor, window_len: Tensor, q_positions: Tensor, rope: RopeSpec, *, softmax_scale: float = 0.0, comp_rows: Tensor | None = None, comp_idx: Tensor | None = None, window_index: Tensor | None = None, sinks: Tensor | None = None, num_splits: int = 0, workspace: Tensor | None = None, check_indices: bool = True, out: Tensor | None = None, stream: int | Any | None = None) -> Tensor:
    """
    DeepSeek-V4 sparse decode attention: q [n_rows, n_heads, 512] over the window rows window_kv
    [n_rows (or n_rings with window_index), n_window <= 128, 512] (window_len int32 [n_rows] live) and the
    packed compressed rows comp_rows uint8 [n_comp, 584] picked by comp_idx int32 [n_rows, k] (-1: none);
    the output's rope dims are rotated back by q_positions. softmax_scale 0: 512**-0.5.
    """

def attention_workspace_bytes(n_rows: int, n_q_heads: int, head_dim: int, num_splits: int) -> int:
    """
    Bytes of workspace an attention call with these sizes and split count needs.
    """

class SeqInfo:
    """
    One sequence: live tokens, cells spanned, blocks, last position (-1: empty).
    """

    @property
    def n_live(self) -> int: ...

    @property
    def n_cells(self) -> int: ...

    @property
    def n_blocks(self) -> int: ...

    @property
    def last_position(self) -> int: ...

    def __repr__(self) -> str: ...

class PagedStats:
    """Pool and sequence counts of a PagedCache."""

    @property
    def sequences(self) -> int: ...

    @property
    def blocks_total(self) -> int: ...

    @property
    def blocks_used(self) -> int: ...

    @property
    def blocks_free(self) -> int: ...

    @property
    def blocks_shared(self) -> int: ...

    @property
    def bytes_per_block(self) -> int: ...

    @property
    def bytes_total(self) -> int: ...

    @property
    def bytes_used(self) -> int: ...

    @property
    def tokens_live(self) -> int: ...

    @property
    def tokens_dead(self) -> int: ...

    @property
    def cells_pending(self) -> int: ...

    def __repr__(self) -> str: ...

class PoolSpec:
    """
    One pool array a PagedCache needs (PagedCache.pool_specs): its layer, part ('k',
    'k_scales', 'v', 'v_scales'), shape [num_blocks + 1, block_size, n_kv_heads, width],
    dtype (as torch names it; uint8 also serves for float8_e4m3fn) and size in bytes.
    """

    @property
    def layer(self) -> int: ...

    @property
    def part(self) -> str: ...

    @property
    def shape(self) -> tuple: ...

    @property
    def dtype(self) -> str: ...

    @property
    def bytes(self) -> int: ...

    def __repr__(self) -> str: ...

class Ticket:
    """
    Cells reserved for one step's new tokens (PagedCache.reserve). Store each layer with
    PagedCache.store(ticket, layer, k, v); stale once one of its sequences changes again.
    Pass it back as reserve(..., reuse=ticket) so a decode loop allocates nothing per step.
    """

    def __init__(self) -> None:
        """An empty ticket, to be filled by reserve(..., reuse=ticket)."""

    @property
    def seqs(self) -> list[int]: ...

    @property
    def counts(self) -> list[int]: ...

    @property
    def positions(self) -> list[int]:
        """The tokens' positions, as given to reserve()."""

    @property
    def n_tokens(self) -> int: ...

    @property
    def slots(self) -> list[int]:
        """Cell ids (block * block_size + slot), one per token (a host copy)."""

class AttentionPlan:
    """
    Attention over one step's batch, made by PagedCache.plan(): block tables, query
    positions and options computed once; run(layer, q) once per layer. Stale (run raises)
    once the cache's sequences change; holds a reference to its cache.
    """

    def run(self, layer: int, q: Tensor, *, out: Tensor | None = None, stream: int | Any | None = None) -> Tensor:
        """
        Attention of q [n_rows, n_q_heads, head_dim] (f32/f16/bf16; rows in the plan's order, rotated
        already unless the cache is rope_mode='on_read', where kvcore rotates q at its position) over
        layer's pages. Writes out ([n_rows, n_q_heads, v_head_dim]; any of f32/f16/bf16) or returns a
        new tensor like q of that shape.
        """

    @property
    def batch(self) -> int: ...

    @property
    def n_rows(self) -> int: ...

    @property
    def prefill(self) -> bool: ...

    @property
    def softmax_scale(self) -> float: ...

    @property
    def is_stale(self) -> bool: ...

class PagedCache:
    """
    A paged KV cache for many sequences, on the CPU or one CUDA device.

    Per layer a K pool and a V pool of fixed-size blocks; sequences own lists of blocks, shared by
    fork() and copied on write. Every call checks its arguments first and raises kvcore.Error (a
    ValueError, MemoryError, ... subclass) naming the bad one; the cache is then unchanged.

    A decode step:
        cache = kvcore.PagedCache(n_layers=32, n_kv_heads=8, head_dim=128, num_blocks=4096,
                                  k_format="fp8", rope=kvcore.RopeSpec.llama3_8b(), rope_mode="on_read")
        seq = cache.create()
        ticket = cache.reserve(seq, [pos])            # cells for this step's tokens
        plan = cache.plan(ticket)                     # block tables + options, once per step
        for layer in range(32):
            cache.store(ticket, layer, k, v)          # k, v: [n_tokens, n_kv_heads, head_dim]
            out = plan.run(layer, q)                  # q: [n_tokens, n_q_heads, head_dim]

    Edits: fork(seq) shares every block (copy on write), truncate(seq, n) rolls back,
    shift(seq, n_keep, n_discard) drops a range and moves later tokens down (metadata only in
    rope_mode='on_read'), erase(seq) frees. Tensors are any object with __dlpack__ (numpy, torch)
    on the cache's device; they are used in place, never copied. Views of the pools
    (k_pool(layer), ...) keep the cache alive.
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int, *, rope: RopeSpec | Sequence[RopeSpec], v_head_dim: int | None = None, block_size: int = 16, k_format: str = 'f16', v_format: str | None = None, rope_mode: str = 'stored', strict_positions: bool = True, kvcore_attention: bool = True, v_from_k_latent: bool = False, device: str | int = 'cpu', stream: int | Any | None = None, pools: Sequence[Tensor] | None = None) -> None:
        """
        Allocate the pools: num_blocks blocks of block_size cells per layer.
        rope: a RopeSpec (or one per layer); k_format/v_format: 'f32', 'f16', 'bf16', 'fp8' (e4m3 + one
        UE8M0 scale per 64 dims); v_head_dim 0: no V pools; rope_mode 'stored' (K rotated when written)
        or 'on_read' (K stored unrotated, rotated by attention; shift() moves no byte);
        strict_positions: positions must increase along a sequence; kvcore_attention: refuse at once
        formats kvcore's attention cannot read (False: pages for an engine's own attention);
        v_from_k_latent: MLA's shared layout -- no V pools, V is the first v_head_dim dims of each K
        row (K's format and scales); append/store then take K only (v=None);
        device 'cpu' or 'cuda:N';
        stream: the CUDA stream of the construction (default: torch's current stream); every later
        call runs on its own stream= or, without one, on torch's current stream at the call;
        pools: pool memory the caller allocated (so its allocator accounts for it): one tensor per
        array of PagedCache.pool_specs(...) with the same arguments, in that order, each of exactly
        that shape and dtype (uint8 also for float8_e4m3fn), contiguous, 16-byte aligned, on the
        cache's device. The cache zeroes them, writes only through them and keeps them alive.
        """

    @staticmethod
    def pool_specs(n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int, *, rope: RopeSpec | Sequence[RopeSpec], v_head_dim: int | None = None, block_size: int = 16, k_format: str = 'f16', v_format: str | None = None, rope_mode: str = 'stored', strict_positions: bool = True, kvcore_attention: bool = True, v_from_k_latent: bool = False) -> list[PoolSpec]:
        """
        The pool arrays a cache of this configuration needs (PoolSpec list, in the order
        PagedCache(..., pools=) takes them): per layer k, k_scales (fp8 K), v (v_head_dim > 0 and
        not v_from_k_latent),
        v_scales (fp8 V). An engine allocates them itself, e.g.
            pools = [torch.empty(s.shape, dtype=getattr(torch, s.dtype), device='cuda') for s in specs]
        Each has num_blocks + 1 blocks: the last is the cache's zero block (never write it).
        """

    @property
    def pools(self) -> tuple[Tensor, ...] | None:
        """
        The caller's pool tensors given to the constructor (a tuple), or None when the cache allocated them.
        """

    def create(self) -> int:
        """A new empty sequence; returns its id."""

    def fork(self, seq: int, *, stream: int | Any | None = None) -> int:
        """
        A new sequence sharing every block of seq (copied on first write); returns its id.
        """

    def erase(self, seq: int, *, stream: int | Any | None = None) -> None:
        """Free a sequence (blocks shared with others stay)."""

    def append(self, seq: int, positions: Tensor, k: Tensor, v: Tensor | None = None, *, stream: int | Any | None = None) -> None:
        """
        Append n tokens to every layer at once: positions (n ints), k [n_layers, n, n_kv_heads, head_dim],
        v [n_layers, n, n_kv_heads, v_head_dim] (None without V), f32/f16/bf16 on the cache's device.
        """

    def reserve(self, seqs: int | Sequence[int], positions: Tensor, counts: Sequence[int] | None = None, *, reuse: Ticket | None = None, stream: int | Any | None = None) -> Tensor:
        """
        Reserve cells for new tokens: counts[i] tokens of seqs[i] (distinct ids; seqs may be one int,
        then counts defaults to len(positions)); positions concatenated in that order. The tokens are
        live at once; store() writes them layer by layer. reuse: refill this Ticket (no allocation).
        """

    def store(self, ticket: Ticket, layer: int, k: Tensor, v: Tensor | None = None, *, stream: int | Any | None = None) -> None:
        """
        Write one layer of the ticket's tokens: k [n_tokens, n_kv_heads, head_dim], v [n_tokens,
        n_kv_heads, v_head_dim] (f32/f16/bf16; rotated at their positions in rope_mode='stored').
        """

    def store_layers(self, ticket: Ticket, k: Tensor, v: Tensor | None = None, *, stream: int | Any | None = None) -> None:
        """
        Write every layer of the ticket's tokens at once (one launch on CUDA; the same bytes as store()
        per layer): k [n_layers, n_tokens, n_kv_heads, head_dim], v [n_layers, n_tokens, n_kv_heads,
        v_head_dim] (f32/f16/bf16; K rotated at its positions in rope_mode='stored').
        """

    def shift(self, seq: int, n_keep: int, n_discard: int, *, stream: int | Any | None = None) -> None:
        """
        Context shift: keep tokens [0, n_keep), drop [n_keep, n_keep + n_discard); later tokens move down
        by n_discard positions (metadata only in rope_mode='on_read'; rotations deferred to prepare()
        in 'stored').
        """

    def blocks_needed(self, seqs: int | Sequence[int], counts: object) -> int:
        """
        Free blocks reserve(seqs, ..., counts) would take (new blocks plus copies of shared tails).
        """

    def can_fit(self, seqs: int | Sequence[int], counts: object) -> bool:
        """Whether the pool has the blocks reserve(seqs, ..., counts) would take."""

    def remove_positions(self, seq: int, p0: int, p1: int | None = None, *, stream: int | Any | None = None) -> None:
        """
        Drop every token of seq whose position p has p0 <= p < p1 (None: to the end); llama.cpp's seq_rm.
        """

    def add_positions(self, seq: int, p0: int, p1: int | None, delta: int, *, stream: int | Any | None = None) -> None:
        """
        Add delta to the positions of seq's tokens with p0 <= p < p1 (None: to the end); llama.cpp's
        seq_add. Rope-stored keys are re-rotated at the next prepare(); rope-on-read: metadata only.
        """

    def truncate(self, seq: int, n: int, *, stream: int | Any | None = None) -> None:
        """Keep the first n tokens (speculative-decoding rollback)."""

    def prepare(self, *, stream: int | Any | None = None) -> None:
        """
        Apply what shifts left pending (rotations, position offsets). plan() and read() need no call.
        """

    @property
    def needs_prepare(self) -> bool: ...

    def plan(self, ticket_or_seqs: Ticket | int | Sequence[int], q_positions: Tensor | None = None, *, softmax_scale: float | None = None, window: int = 0, sinks: Tensor | None = None, num_splits: int = 0, check_tables: bool = True, stream: int | Any | None = None) -> AttentionPlan:
        """
        Plan this step's attention. With a Ticket: its sequences, one query row per reserved token
        (decode when every count is 1, else causal prefill), at the tokens' positions. With seq ids:
        one query row each, at q_positions (default: each sequence's last position).
        softmax_scale: default head_dim**-0.5; window: sliding window (0: none); sinks: f32 [n_q_heads].
        """

    def read(self, seq: int, layer: int, *, stream: int | Any | None = None) -> tuple:
        """
        Host copy of one layer of a sequence as numpy: (positions int32 [n], k float32 [n, heads, head_dim]
        rotated at current positions, v float32 [n, heads, v_head_dim] or None).
        """

    def block_tables(self, seqs: int | Sequence[int], offsets: bool = False, *, stream: int | Any | None = None) -> dict:
        """
        Host copies (numpy int32) of the CSR block tables of seqs: a dict with indptr, indices,
        last_page_len, pos_offset (key position = positions[cell] - pos_offset[b]; 0 unless offsets=True).
        """

    def positions(self, *, framework: str | None = None) -> Tensor:
        """
        View (no copy) of the stored positions, int32 [num_blocks, block_size]; token positions after
        prepare(). framework: 'numpy' (CPU), 'torch' or 'dlpack'; default numpy on CPU, torch on CUDA.
        """

    def valid(self, *, framework: str | None = None) -> Tensor:
        """View of the cell validity bytes, uint8 [num_blocks, block_size]."""

    def k_pool(self, layer: int, *, framework: str | None = None) -> Tensor:
        """
        View (no copy; keeps the cache alive) of layer's K pool [num_blocks, block_size, n_kv_heads,
        head_dim]; FP8 pools are uint8 codes (torch: float8_e4m3fn).
        """

    def v_pool(self, layer: int, *, framework: str | None = None) -> Tensor:
        """View of layer's V pool (None without V)."""

    def k_scales(self, layer: int, *, framework: str | None = None) -> Tensor:
        """
        View of layer's K scale bytes (UE8M0 [num_blocks, block_size, n_kv_heads, head_dim / 64]) of an
        FP8 pool, else None.
        """

    def v_scales(self, layer: int, *, framework: str | None = None) -> Tensor:
        """View of layer's V scale bytes, or None."""

    def stats(self) -> PagedStats:
        """Pool and sequence counts."""

    def info(self, seq: int) -> SeqInfo:
        """One sequence's counts."""

    def __contains__(self, seq: int) -> bool: ...

    def sequences(self) -> list[int]:
        """Ids of every live sequence."""

    def debug_state(self) -> str:
        """Canonical text of all host metadata (tests compare it)."""

    @property
    def n_layers(self) -> int: ...

    @property
    def n_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def v_head_dim(self) -> int: ...

    @property
    def v_from_k_latent(self) -> bool:
        """
        True: no V pools; V is the first v_head_dim dims of each K row (MLA's shared layout).
        """

    @property
    def block_size(self) -> int: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def k_format(self) -> str: ...

    @property
    def v_format(self) -> str: ...

    @property
    def rope_mode(self) -> str: ...

    @property
    def rope(self) -> list[RopeSpec]: ...

    @property
    def device(self) -> str: ...

    def __repr__(self) -> str: ...

    def save(self, path: str | os.PathLike[str], model_id: str | bytes, seqs: int | Sequence[int] | None = None) -> None:
        """
        Save seqs (default: every sequence) to path, atomically (a temporary file, fsync, rename).
        model_id (str or bytes) names what made the K/V (model, revision, dtype); load() must give the same.
        """

    def load(self, path: str | os.PathLike[str], model_id: str | bytes, *, position_delta: int = 0) -> dict:
        """
        Load a snapshot's sequences as new sequences; returns {saved id: new id}. Checks everything
        before the cache is touched: CorruptError (truncated or altered file), InvalidArgumentError
        (another layout or model_id), OutOfMemoryError (too few free blocks); the cache is then
        unchanged. position_delta (rope_mode='on_read' only) moves every loaded position.
        """

    def snapshot(self, model_id: str | bytes, seqs: int | Sequence[int] | None = None) -> bytes:
        """
        The snapshot of seqs (default: every sequence) as bytes (the file format of save()).
        """

    def restore(self, data: bytes, model_id: str | bytes, *, position_delta: int = 0) -> dict:
        """load() from bytes made by snapshot(); the same checks and result."""

    @property
    def layout_fingerprint(self) -> str:
        """
        What makes this cache's bytes meaningful (formats, dims, block size, RoPE): a snapshot
        loads only into a cache with the same text.
        """

    @property
    def layout_hash(self) -> int:
        """
        The 64-bit hash of layout_fingerprint: the layout part of every StoreKey of this cache.
        """

class Dsv4Compressor:
    """
    Geometry of one DeepSeek-V4 compressor: head_dim, n_rot, ratio, overlap, kind
    ('attention' or 'indexer'). Presets: csa(), hca(), indexer().
    """

    @staticmethod
    def csa(head_dim: int = 512, n_rot: int = 64, ratio: int = 4) -> Dsv4Compressor: ...

    @staticmethod
    def hca(head_dim: int = 512, n_rot: int = 64, ratio: int = 128) -> Dsv4Compressor: ...

    @staticmethod
    def indexer(head_dim: int = 128, n_rot: int = 64, ratio: int = 4) -> Dsv4Compressor: ...

    @property
    def head_dim(self) -> int: ...

    @head_dim.setter
    def head_dim(self, arg: int, /) -> None: ...

    @property
    def n_rot(self) -> int: ...

    @n_rot.setter
    def n_rot(self, arg: int, /) -> None: ...

    @property
    def ratio(self) -> int: ...

    @ratio.setter
    def ratio(self, arg: int, /) -> None: ...

    @property
    def overlap(self) -> bool: ...

    @overlap.setter
    def overlap(self, arg: bool, /) -> None: ...

    @property
    def eps(self) -> float: ...

    @eps.setter
    def eps(self, arg: float, /) -> None: ...

    @property
    def kind(self) -> str: ...

    @property
    def width(self) -> int: ...

    @property
    def state_rows(self) -> int: ...

    @property
    def packed_row_bytes(self) -> int: ...

def dsv4_kv_finalize(kv: Tensor, raw_ring: Tensor, first_raw_row: int, n_rot: int = 64, *, quant: bool = True, stream: int | Any | None = None) -> None:
    """
    Decode KV finalizer: kv [n, head_dim] f32 (RoPE applied) FP8-rounded in place on its nope dims
    (quant), row i stored into raw_ring [R, head_dim] (f32/f16) at (first_raw_row + i) % R.
    """

def dsv4_compressor_store_one(c: Tensor, z: Tensor, ape: Tensor, state_kv: Tensor, state_score: Tensor, pos: int, comp: Dsv4Compressor, *, stream: int | Any | None = None) -> None:
    """
    Store token pos (c, z: [width] f32) into a compressor state [state_rows, width].
    """

def dsv4_compressor_shift(state_kv: Tensor, state_score: Tensor, comp: Dsv4Compressor, *, stream: int | Any | None = None) -> None:
    """Overlapping compressors: rows m..2m-1 of the state become rows 0..m-1."""

def dsv4_compressor_reset(state_kv: Tensor, state_score: Tensor, comp: Dsv4Compressor, *, stream: int | Any | None = None) -> None:
    """Reset a compressor state: kv 0, scores -inf."""

def dsv4_compressor_emit(state_kv: Tensor, state_score: Tensor, comp: Dsv4Compressor, ape: Tensor, norm_weight: Tensor, rope: RopeSpec, window: int, rows: Tensor, *, quant: bool = True, stream: int | Any | None = None) -> None:
    """
    Emit compressed row `window` into rows ([cap, head_dim] f32 or [cap, packed_row_bytes] uint8):
    softmax pool over the state, RMSNorm (norm_weight), RoPE at window * ratio, FP8 / FP4 when quant.
    """

def dsv4_compress_prefill(c: Tensor, z: Tensor, state_kv: Tensor, state_score: Tensor, start_pos: int, comp: Dsv4Compressor, ape: Tensor, norm_weight: Tensor, rope: RopeSpec, rows: Tensor, *, quant: bool = True, stream: int | Any | None = None) -> None:
    """
    Compress tokens start_pos .. start_pos + n - 1 (c, z: [n, width] f32): emit every window that
    completes into rows and leave the state as storing them one by one would.
    """

def dsv4_indexer_topk(q: Tensor, weights: Tensor, index_rows: Tensor, n_rows: int, first_query_pos: int, ratio: int, k: int, *, quant: bool = True, scores: Tensor | None = None, out: Tensor | None = None, stream: int | Any | None = None) -> tuple:
    """
    Lightning indexer: scores I(t, s) = sum_h w_h relu(q_h . k_s) over visible rows s < (t + 1) / ratio,
    and the k best rows per query (best first, -1 past the visible ones). Returns (top int32 [n_q, k],
    scores f32 [n_q, cap]).
    """

class Dsv4Cache:
    """
    The KV cache of DeepSeek-V4 attention, per sequence and layer: the raw window ring,
    compressor and indexer states, compressed rows (packed 584-byte FP8) and indexer rows
    (packed FP4). The engine computes the projections and hands them to append();
    read_window / read_compressed / read_indexer give host copies as float32.

        cache = kvcore.Dsv4Cache.v4_flash(max_context=4096)
        cache.set_weights(layer, comp_ape, comp_norm, idx_ape, idx_norm)
        cache.append(seq, layer, pos, kv, comp_c, comp_z, idx_c, idx_z)
    """

    def __init__(self, layers: Sequence[str], *, head_dim: int = 512, n_rot: int = 64, window: int = 128, csa_ratio: int = 4, hca_ratio: int = 128, index_heads: int = 64, index_dim: int = 128, index_topk: int = 512, max_context: int = 65536, max_seqs: int = 1, quant: bool = True, packed: bool = True, device: str | int = 'cpu', stream: int | Any | None = None) -> None:
        """
        layers: one of 'window', 'csa', 'hca' per layer; quant: FP8/FP4 storage as DeepSeek-V4's engine
        (False: f32 math, as HF computes); packed: 584-byte / FP4 rows where the geometry has them;
        stream: the CUDA stream of every cache operation (default: torch's current stream).
        """

    @staticmethod
    def v4_flash(max_context: int, max_seqs: int = 1, device: str | int = 'cpu', stream: int | Any | None = None) -> Dsv4Cache:
        """DeepSeek-V4-Flash's 43-layer schedule."""

    @staticmethod
    def v4_pro(max_context: int, max_seqs: int = 1, device: str | int = 'cpu', stream: int | Any | None = None) -> Dsv4Cache:
        """DeepSeek-V4-Pro's 61-layer schedule."""

    @property
    def n_layers(self) -> int: ...

    def kind(self, layer: int) -> str: ...

    @property
    def raw_row_bytes(self) -> int: ...

    @property
    def compressed_row_bytes(self) -> int: ...

    @property
    def indexer_row_bytes(self) -> int: ...

    @property
    def device(self) -> str: ...

    def compressor(self, layer: int) -> Dsv4Compressor:
        """The attention compressor geometry of a CSA or HCA layer."""

    def indexer(self) -> Dsv4Compressor:
        """The indexer compressor geometry."""

    def set_weights(self, layer: int, comp_ape: Tensor | None = None, comp_norm: Tensor | None = None, idx_ape: Tensor | None = None, idx_norm: Tensor | None = None) -> None:
        """
        Copy one layer's compressor weights: comp_ape [ratio, width], comp_norm [head_dim] (CSA/HCA);
        idx_ape [4, 2 * index_dim], idx_norm [index_dim] (CSA).
        """

    def create(self) -> int:
        """A new empty sequence (at most max_seqs live); returns its id."""

    def erase(self, seq: int) -> None:
        """Free a sequence."""

    def __contains__(self, seq: int) -> bool: ...

    def sequences(self) -> list[int]:
        """Ids of every live sequence."""

    def truncate(self, seq: int, n: int) -> None:
        """Keep the first n tokens in every layer (0 empties the sequence)."""

    def debug_state(self) -> str:
        """Canonical text of the cache's host state (tests compare it)."""

    def append(self, seq: int, layer: int, pos: int, kv: Tensor, comp_c: Tensor | None = None, comp_z: Tensor | None = None, idx_c: Tensor | None = None, idx_z: Tensor | None = None) -> None:
        """
        Append tokens pos .. pos + n - 1 (pos == length(seq, layer)): kv [n, head_dim] f32 (RoPE applied;
        FP8-rounded in place when quantized), comp_c / comp_z [n, width] (CSA/HCA), idx_c / idx_z
        [n, 2 * index_dim] (CSA).
        """

    def length(self, seq: int, layer: int) -> int: ...

    def compressed_rows(self, seq: int, layer: int) -> int: ...

    def indexer_rows(self, seq: int, layer: int) -> int: ...

    def raw_ring(self, seq: int, layer: int, *, framework: str | None = None) -> Tensor:
        """
        View (keeps the cache alive) of the raw window ring [window, head_dim]; position p at p % window.
        """

    def compressed_store(self, seq: int, layer: int, *, framework: str | None = None) -> Tensor:
        """
        View of the compressed row store ([cap, 584] uint8 or [cap, head_dim] f32).
        """

    def indexer_store(self, seq: int, layer: int, *, framework: str | None = None) -> Tensor:
        """View of the indexer row store."""

    def read_window(self, seq: int, layer: int) -> Tensor:
        """Host copy float32 [min(length, window), head_dim], oldest first."""

    def read_compressed(self, seq: int, layer: int) -> Tensor:
        """Host copy float32 [compressed_rows, head_dim]."""

    def read_indexer(self, seq: int, layer: int) -> Tensor:
        """
        Host copy float32 [indexer_rows, index_dim] (Hadamard domain if quantized).
        """

    def indexer_topk(self, seq: int, layer: int, q: Tensor, weights: Tensor, first_query_pos: int, scores: Tensor, out: Tensor) -> None:
        """dsv4_indexer_topk over this sequence's indexer rows of a CSA layer."""

    def shift(self, seq: int, n_keep: int, n_discard: int) -> None:
        """
        Context shift (docs/specs/dsv4-context-shift.md): drops tokens [n_keep, n_keep + n_discard),
        re-rotates what follows. InvalidArgumentError for a bad range or counts off shift_granule;
        NotSupportedError when the kept tail is shorter than the window of a longer sequence.
        """

    @property
    def allocated_bytes(self) -> int: ...

    def save(self, seq: int, path: str | os.PathLike[str], model_id: str | bytes) -> None:
        """
        Save one sequence (every layer's window ring, compressor and indexer states and rows) to path.
        """

    def load(self, seq: int, path: str | os.PathLike[str], model_id: str | bytes) -> None:
        """
        Load a saved sequence into seq, which must be empty (truncate(seq, 0) first). Checked before
        anything is written; on a refusal the cache is unchanged.
        """

    def snapshot(self, seq: int, model_id: str | bytes) -> bytes:
        """save() as bytes."""

    def restore(self, seq: int, data: bytes, model_id: str | bytes) -> None:
        """load() from bytes made by snapshot()."""

def snapshot_inspect(source: str | os.PathLike[str] | bytes) -> dict:
    """
    Check a snapshot (a path or its bytes) as a load would, without a cache, and describe it: a dict
    with the format version, kind ('paged' or 'dsv4'), fingerprint, model_id, block counts and per
    sequence saved id, length and positions. Raises CorruptError / InvalidArgumentError.
    """

def snapshot_describe(source: str | os.PathLike[str] | bytes) -> str:
    """
    snapshot_inspect() as readable text (what `kvcore snapshot inspect FILE` prints).
    """

class PrefixStats:
    """Counts of a PrefixCache."""

    @property
    def queries(self) -> int: ...

    @property
    def hit_queries(self) -> int: ...

    @property
    def blocks_hit(self) -> int: ...

    @property
    def blocks_missed(self) -> int: ...

    @property
    def blocks_published(self) -> int: ...

    @property
    def holders(self) -> int: ...

    @property
    def evictions(self) -> int: ...

    def __repr__(self) -> str: ...

class PrefixCache:
    """
    Reuse of full blocks whose K/V came from the same tokens (automatic prefix caching) on one
    PagedCache. A block's key chains the hashes of every earlier block's tokens, under a salt that
    names what else changes K/V or who may see it (model, adapter, tenant): equal salts share,
    others never do.

        prefix = kvcore.PrefixCache(cache)
        seq, reused = prefix.create(prompt, salt='tenant-a')   # reused tokens: full blocks
        cache.append(seq, range(reused, len(prompt)), k, v)     # the rest of the prompt
        prefix.publish(seq, prompt, salt='tenant-a')           # later prompts can reuse it

    Edit its sequences through shift/truncate here (or report them with note_edit): only the
    unedited prefix is published. Published blocks stay cached until evict(). Keeps its cache alive.
    """

    def __init__(self, cache: PagedCache, seed: int = 0) -> None:
        """seed 0: a random hash seed (nobody outside can precompute collisions)."""

    def create(self, prompt: Sequence[int], salt: str | bytes = '') -> tuple:
        """
        A new sequence holding the longest cached prefix of prompt (token ids) in full blocks;
        returns (seq, reused_tokens). Append the rest of the prompt from token reused_tokens.
        """

    def publish(self, seq: int, tokens: Sequence[int], salt: str | bytes = '') -> int:
        """
        Publish the full blocks of seq's unedited prefix (tokens[i]: the id of its token i); returns the
        tokens now published.
        """

    def shift(self, seq: int, n_keep: int, n_discard: int) -> None:
        """PagedCache.shift, keeping [0, n_keep) publishable."""

    def truncate(self, seq: int, n: int) -> None:
        """PagedCache.truncate, keeping [0, n) publishable."""

    def note_edit(self, seq: int, first_token: int) -> None:
        """Report an edit made elsewhere from token first_token on."""

    def erase(self, seq: int) -> None:
        """Erase a sequence (its published blocks stay cached)."""

    def evict(self, free_blocks: int) -> bool:
        """
        Drop least recently used cached prefixes until the cache has free_blocks free; True when it has.
        """

    def clear(self) -> None:
        """Drop every cached prefix."""

    def stats(self) -> PrefixStats:
        """Query, hit and publish counts."""

    def holds(self, seq: int) -> bool:
        """
        Whether seq is one of the sequences that keep published prefixes cached.
        """

    @property
    def cache(self) -> PagedCache:
        """The PagedCache."""

class StoreKey:
    """
    The key of a value in a store: a 128-bit content hash (what the bytes hold, e.g. a token
    prefix under a salt) and the 64-bit layout hash of the cache that made them
    (PagedCache.layout_hash), so one store serves many layouts without mixing them.
    """

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, content_hi: int, content_lo: int, layout: int) -> None:
        """A key from its three parts (unsigned 64-bit ints)."""

    @staticmethod
    def for_tokens(cache: PagedCache, tokens: Sequence[int], salt: str | bytes = '') -> StoreKey:
        """
        The key of the K/V of `tokens` (token ids) in `cache`'s layout under `salt` (model, adapter,
        tenant: str or bytes): XXH3-128 of the salt and the ids. Equal tokens, salts and layouts give
        equal keys.
        """

    @property
    def content_hi(self) -> int: ...

    @property
    def content_lo(self) -> int: ...

    @property
    def layout(self) -> int: ...

    def hex(self) -> str:
        """
        48 hex digits: layout, content hi, content lo (the name stores give the value).
        """

    def __eq__(self, arg: object, /) -> bool: ...

    def __hash__(self) -> int: ...

    def __repr__(self) -> str: ...

class StoreStats:
    """Counts of a KvStore (of the whole chain for a TieredStore)."""

    @property
    def puts(self) -> int:
        """put() calls that stored."""

    @property
    def put_failures(self) -> int:
        """put() calls that did not (full, down, I/O error)."""

    @property
    def hits(self) -> int: ...

    @property
    def misses(self) -> int: ...

    @property
    def rejected(self) -> int:
        """Values found but refused by the seal check (misses too)."""

    @property
    def evictions(self) -> int:
        """Values dropped for the size limit."""

    @property
    def items(self) -> int: ...

    @property
    def bytes(self) -> int:
        """Sealed bytes held now, where the store knows."""

    @property
    def down(self) -> bool:
        """A lost connection the store is waiting to retry."""

    @property
    def reconnects(self) -> int: ...

    def __repr__(self) -> str: ...

class KvStore:
    """
    A store of sealed values keyed by StoreKey (HostStore, DiskStore, TieredStore, RedisStore). A
    store is a cache: it may drop anything at any time. Every read opens the value's seal (size,
    header, key, XXH3 checksum): a damaged value is a miss, never wrong bytes. Tier trouble (a full
    disk, a lost connection) is a failed put or a miss, not an exception.
    """

    @property
    def name(self) -> str:
        """'host', 'disk', 'tiered' or 'redis'."""

    def put(self, key: StoreKey, data: bytes) -> bool:
        """Store data (bytes) under key; True when stored."""

    def get(self, key: StoreKey) -> bytes | None:
        """
        The bytes stored under key, checked; None on a miss or a refused value.
        """

    def contains(self, key: StoreKey) -> bool:
        """
        Whether a value is stored under key (not checked: a later get may still miss).
        """

    def __contains__(self, arg: StoreKey, /) -> bool: ...

    def remove(self, key: StoreKey) -> bool:
        """Drop the value under key; True when there was one."""

    def stats(self) -> StoreStats:
        """Counts (StoreStats)."""

class HostStore(KvStore):
    """
    Host memory: an LRU map bounded by max_bytes of sealed values (a larger value is
    refused).
    """

    def __init__(self, max_bytes: int) -> None:
        """An empty store of at most max_bytes (> 0)."""

class DiskStore(KvStore):
    """
    A local disk directory: one file per value, written to a temporary file, fsync'ed and renamed
    (a reader never sees half a value). Bounded by max_bytes, least recently used files first; a full
    disk fails the put and leaves the files already there readable.
    """

    def __init__(self, dir: str | os.PathLike[str], max_bytes: int, *, fsync_each_put: bool = True) -> None:
        """
        Values under dir (created if missing; the files already there are kept and counted).
        """

    def path_of(self, key: StoreKey) -> str:
        """The file that holds key's value."""

class TieredStore(KvStore):
    """
    Tiers in order, fastest first (the first a HostStore, e.g. HostStore, DiskStore, RedisStore).
    put() stores into the first tier; what its limit evicts a worker thread writes to every lower
    tier (the caller never waits for a slow one; past max_queue_bytes waiting, the oldest moves are
    dropped). get() tries the tiers in order and copies a lower hit back into the first. Keeps its
    tiers alive.
    """

    def __init__(self, tiers: Sequence[KvStore], *, max_queue_bytes: int = 1073741824) -> None:
        """
        A chain over tiers (a sequence of KvStore objects, the first a HostStore).
        """

    @property
    def tiers(self) -> tuple[KvStore, ...]:
        """The tiers, in order."""

    def flush(self) -> None:
        """Wait until the worker has moved everything queued so far."""

    @property
    def dropped_moves(self) -> int:
        """Moves dropped because the queue was full."""

    def tier_hits(self, tier: int) -> int:
        """Hits served by tiers[tier]."""

class RedisStore(KvStore):
    """
    A Redis (or Valkey) server through hiredis. The server is not trusted: AUTH with password,
    every value's size, header and checksum checked before use. A lost connection or timeout marks
    the store down (misses at once) until a retry after a doubling backoff. Connects lazily.
    """

    def __init__(self, host: str = '127.0.0.1', port: int = 6379, *, password: str | bytes = '', key_prefix: str | bytes = 'kvc:1:', connect_timeout_ms: int = 500, io_timeout_ms: int = 1000, max_value_bytes: int = 67108864, backoff_initial_ms: int = 50, backoff_max_ms: int = 2000, ttl_seconds: int = 0) -> None:
        """
        A store on the server at host:port (keys <key_prefix><StoreKey.hex()>; ttl_seconds 0: no expiry).
        """

    def ping(self) -> bool:
        """Whether a connection is up now (connecting when the backoff allows)."""

def redis_compiled() -> bool:
    """
    Whether this build has kvcore.RedisStore (kvcore was built with hiredis).
    """

class OffloadStats:
    """Counts of a BlockOffloader."""

    @property
    def offloads(self) -> int:
        """Values copied into pinned memory."""

    @property
    def refused(self) -> int:
        """offload() calls whose value was larger than the whole arena."""

    @property
    def pinned_hits(self) -> int: ...

    @property
    def lower_hits(self) -> int: ...

    @property
    def misses(self) -> int: ...

    @property
    def demoted(self) -> int:
        """Values the worker moved to the lower store."""

    @property
    def demote_failures(self) -> int:
        """Values the lower store refused."""

    @property
    def dropped(self) -> int:
        """Evicted values dropped (no lower store, or its queue full)."""

    @property
    def entries(self) -> int:
        """Values in pinned memory now."""

    @property
    def pinned_used(self) -> int:
        """Arena bytes in use now."""

    @property
    def holders(self) -> int:
        """Holder sequences alive now (CUDA copies in flight)."""

    def __repr__(self) -> str: ...

class BlockOffloader:
    """
    A PagedCache's sequences copied to pinned host memory and back (the device and pinned-host tiers),
    with a KvStore below for what pinned memory evicts.

        lower = kvcore.TieredStore([kvcore.HostStore(8 << 30), kvcore.DiskStore('/var/kv', 200 << 30)])
        off = kvcore.BlockOffloader(cache, pinned_bytes=4 << 30, lower=lower, model_id='llama-3-8b')
        key = kvcore.StoreKey.for_tokens(cache, prompt, salt='tenant-a')
        off.offload(seq, key); cache.erase(seq)          # blocks free at once, bytes kept
        seq = off.load(key)                               # a new sequence, or None on a miss

    On CUDA offload() queues the copy on a side stream after the work already queued on `stream` and
    returns at once (a holder sequence keeps the blocks until the copy ran); load() copies on
    `stream` after the value's own offload copy. The least recently used values go down to `lower`
    through two worker threads (the caller never waits for a slow tier); a value of another model_id
    or failing its checksums is a miss, never wrong K/V. On the CPU every call is synchronous.
    Keeps its cache and lower store alive; calls must not overlap calls on the cache.
    """

    def __init__(self, cache: PagedCache, *, pinned_bytes: int = 1073741824, lower: KvStore | None = None, model_id: str | bytes = '', max_queue_bytes: int = 1073741824) -> None:
        """
        pinned_bytes: the arena (values and their block lists; pinned with cudaHostAlloc on CUDA).
        lower: a KvStore for what the arena evicts (None: evicted values are dropped).
        model_id (str or bytes): recorded in every value; a value of another model is a miss.
        max_queue_bytes: values copied out, waiting for `lower`; past it the oldest are dropped.
        """

    def offload(self, seq: int, key: StoreKey, *, stream: int | Any | None = None) -> bool:
        """
        Start copying seq (every layer, K and V, scales) into pinned memory under key (key.layout must
        be the cache's layout_hash). True when the value is (or already was) there; False when it is
        larger than the whole arena. The sequence stays as it was: erase it to free its blocks.
        """

    def load(self, key: StoreKey, *, stream: int | Any | None = None) -> int | None:
        """
        A new sequence holding the value stored under key (pinned memory, then the lower store, whose
        hit is promoted), its copy queued on stream; None on a miss. OutOfMemoryError (nothing
        changed, the value kept) when the cache has too few free blocks.
        """

    def contains(self, key: StoreKey) -> bool:
        """Whether key's value is in pinned memory or in the lower store."""

    def __contains__(self, key: StoreKey) -> bool: ...

    def poll(self) -> None:
        """
        Release holder sequences whose copies completed and pinned ranges nothing reads any more
        (every other call does this too).
        """

    def flush(self) -> None:
        """
        Wait for every offload copy and every demotion to the lower store queued so far.
        """

    def stats(self) -> OffloadStats:
        """Counts (OffloadStats)."""

    @property
    def cache(self) -> PagedCache:
        """The PagedCache."""

    @property
    def lower(self) -> KvStore | None:
        """The lower KvStore (or None)."""
