"""The attention function registered with transformers as "kvcore": it stores the layer's new K/V
rows into the KvcoreCache's pages and runs kvcore's paged attention over them.

Registered in both of transformers' registries: AttentionInterface (the function) and
AttentionMaskInterface with transformers' own flash_attention_mask, so that the function receives
the 2D padding mask (None when nothing is padded) instead of a dense 4D mask: padding tokens are
never stored, and a left-padded batch is a set of independent sequences."""

from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

import kvcore

from .cache import active_cache

NAME = "kvcore"


def kvcore_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query [B, Hq, T, D], key/value [B, Hkv, T, D] as transformers' attention modules pass them
    (unrotated: kvcore.hf.attach makes the model's RoPE the identity) -> ([B, T, Hq, D], None)."""
    cache = active_cache()
    if cache is None or cache._layer != module.layer_idx:
        raise kvcore.InvalidArgumentError(
            "InvalidArgument: attn_implementation='kvcore' needs a kvcore.hf.KvcoreCache as the model's cache "
            "(kvcore.hf.cache_kwargs) "
            f"(layer {module.layer_idx} got no cache update)")
    if dropout:
        raise kvcore.NotSupportedError(f"NotSupported: kvcore attention: dropout {dropout} (inference only)")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise kvcore.NotSupportedError(
            f"NotSupported: kvcore attention: a {attention_mask.dim()}D attention mask (only 2D padding masks)")
    if kwargs.get("s_aux") is not None or getattr(module, "sinks", None) is not None:
        raise kvcore.NotSupportedError("NotSupported: kvcore attention: learned attention sinks")
    if module.layer_idx == 0:
        cache.begin_step(query.shape[0], query.shape[2], attention_mask, query.device)
    scale = scaling if scaling is not None else module.scaling
    out = cache.attend(module, query, key, value, scale, kwargs.get("sliding_window"))
    return out, None


def register():
    """Register "kvcore" with transformers (done on import of kvcore.hf)."""
    AttentionInterface.register(NAME, kvcore_attention)
    AttentionMaskInterface.register(NAME, flash_attention_mask)
