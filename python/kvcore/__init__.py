"""kvcore: the KV-cache layer of an LLM inference engine (paged FP8 caches, context shift,
forks, rope-on-read attention, DeepSeek-V4's compressed cache), from Python.

Tensors are any object with ``__dlpack__`` (numpy arrays, torch tensors, ...); kvcore reads and
writes them in place, never copying. Outputs go into ``out=`` tensors you pass, or come back as
new tensors of the input's framework. CUDA work runs on torch's current stream unless
``stream=`` says otherwise. Failures raise :class:`kvcore.Error` subclasses that are also
``ValueError`` / ``MemoryError`` / ``NotImplementedError`` / ``RuntimeError``.

Start with :class:`kvcore.PagedCache` (``help(kvcore.PagedCache)``). Persistence: ``PagedCache.save`` /
``load`` / ``snapshot`` / ``restore``, :func:`kvcore.snapshot_inspect`, :class:`kvcore.PrefixCache`,
:class:`kvcore.BlockOffloader` over a :class:`kvcore.KvStore` (``HostStore``, ``DiskStore``, ``TieredStore``,
``RedisStore`` where built with hiredis).
Pool memory your own allocator owns: ``PagedCache.pool_specs`` and ``PagedCache(..., pools=)``.
"""

from ._ext import (  # noqa: F401
    AttentionPlan,
    BlockOffloader,
    CorruptError,
    DeviceError,
    DiskStore,
    Dsv4Cache,
    Dsv4Compressor,
    Error,
    HostStore,
    InvalidArgumentError,
    KvStore,
    NotSupportedError,
    OffloadStats,
    OutOfMemoryError,
    PagedCache,
    PagedStats,
    PoolSpec,
    PrefixCache,
    PrefixStats,
    RopeSpec,
    SeqInfo,
    StoreKey,
    StoreStats,
    Ticket,
    TieredStore,
    attention_decode,
    attention_dsv4_decode,
    attention_prefill,
    attention_workspace_bytes,
    cuda_compiled,
    cuda_device_count,
    dsv4_compress_prefill,
    dsv4_compressor_emit,
    dsv4_compressor_reset,
    dsv4_compressor_shift,
    dsv4_compressor_store_one,
    dsv4_indexer_topk,
    dsv4_kv_finalize,
    dsv4_pack_rows,
    dsv4_unpack_rows,
    fp8_pack_rows,
    fp8_round_trip_rows,
    fp8_unpack_rows,
    kv_store,
    redis_compiled,
    rope_apply,
    rope_shift_rows,
    shift_dense,
    snapshot_describe,
    snapshot_inspect,
    version,
)

if redis_compiled():
    from ._ext import RedisStore  # noqa: F401

__version__ = version()
