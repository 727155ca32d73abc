#!/usr/bin/env python3
"""Reads the machine code (SASS) of the wgmma prefill kernels in a built object and checks that Q
stays Q: the registers holding the query fragments, the A operand of every S = Q K^T wgmma, are
written by no instruction of the tile loop and are not the A operand of a P V wgmma.

Why a check on the machine code: with ptxas of CUDA 13.0, a tile loop that made P and consumed it
in the same step compiled at head dim 64 into code that put P and the softmax's temporaries in Q's
registers, so every tile after the first multiplied K by the previous tile's P. The source and its
PTX were right; the GPU tests caught it only on a Hopper machine. This check catches it wherever
the CUDA code is compiled, GPU or not.

    check_wgmma_sass.py [--nvcc PATH] OBJECT...

cuobjdump (and the nvdisasm it runs) come from PATH, beside nvcc, or PyPI's nvidia-cuda-cuobjdump
and nvidia-cuda-nvdisasm wheels on sys.path. Exit status: 0 every kernel checked and clean; 1 a
violation, or no wgmma prefill kernel found; 77 no cuobjdump or nvdisasm (ctest reports the test
skipped).
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wgmma_sass import command_line, hgmmas, kernels, tile_loop  # noqa: E402

# Opcodes whose first operand is not a general register they write.
NO_REGISTER_DEST = ("HGMMA", "ST", "RED", "ATOM", "BRA", "BAR", "WARPGROUP", "WARPSYNC", "EXIT", "RET", "CALL", "BSSY",
                    "BSYNC", "ISETP", "FSETP", "DSETP", "HSETP", "PLOP3", "R2UR", "S2UR", "UMOV", "UIADD", "ULOP",
                    "USHF", "ULEA", "UIMAD", "ELECT", "SYNCS", "NOP", "DEPBAR", "MEMBAR", "FENCE", "CCTL", "ERRBAR",
                    "ARRIVES", "LDGDEPBAR", "VOTEU", "UISETP", "UPLOP3", "USEL", "UFLO", "UBMSK", "USGXT", "UPRMT")


def registers_written(op):
    """How many registers from `first` the instruction writes (64- and 128-bit results write pairs, quads)."""
    if op.startswith("CS2R") or "WIDE" in op or ".64" in op:
        return 2
    if ".128" in op or ".X4" in op:
        return 4
    return 1


def check_function(name, code):
    q_regs, p_regs = set(), set()
    for _, a, pv in hgmmas(code):
        (p_regs if pv else q_regs).update(range(a, a + 4))  # P V: B = V transposed; else S = Q K^T
    if not q_regs:
        return [f"{name}: no S = Q K^T wgmma with A in registers found"]
    loop = tile_loop(code)
    if not loop:
        return [f"{name}: no loop around the S wgmmas"]
    lo, hi = loop
    problems = []
    if q_regs & p_regs:
        problems.append(f"{name}: Q (R{min(q_regs)}-R{max(q_regs)}) and P (R{min(p_regs)}-R{max(p_regs)}) share "
                        f"{len(q_regs & p_regs)} registers")
    writes = []
    for at, text in code:
        if not lo <= at <= hi:
            continue
        words = text.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if len(words) < 2 or words[0].startswith(NO_REGISTER_DEST):
            continue
        m = re.match(r"R(\d+)\b", words[1])
        if m and set(range(int(m.group(1)), int(m.group(1)) + registers_written(words[0]))) & q_regs:
            writes.append(f"{at:#06x} {text}")
    if writes:
        problems.append(f"{name}: {len(writes)} instructions of the tile loop [{lo:#x}, {hi:#x}] write Q's registers, "
                        f"first: {writes[0]}")
    print(f"{name}: Q R{min(q_regs)}-R{max(q_regs)}, P R{min(p_regs)}-R{max(p_regs)}, tile loop [{lo:#x}, {hi:#x}]: "
          f"{'FAIL' if problems else 'ok'}")
    return problems


def main():
    objects, cuobjdump, nvdisasm = command_line(__doc__)
    problems, checked = [], 0
    for name, code in kernels(objects, cuobjdump, nvdisasm):
        problems += check_function(name, code)
        checked += 1
    if checked == 0:
        problems.append(f"no wgmma prefill kernel in {' '.join(objects)}")
    for p in problems:
        print("FAIL " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
