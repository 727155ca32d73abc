"""kvcore under Hugging Face transformers (>= 5.17): a Cache whose K/V live in kvcore pages (f32,
f16, bf16, FP8) with context shift, and the attention implementation "kvcore" that reads them.

    import kvcore.hf
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="kvcore")
    cache = kvcore.hf.KvcoreCache(model, window=1024, k_format="fp8")
    model.generate(ids, **kvcore.hf.cache_kwargs(model, cache), max_new_tokens=4096)

Importing this module registers "kvcore" with transformers. Supported: Llama-family decoders whose
attention modules call the cache's update() then the registered attention function (Llama 2/3,
Qwen2, Qwen3, Mistral, SmolLM), RoPE default / linear / llama3. Needs torch and transformers.
cache_kwargs passes the cache as `cache=` (transformers >= 5.25) or `past_key_values=` (5.17-5.24).
"""

from .attention import NAME, kvcore_attention, register
from .cache import KvcoreCache, KvcoreLayer, active_cache
from .compat import cache_keyword, cache_kwargs
from .rope import attach, rope_spec_from_config

register()

__all__ = ["NAME", "KvcoreCache", "KvcoreLayer", "active_cache", "attach", "cache_keyword", "cache_kwargs",
           "kvcore_attention", "register", "rope_spec_from_config"]
