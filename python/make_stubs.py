"""Regenerate python/kvcore/_ext.pyi from the built module: nanobind's stubgen, then the
argument types nanobind cannot know (its signatures say `object` for every tensor, stream and
name argument) written as the API means them. Run with the build's package on PYTHONPATH:

    PYTHONPATH=build/python python python/make_stubs.py [OUT]   (default: python/kvcore/_ext.pyi)

tests: test_stubs.py checks that the committed file equals a fresh run."""

import os
import re
import subprocess
import sys
import tempfile

TENSORS = ("src x positions codes scales tail packed k v delta slots pool q indptr indices last_page_len qo_indptr "
           "scores window_kv window_len q_positions kv raw_ring c z ape state_kv state_score norm_weight rows weights "
           "index_rows out k_scale v_scale k_scales valid pos_offset sinks workspace comp_rows comp_idx window_index "
           "comp_ape comp_norm idx_ape idx_norm comp_c comp_z idx_c idx_z").split()
HEADER = ("from typing import Any, TypeAlias\n\n"
          "Tensor: TypeAlias = Any\n"
          '"""Any object with __dlpack__: numpy.ndarray, torch.Tensor, ... (used in place, never copied)."""\n\n')


def rewrite(text):
    for name in TENSORS:
        text = re.sub(rf"\b{name}: object \| None = None", f"{name}: Tensor | None = None", text)
        text = re.sub(rf"\b{name}: object \| None\b", f"{name}: Tensor", text)
    text = text.replace("stream: object | None = None", "stream: int | Any | None = None")
    text = text.replace("framework: object | None = None", "framework: str | None = None")
    text = re.sub(r"\b(tail_dtype|dtype): object = ", r"\1: str = ", text)
    text = re.sub(r"\brope: object\b", "rope: RopeSpec | Sequence[RopeSpec]", text)
    text = re.sub(r"\bdevice: object = ", "device: str | int = ", text)
    text = re.sub(r"\b(seqs|ticket_or_seqs): object\b",
                  lambda m: "seqs: int | Sequence[int]" if m.group(1) == "seqs" else
                  "ticket_or_seqs: Ticket | int | Sequence[int]", text)
    text = re.sub(r"\b(counts|positions|q_positions): object \| None = None", r"\1: Sequence[int] | None = None", text)
    text = re.sub(r"\bk: list \| None\b", "k: Sequence[Tensor]", text)
    text = text.replace("pools: object | None = None", "pools: Sequence[Tensor] | None = None")
    text = re.sub(r"\bpath: object\b", "path: str | os.PathLike[str]", text)
    text = re.sub(r"\bsource: object\b", "source: str | os.PathLike[str] | bytes", text)
    text = re.sub(r"\bmodel_id: object\b", "model_id: str | bytes", text)
    text = re.sub(r"\bdata: object\b", "data: bytes", text)
    text = re.sub(r"\bsalt: object = ''", "salt: str | bytes = ''", text)
    text = re.sub(r"\b(prompt|tokens): object\b", r"\1: Sequence[int]", text)
    text = re.sub(r"\bdir: object\b", "dir: str | os.PathLike[str]", text)
    text = re.sub(r"\btiers: object\b", "tiers: Sequence[KvStore]", text)
    text = re.sub(r"\bcache: object\b", "cache: PagedCache", text)
    text = text.replace("lower: object | None = None", "lower: KvStore | None = None")
    text = re.sub(r"\b(password|key_prefix): object = ", r"\1: str | bytes = ", text)
    text = text.replace("def lower(self) -> object:", "def lower(self) -> KvStore | None:")
    text = text.replace("def cache(self) -> object:", "def cache(self) -> PagedCache:")
    text = text.replace("def tiers(self) -> tuple:", "def tiers(self) -> tuple[KvStore, ...]:")
    text = text.replace("def pools(self) -> object:", "def pools(self) -> tuple[Tensor, ...] | None:")
    text = re.sub(r"-> object:", "-> Tensor:", text)
    text = re.sub(r"-> object$", "-> Tensor", text, flags=re.M)
    imports_end = text.find("\n\n", text.rfind("\nimport ") if "\nimport " in text else text.rfind("\nfrom "))
    text = text[:imports_end + 2] + HEADER + text[imports_end + 2:]
    if "os.PathLike" in text and "\nimport os\n" not in text:
        text = text.replace(HEADER, "import os\n" + HEADER)
    if "Sequence" in text and "import Sequence" not in text:
        text = text.replace(HEADER, "from collections.abc import Sequence\n" + HEADER)
    return text


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "kvcore", "_ext.pyi")
    with tempfile.TemporaryDirectory() as d:
        raw = os.path.join(d, "_ext.pyi")
        subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "kvcore._ext", "-o", raw], check=True)
        with open(raw) as f:
            text = rewrite(f.read())
    with open(out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
