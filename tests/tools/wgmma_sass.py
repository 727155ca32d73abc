"""The machine code (SASS) of the wgmma prefill kernels in built objects, for the checks and
counts that read it (check_wgmma_sass.py, bench/wgmma_loop_counts.py): the CUDA tools found,
each kernel's instructions, and its tile loop.

cuobjdump (and the nvdisasm it runs) come from PATH, beside nvcc, or PyPI's nvidia-cuda-cuobjdump
and nvidia-cuda-nvdisasm wheels on sys.path.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

KERNEL = re.compile(r"prefill_wgmma(_ws|_tma|_wide)?_kernel")  # the tile-loop kernels (not the primitives' self-test)
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
# HGMMA.<shape>... D, A, gdesc[..][.tnspB], ...: A in registers (R<n>, four of them); HGMMA_SS: A and B in
# shared memory (one gdesc operand for both).
HGMMA = re.compile(r"HGMMA\.\S+\s+R\d+,\s+R(\d+),\s+gdesc\[\w+\](\.tnspB)?")
HGMMA_SS = re.compile(r"HGMMA\.\S+\s+R\d+,\s+gdesc\[\w+\],")
# BRA [predicate operand,] target: group "target" the address, group "pred" a predicate operand (a
# conditional branch, as is one guarded by @P).
BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+(?P<pred>!?U?P\w+,\s+)?(?P<target>0x[0-9a-f]+)")


def find_tool(tool, nvcc):
    found = shutil.which(tool)
    if found:
        return found
    if nvcc:
        beside = os.path.join(os.path.dirname(os.path.realpath(nvcc)), tool)
        if os.access(beside, os.X_OK):
            return beside
    for root in sys.path:
        for path in sorted(glob.glob(os.path.join(root, "nvidia", "cu*", "bin", tool))):
            if not os.access(path, os.X_OK):
                os.chmod(path, 0o755)  # wheels unpacked by pip may drop the executable bit
            return path
    return None


def kernels(objects, cuobjdump, nvdisasm):
    """Yields (name, [(address, instruction text)]) for each wgmma prefill kernel in the objects."""
    env = dict(os.environ, NVDISASM_PATH=os.path.dirname(nvdisasm))
    for obj in objects:
        sass = subprocess.run([cuobjdump, "-sass", obj], check=True, capture_output=True, text=True, env=env).stdout
        for part in re.split(r"\n\s*Function : ", sass)[1:]:
            mangled = part.split("\n", 1)[0].strip()
            if not KERNEL.search(mangled):
                continue
            demangled = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip() or mangled
            name = re.sub(r"\(kvcore::ops::PagedAttentionParams, int[^)]*\)$", "", demangled.replace("kvcore::ops::cuda::", ""))
            yield name, [(int(a, 16), text) for a, text in INSTRUCTION.findall(part)]


def hgmmas(code):
    """(address, first A register or None for A in shared memory, is P V) of each wgmma: S = Q K^T has B not
    transposed (A in registers, or in shared memory in the wide-tile kernel); P V reads V transposed (.tnspB)."""
    for at, text in code:
        m = HGMMA.search(text)
        if m:
            yield at, int(m.group(1)), bool(m.group(2))
        elif HGMMA_SS.search(text):
            yield at, None, False


def tile_loop(code):
    """[lo, hi] of the tightest backward branch around the S = Q K^T wgmmas; None without one."""
    s_at = [at for at, _, pv in hgmmas(code) if not pv]
    if not s_at:
        return None
    loops = [(int(m.group("target"), 16), at) for at, text in code for m in [BRANCH.search(text)]
             if m and int(m.group("target"), 16) <= min(s_at) and max(s_at) <= at]
    return min(loops, key=lambda r: r[1] - r[0]) if loops else None


def command_line(doc):
    """The tools' shared command line, [--nvcc PATH] OBJECT...: (objects, cuobjdump, nvdisasm); exits
    with 77 (ctest's skip) where cuobjdump or nvdisasm is not found."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--nvcc", help="the CUDA compiler (cuobjdump is looked for beside it)")
    ap.add_argument("objects", nargs="+")
    args = ap.parse_args()
    cuobjdump, nvdisasm = find_tool("cuobjdump", args.nvcc), find_tool("nvdisasm", args.nvcc)
    if not cuobjdump or not nvdisasm:
        print("no cuobjdump or nvdisasm (not on PATH, not beside nvcc, no nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm "
              "wheel): skipped")
        sys.exit(77)
    return args.objects, cuobjdump, nvdisasm
