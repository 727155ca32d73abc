"""kvcore under Hugging Face transformers (>= 5.17): a Cache whose K/V live in kvcore pages (f32,
f16, bf16, FP8) with context shift, and the attention implementation "kvcore" that reads them.

    import kvcore.hf
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="kvcore")
    cache = kvcore.hf.KvcoreCache(model, window=1024, k_format="fp8")
    model.generate(ids, past_key_values=cache, max_new_tokens=4096)

Importing this module registers "kvcore" with transformers. Supported: Llama-family decoders whose
attention modules call past_key_values.update() then the registered attention function (Llama 2/3,
Qwen2, Qwen3, Mistral, SmolLM), RoPE default / linear / llama3. Needs torch and transformers.
"""

from .attention import NAME, kvcore_attention, register
from .cache import KvcoreCache, KvcoreLayer, active_cache
from .rope import attach, rope_spec_from_config

register()

__all__ = ["NAME", "KvcoreCache", "KvcoreLayer", "active_cache", "attach", "kvcore_attention", "register",
           "rope_spec_from_config"]
