"""KvcoreCache: a transformers Cache whose keys and values live in a kvcore.PagedCache.

One kvcore sequence per batch row. transformers hands each layer's new K/V to Cache.update(), which
only notes the layer; the "kvcore" attention function (attention.py) then stores the rows that are
not padding into the pages and runs kvcore's attention over them. The cache is never materialized
as dense tensors.

Positions are kvcore's: a row's next token goes at its last position + 1. When a row's live tokens
would exceed `window`, the cache shifts it first (llama.cpp's context shift): keep the first n_keep
tokens (attention sinks), drop the next n_discard, move the rest down by n_discard. Generation then
goes on past the window with every query-key distance inside it.

get_seq_length() is the number of columns consumed from the caller's stream (padding and shifted-out
tokens included): generate() slices input ids and builds its 2D padding mask with it.
"""

import threading

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

import kvcore

from .rope import attach, head_dim_of, rope_spec_from_config

_active = threading.local()


def active_cache():
    """The KvcoreCache whose update() ran last on this thread (the one the attention call reads)."""
    return getattr(_active, "cache", None)


class KvcoreLayer(CacheLayerMixin):
    """One layer's face of a KvcoreCache towards transformers: sizes only, the data is in the pages."""

    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, owner):
        super().__init__()
        self._owner = owner

    def lazy_initialization(self, key_states, value_states):
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        return key_states, value_states

    def get_mask_sizes(self, query_length, *args, **kwargs):
        return self._owner.get_seq_length() + query_length, 0

    def get_seq_length(self):
        return self._owner.get_seq_length()

    def get_max_length(self):
        return -1

    def reset(self):
        pass


