"""The SASS of a one-row INT4 kernel's K loop, compiled offline for sm_90 (no GPU needed):
instructions a step, by opcode, and registers, as docs/benchmarks.md 65-68 count them. Triton
compiles the kernel at Llama-8B's K (4096), 2 rows x 128 words a step, one warp, groups of 128,
shapes even, with the divisibility hints a launch gives; cuobjdump (Triton's) disassembles it;
the loop is the span from a backward branch's target to the branch.

Usage (repo root): python scripts/sass_loop.py [int4_gemv|int4_gemv_a8] [UNROLL, default 1]
"""

import collections
import pathlib
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from voicert.engine.gpu import kernels

_COMMON = {"K": 4096, "HAS_BIAS": False, "SPLIT": 1, "BLOCK_N": 2, "BLOCK_G": 8, "GROUP": 128}
_PTRS = ("s_ptr", "l_ptr", "b_ptr", "out_ptr", "part_ptr", "count_ptr")
KERNELS = {  # name: (kernel, its pointer and integer arguments' types, its other constants)
    "int4_gemv": (
        kernels.int4_matmul._int4_gemv_kernel,
        {"p_ptr": "*fp32", "w_ptr": "*i32"},
        {"ONE": "i32"},
        {"EVEN": True, "A8": False, "EMULATE": False, "PDL": True},
    ),
    "int4_gemv_a8": (
        kernels.int4_matmul._int4_gemv_kernel,
        {"p_ptr": "*i32", "w_ptr": "*i32"},
        {"ONE": "i32"},
        {"EVEN": True, "A8": True, "EMULATE": False, "PDL": True},
    ),
}
_TYPES = {"s_ptr": "*fp16", "l_ptr": "*fp16", "b_ptr": "*bf16", "out_ptr": "*bf16"}


def compile_cubin(name: str, unroll: int) -> bytes:
    """The named kernel's cubin for sm_90, as described above."""
    fn, ptrs, ints, consts = KERNELS[name]
    sig = dict(ptrs)
    sig.update({p: _TYPES.get(p, "*fp32" if p == "part_ptr" else "*i32") for p in _PTRS})
    sig.update({"N": "i32", "k_per_split": "i32", **ints})
    constants = {**_COMMON, **consts, "UNROLL": unroll}
    order = list(fn.arg_names)
    sig = {a: sig.get(a, "constexpr") for a in order}
    hinted = [i for i, a in enumerate(order) if a.endswith("_ptr") or a in ("N", "k_per_split")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in hinted}
    src = ASTSource(fn, sig, constants, attrs)
    options = {"num_warps": 1, "num_stages": 1}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["cubin"]


def cuobjdump(cubin: bytes, flag: str) -> str:
    """Triton's cuobjdump on the cubin (``-sass`` or ``-res-usage``)."""
    tool = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), flag, f.name], capture_output=True, text=True).stdout


def loops(sass: str) -> list[tuple[int, collections.Counter]]:
    """Each loop of the SASS (a backward branch): its instructions, and their opcodes."""
    ins = [
        (int(m.group(1), 16), m.group(2))
        for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", sass)
    ]
    at = {a: i for i, (a, _) in enumerate(ins)}
    out = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"BRA\s+0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in at:
            body = [t for _, t in ins[at[int(m.group(1), 16)] : i + 1]]
            ops = collections.Counter(
                re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body
            )
            out.append((len(body), ops))
    return out


def main(name: str = "int4_gemv", unroll: str = "1") -> None:
    cubin = compile_cubin(name, int(unroll))
    regs = re.search(r"REG:(\d+)", cuobjdump(cubin, "-res-usage"))
    print(f"{name}, UNROLL {unroll}, sm_90: {regs.group(1) if regs else '?'} registers")
    for count, ops in loops(cuobjdump(cubin, "-sass")):
        print(f"  a loop of {count} instructions: {dict(ops.most_common(14))}")


if __name__ == "__main__":
    main(*sys.argv[1:])
