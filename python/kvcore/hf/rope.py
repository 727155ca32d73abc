"""The model's rotary embedding, seen from kvcore: a RopeSpec built from a transformers config,
and the switch that makes the model hand q and k to attention unrotated.

kvcore owns positions. transformers rotates q and k before the cache sees them, at positions
generate() counts itself; after a context shift those are no longer the positions the kept keys
sit at. So while a model runs with attn_implementation="kvcore", its rotary module returns
cos = 1, sin = 0: apply_rotary_pos_emb is then exactly the identity (q * 1 + rotate_half(q) * 0),
and kvcore rotates keys (when stored, or on read) and queries at the positions it keeps."""

import kvcore

# transformers' rope_type -> kvcore scaling; only variants whose rotation leaves the norm of q and
# k unchanged (attention_scaling 1), since kvcore applies no magnitude factor to queries.
_SCALINGS = {"default": "none", "linear": "linear", "llama3": "llama3"}


def _rope_parameters(config):
    params = getattr(config, "rope_parameters", None)
    if params is None:  # configs that still spell it rope_theta / rope_scaling
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_type", params.pop("type", "default"))
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params


def head_dim_of(config):
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_spec_from_config(config):
    """The kvcore.RopeSpec of a Llama-family config (NeoX pairs over the first n_rot dims;
    default, linear or llama3 scaling). Raises kvcore.NotSupportedError for other variants."""
    params = _rope_parameters(config)
    head_dim = head_dim_of(config)
    n_rot = int(head_dim * float(params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))))
    rope_type = params.get("rope_type", "default")
    if rope_type not in _SCALINGS:
        raise kvcore.NotSupportedError(
            f"NotSupported: kvcore.hf: rope_type {rope_type!r} (supported: {sorted(_SCALINGS)})")
    kw = dict(scaling=_SCALINGS[rope_type])
    if rope_type in ("linear", "llama3"):
        kw["factor"] = float(params["factor"])
    if rope_type == "llama3":
        kw.update(low_freq_factor=float(params["low_freq_factor"]), high_freq_factor=float(params["high_freq_factor"]),
                  original_max_position=int(params["original_max_position_embeddings"]))
    spec = kvcore.RopeSpec(n_rot, float(params["rope_theta"]), **kw)
    spec.validate(head_dim)
    return spec


def _identity_when_kvcore(rotary, config):
    original = rotary.forward

    def forward(x, position_ids, *args, **kwargs):
        cos, sin = original(x, position_ids, *args, **kwargs)
        if config._attn_implementation != "kvcore":
            return cos, sin
        return cos.new_ones(cos.shape), sin.new_zeros(sin.shape)

    forward.kvcore_original = original
    return forward


def attach(model):
    """Make every rotary module of `model` return the identity rotation while the model's attention
    implementation is "kvcore" (and its own rotation otherwise). Idempotent; returns the number of
    rotary modules switched."""
    n = 0
    for _, module in model.named_modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            if getattr(module, "attention_scaling", 1.0) != 1.0:
                raise kvcore.NotSupportedError(
                    f"NotSupported: kvcore.hf: attention_scaling {module.attention_scaling} of "
                    f"{type(module).__name__} (q and k scaled by RoPE)")
            if not hasattr(module.forward, "kvcore_original"):
                module.forward = _identity_when_kvcore(module, getattr(module, "config", model.config))
            n += 1
    if n == 0:
        raise kvcore.NotSupportedError(
            f"NotSupported: kvcore.hf: no rotary embedding module found in {type(model).__name__}")
    return n