class KvcoreCache(Cache):
    """A transformers Cache backed by kvcore.PagedCache, for Llama-family models (Llama 2/3,
    Qwen2/Qwen3, Mistral, SmolLM) loaded or switched to attn_implementation="kvcore":

        model.set_attn_implementation("kvcore")
        cache = kvcore.hf.KvcoreCache(model, window=1024, k_format="fp8")
        out = model.generate(ids, **kvcore.hf.cache_kwargs(model, cache), max_new_tokens=4000)

    window: live tokens per sequence; when a step would exceed it, the sequence is shifted first.
    n_keep: tokens kept at the start (attention sinks, StreamingLLM's 4); n_discard: tokens dropped
    per shift (None: half of window - n_keep, llama.cpp's choice). k_format / v_format: 'f32', 'f16',
    'bf16' or 'fp8' (E4M3 with one UE8M0 scale per 64 dims). rope_mode: 'on_read' (keys stored
    unrotated, a shift moves no byte) or 'stored' (keys rotated when written, re-rotated once after a
    shift). The pages are allocated at the first forward, on the device of the model's tensors:
    num_blocks blocks of block_size cells (default: enough for max_batch_size rows of `window`
    tokens, max_batch_size defaulting to the first batch).
    """

    def __init__(self, model, *, window=4096, n_keep=4, n_discard=None, k_format="f16", v_format=None,
                 rope_mode="on_read", block_size=16, max_batch_size=None, num_blocks=None):
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        if window <= n_keep or n_keep < 0:
            raise kvcore.InvalidArgumentError(
                f"InvalidArgument: KvcoreCache: window ({window}) must exceed n_keep ({n_keep}) >= 0")
        if n_discard is not None and not 0 < n_discard <= window - n_keep:
            raise kvcore.InvalidArgumentError(
                f"InvalidArgument: KvcoreCache: n_discard ({n_discard}) must be in [1, window - n_keep = "
                f"{window - n_keep}]")
        self.rope = rope_spec_from_config(config)
        n_layers = config.num_hidden_layers
        self._paged_args = dict(n_layers=n_layers, n_kv_heads=config.num_key_value_heads,
                                head_dim=head_dim_of(config), rope=self.rope, block_size=block_size,
                                k_format=k_format, v_format=v_format, rope_mode=rope_mode)
        kvcore.PagedCache(num_blocks=1, **self._paged_args)  # refuses bad formats now, not at the first forward
        super().__init__(layers=[KvcoreLayer(self) for _ in range(n_layers)])
        attach(model)
        self.window, self.n_keep = int(window), int(n_keep)
        self.n_discard = int(n_discard) if n_discard is not None else max(1, (window - n_keep) // 2)
        self._max_batch_size, self._num_blocks = max_batch_size, num_blocks
        self.paged = None  # the kvcore.PagedCache, made at the first forward
        self.seqs = []  # kvcore sequence id of each batch row
        self.shifts = 0  # context shifts done (all rows)
        self._consumed = 0
        self._step = None
        self._layer = None
        self._ticket = None

    # ---- what transformers asks ---------------------------------------------------------------
    def get_seq_length(self, layer_idx=0):
        return self._consumed

    def get_mask_sizes(self, query_length, layer_idx=0):
        return self._consumed + query_length, 0

    def get_max_length(self, layer_idx=None):
        return -1

    @property
    def is_compileable(self):
        return False

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """Notes which layer attends next; the "kvcore" attention function stores and reads."""
        _active.cache = self
        self._layer = layer_idx
        return key_states, value_states

    def crop(self, max_length):
        """Drop tokens from the end of every row: crop(-n) removes n (transformers >= 5.17's form);
        crop(n >= 0) keeps n consumed columns (the older absolute form)."""
        remove = -max_length if max_length < 0 else self._consumed - max_length
        if remove <= 0:
            return
        if remove > self._consumed:
            raise kvcore.InvalidArgumentError(
                f"InvalidArgument: KvcoreCache.crop: {remove} tokens to remove, {self._consumed} consumed")
        for s in self.seqs:
            live = self.paged.info(s).n_live
            if remove > live:
                raise kvcore.InvalidArgumentError(
                    f"InvalidArgument: KvcoreCache.crop: {remove} tokens to remove, sequence {s} holds {live}")
        for s in self.seqs:
            self.paged.truncate(s, self.paged.info(s).n_live - remove)
        self._consumed -= remove

    def reorder_cache(self, beam_idx):
        """Beam search: row i continues row beam_idx[i] (forks share blocks, copied on write)."""
        self._reseat([int(i) for i in beam_idx.tolist()])

    def batch_repeat_interleave(self, repeats):
        self._reseat([i for i in range(len(self.seqs)) for _ in range(int(repeats))])

    def batch_select_indices(self, indices):
        idx = indices.tolist() if hasattr(indices, "tolist") else list(indices)
        self._reseat([int(i) for i in idx])

    def reset(self):
        for s in self.seqs:
            self.paged.erase(s)
        self.seqs, self._consumed, self._step, self.shifts = [], 0, None, 0

    # ---- kvcore side ----------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self):
        """Bytes of K and V pages per cached token, all layers (0 before the first forward)."""
        if self.paged is None:
            return 0
        return self.paged.stats().bytes_per_block // self.paged.block_size

    def live_tokens(self, row=0):
        return self.paged.info(self.seqs[row]).n_live if self.paged is not None and self.seqs else 0

    def _reseat(self, rows):
        if not self.seqs:
            return
        new = [self.paged.fork(self.seqs[r]) for r in rows]
        for s in self.seqs:
            self.paged.erase(s)
        self.seqs = new
        self._step = None

    def _allocate(self, batch, device):
        rows = max(batch, self._max_batch_size or 0)
        bs = self._paged_args["block_size"]
        # a row spans at most window live cells plus the dead cells of the partly cut blocks at both
        # ends of its last shift, and a fork's tail is copied on its first write
        per_row = -(-self.window // bs) + 4
        blocks = self._num_blocks or rows * per_row
        dev = "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"
        self.paged = kvcore.PagedCache(num_blocks=blocks, device=dev, **self._paged_args)
        for layer in self.layers:
            layer.is_initialized = True

    def begin_step(self, batch, n_new, attention_mask, device):
        """Layer 0 of a forward: shift rows that would overflow, reserve cells for this step's
        non-padding tokens and remember the rows to gather. attention_mask: None or bool [batch, >= n_new]."""
        if self.paged is None:
            self._allocate(batch, device)
        if not self.seqs:
            self.seqs = [self.paged.create() for _ in range(batch)]
        if batch != len(self.seqs):
            raise kvcore.InvalidArgumentError(
                f"InvalidArgument: KvcoreCache: batch of {batch} rows, the cache holds {len(self.seqs)}")
        if attention_mask is None:
            new_valid = None
            counts = [n_new] * batch
        else:
            new_valid = attention_mask[:, -n_new:].to(torch.bool)
            counts = new_valid.sum(dim=1).tolist()
        if max(counts) > self.window - self.n_keep:
            raise kvcore.InvalidArgumentError(
                f"InvalidArgument: KvcoreCache: {max(counts)} new tokens in one step, window {self.window} keeps "
                f"{self.n_keep}: feed the prompt in chunks of at most {self.window - self.n_keep}")
        positions, seqs, seq_counts = [], [], []
        for s, c in zip(self.seqs, counts):
            if c == 0:
                continue
            info = self.paged.info(s)
            if info.n_live + c > self.window:
                n_discard = max(self.n_discard, info.n_live + c - self.window)
                self.paged.shift(s, self.n_keep, n_discard)
                self.shifts += 1
                info = self.paged.info(s)
            start = info.last_position + 1
            positions.extend(range(start, start + c))
            seqs.append(s)
            seq_counts.append(c)
        if self._ticket is None:
            self._ticket = self.paged.reserve(seqs, positions, seq_counts)
        else:
            self.paged.reserve(seqs, positions, seq_counts, reuse=self._ticket)
        self._consumed += n_new
        rows = None
        if new_valid is not None and sum(counts) != batch * n_new:
            rows = torch.nonzero(new_valid.reshape(-1)).squeeze(1).to(device)
        q_pos = None
        if self.paged.rope_mode == "stored":
            q_pos = torch.tensor(positions, dtype=torch.int32, device=device)
        self._step = dict(rows=rows, plans={}, q_positions=q_pos, n_rows=len(positions))

    def attend(self, module, q, k, v, scaling, window):
        """One layer: q [B, Hq, T, D], k/v [B, Hkv, T, D] (unrotated) -> output [B, T, Hq, D]."""
        B, Hq, T, D = q.shape
        step = self._step
        q_rows = q.transpose(1, 2).reshape(B * T, Hq, D)
        k_rows = k.transpose(1, 2).reshape(B * T, k.shape[1], D)
        v_rows = v.transpose(1, 2).reshape(B * T, v.shape[1], v.shape[3])
        rows = step["rows"]
        if rows is not None:
            q_rows, k_rows, v_rows = q_rows[rows], k_rows[rows], v_rows[rows]
        else:
            q_rows, k_rows, v_rows = q_rows.contiguous(), k_rows.contiguous(), v_rows.contiguous()
        layer = module.layer_idx
        self.paged.store(self._ticket, layer, k_rows, v_rows)
        key = (float(scaling), int(window or 0))
        plan = step["plans"].get(key)
        if plan is None:
            plan = self.paged.plan(self._ticket, softmax_scale=key[0], window=key[1])
            step["plans"][key] = plan
        if step["q_positions"] is not None:
            kvcore.rope_apply(q_rows, step["q_positions"], self.rope)
        # allocated here, where torch's allocator is warm: from inside run() the same tensor costs
        # the host more (bench/results/2026-12-05-hf-cpu-layer-call-cost.md)
        out = q_rows.new_empty((q_rows.shape[0], Hq, v_rows.shape[-1]))
        plan.run(layer, q_rows, out=out)
        self._layer = None  # the next attention call must follow its own update()
        if rows is None:
            return out.view(B, T, Hq, D)
        full = out.new_zeros(B * T, Hq, out.shape[-1])
        full[rows] = out
        return full.view(B, T, Hq, -1)
