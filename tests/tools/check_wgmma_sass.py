#!/usr/bin/env python3
"""Reads the machine code (SASS) of the wgmma prefill kernels in a built object and checks two
things the source and its PTX cannot guarantee:
 - Q stays Q (kernels with q in registers): the registers holding the query fragments, the A
   operand of every S = Q K^T wgmma, are written by no instruction of the tile loop and are not
   the A operand of a P V wgmma. With ptxas of CUDA 13.0, a tile loop that made P and consumed it
   in the same step compiled at head dim 64 into code that put P and the softmax's temporaries in
   Q's registers, so every tile after the first multiplied K by the previous tile's P; the GPU
   tests caught it only on a Hopper machine.
 - No local memory: a kernel that spills (LDL / STL) runs, and passes every test, at a fraction of
   its speed; the wide kernel's consumers run within the registers setmaxnreg gives them.
 - The softmax overlaps the previous tile's P V: in the tile loop, the softmax's exponentials
   (MUFU.EX2, at least one a score of a 64-key tile) lie between the wait for S (WARPGROUP.DEPBAR
   gsb0 <= 1) and the wait for P V (<= 0). ptxas hoists that wait above the softmax unless
   something holds it (prefill_wgmma.cuh, pipelined_step), which costs nothing in correctness and
   the overlap in speed.
This check catches both wherever the CUDA code is compiled, GPU or not.

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


# Exponentials a thread computes for a 64-key tile: 64 keys x 2 rows over the 4 lanes of a row.
MIN_EXP2_BEFORE_PV_WAIT = 32


def softmax_before_pv_wait(name, code, lo, hi):
    """Problems with the order of the waits and the softmax in the tile loop [lo, hi]."""
    body = [text for at, text in code if lo <= at <= hi]
    s_wait = next((i for i, t in enumerate(body) if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in t), None)
    if s_wait is None:
        return [f"{name}: no wait for S (WARPGROUP.DEPBAR.LE gsb0, 0x1) in the tile loop"]
    pv_wait = next((i for i in range(s_wait + 1, len(body)) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in body[i]), None)
    if pv_wait is None:
        return [f"{name}: no wait for P V (WARPGROUP.DEPBAR.LE gsb0, 0x0) after the wait for S"]
    exps = sum("MUFU.EX2" in t for t in body[s_wait:pv_wait])
    if exps < MIN_EXP2_BEFORE_PV_WAIT:
        return [f"{name}: {exps} exponentials between the waits for S and for P V (at least {MIN_EXP2_BEFORE_PV_WAIT}): "
                f"the softmax runs after the previous tile's P V instead of beside it"]
    return []


LOCAL_MEMORY = re.compile(r"\b(LDL|STL)\b")


def check_function(name, code):
    spills = [f"{at:#06x} {text}" for at, text in code if LOCAL_MEMORY.search(text)]
    if spills:
        return [f"{name}: {len(spills)} local-memory accesses (spills), first: {spills[0]}"]
    q_regs, p_regs, s_from_smem = set(), set(), False
    for _, a, pv in hgmmas(code):
        if a is None:
            s_from_smem = True
        else:
            (p_regs if pv else q_regs).update(range(a, a + 4))  # P V: B = V transposed; else S = Q K^T
    if not q_regs and not s_from_smem:
        return [f"{name}: no S = Q K^T wgmma found"]
    loop = tile_loop(code)
    if not loop:
        return [f"{name}: no loop around the S wgmmas"]
    lo, hi = loop
    problems = softmax_before_pv_wait(name, code, lo, hi)
    if s_from_smem:
        print(f"{name}: Q in shared memory, tile loop [{lo:#x}, {hi:#x}]: {'FAIL' if problems else 'ok'}")
        return problems
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
