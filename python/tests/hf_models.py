"""Tiny random-weight transformers models for the kvcore.hf tests (built from config classes,
nothing downloaded), the devices to run on, and the references' K/V codecs."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kvcore  # noqa: E402

VOCAB = 256
COMMON = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, max_position_embeddings=8192, tie_word_embeddings=False)

ARCHS = ["llama", "llama3_scaled", "qwen2", "qwen3", "mistral", "smollm"]

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and kvcore.cuda_device_count() > 0 else [])


def config(arch, **over):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    kw = dict(COMMON)
    if arch == "llama":
        cls = LlamaConfig
    elif arch == "llama3_scaled":  # Llama 3's scaled RoPE, with a short original context so it bites
        cls = LlamaConfig
        kw["rope_parameters"] = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                     high_freq_factor=4.0, original_max_position_embeddings=64)
    elif arch == "qwen2":
        cls, kw["attention_bias"] = Qwen2Config, True
    elif arch == "qwen3":
        cls = Qwen3Config
    elif arch == "mistral":
        cls, kw["sliding_window"] = MistralConfig, 24
    elif arch == "smollm":  # SmolLM2's proportions: 3 query heads per kv head, theta 100000, tied embeddings
        cls = LlamaConfig
        kw.update(hidden_size=192, num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=True,
                  rope_parameters=dict(rope_type="default", rope_theta=100000.0))
    else:
        raise ValueError(arch)
    kw.update(over)
    return cls(**kw)


def model(arch, seed=0, device="cpu", dtype=None, **over):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(config(arch, **over), attn_implementation="eager")
    # larger than the initializer's 0.02 so attention is far from uniform and errors show
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(4.0)
    m = m.eval().to(device)
    return m.to(dtype) if dtype is not None else m


def prompt(n, batch=1, seed=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, n), generator=g).to(device)


def codec(name):
    """Row codec (rows of head_dim f32 values) of kvcore's page formats."""
    if name == "f32":
        return lambda x: x
    if name == "f16":
        return lambda x: x.to(torch.float16).to(x.dtype)
    if name == "bf16":
        return lambda x: x.to(torch.bfloat16).to(x.dtype)
    if name == "fp8":
        return lambda x: kvcore.fp8_round_trip_rows(x.float().contiguous()).to(x.dtype)
    raise ValueError(name)


def round_kv_through(model, k_codec, v_codec):
    """Hooks that pass every layer's new K (before RoPE) and V through the page codecs, so HF's own
    attention sees the values kvcore's pages hold. Returns the hook handles."""
    handles = []
    head_dim = model.config.head_dim

    def hook(fn):
        def h(_module, _inp, out):
            return fn(out.reshape(-1, head_dim)).reshape(out.shape)
        return h

    for layer in model.model.layers:
        attn = layer.self_attn
        k_src = attn.k_norm if hasattr(attn, "k_norm") else attn.k_proj
        handles.append(k_src.register_forward_hook(hook(k_codec)))
        handles.append(attn.v_proj.register_forward_hook(hook(v_codec)))
    return handles


def greedy(m, ids, n, **kw):
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=0, **kw)
    return out.sequences, torch.stack(out.logits, dim=1)


def rel_per_step(a, b):
    """max |a - b| / max |b| at each generated step: a, b [batch, steps, vocab] -> [steps]."""
    a, b = a.double(), b.double()
    return ((a - b).abs().amax(dim=(0, 2)) / b.abs().amax(dim=(0, 2)))
