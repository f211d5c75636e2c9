"""Every Triton kernel compiled offline for a GPU (no GPU needed), as the kernel tests launch
them: before device time is spent, this finds what only the compiler refuses (a constexpr that
is not one, a type the MMA does not take, an op the target lacks), which Triton's interpreter,
where CI runs the kernels, lets pass.

1. ``record``: tests/engine/test_kernels.py runs in Triton's interpreter, on CPU tensors, and
   each launch is written down: the kernel, its arguments' types as Triton specializes a
   launch's (an integer 1 a constant; pointers and multiples of 16 hinted divisible by 16;
   tensor descriptors by their blocks), its constants and its compile options.
2. ``compile``: each distinct launch is compiled by Triton's own compiler for the target
   (sm_90 by default) down to a cubin, in a process without the interpreter, with the
   constants a GPU's launch sets (``AS_SERVED``: no emulated dp4a); on sm_90 and newer each
   also with PDL on, as served there (the interpreter launches without it). A launch whose
   shared memory is over the target's limit counts as failed: the GPU would refuse it.

Usage (repo root):
    python scripts/compile_kernels.py [--arch 90] [--record-only | --from launches.json]
      [-k PYTEST_EXPR] [--out launches.json]
It prints one line a distinct launch that failed and a count; exit 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = "tests/engine/test_kernels.py"
OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl", "enable_fp_fusion")
# Shared memory a block may take at most, by compute capability (the CUDA guide's opt-in limit):
# a launch over it compiles and then fails on the GPU (Triton's OutOfResources), so count it here.
SHARED_LIMIT = {
    80: 166912,
    86: 101376,
    87: 166912,
    89: 101376,
    90: 232448,
    100: 232448,
    120: 101376,
}
AS_SERVED = {"EMULATE": False}  # constants a launch on CPU tensors sets as no GPU's launch does


def _arg_type(value) -> tuple[str, object, bool]:
    """(signature type, constant value or None, divisible by 16) of one runtime argument, by
    Triton's own specialization of a launch's arguments (a tensor a pointer type, a tensor
    descriptor its block type, an integer 1 or None a constant)."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    kind, key = native_specialize_impl(BaseBackend, value, False, True, True)
    if kind == "constexpr":
        return kind, key, False
    return kind, None, key == "D"


def _record_launch(fn, args, kwargs, out: list) -> None:
    """One interpreted launch of ``fn`` (a JITFunction's Python function) written down."""
    import inspect

    params = list(inspect.signature(fn).parameters.values())
    bound = dict(zip([p.name for p in params], args))
    bound.update({k: v for k, v in kwargs.items() if k not in OPTIONS})
    sig, consts, hinted = {}, {}, []
    for i, p in enumerate(params):
        value = bound.get(p.name, p.default)
        if "constexpr" in str(p.annotation):
            sig[p.name] = "constexpr"
            consts[p.name] = value
            continue
        kind, const, even = _arg_type(value)
        sig[p.name] = kind
        if kind == "constexpr":
            consts[p.name] = const
        elif even:
            hinted.append(i)
    options = {k: v for k, v in kwargs.items() if k in OPTIONS}
    out.append(
        {
            "kernel": f"{fn.__module__}:{fn.__name__}",
            "signature": sig,
            "constants": consts,
            "hinted": hinted,
            "options": options,
        }
    )


def record_launches(out: list) -> None:
    """From now on, each launch in Triton's interpreter is written down in ``out`` (as
    :func:`_record_launch` does) before it runs."""
    from triton.runtime import interpreter

    run = interpreter.InterpretedFunction.run

    def recording(self, *args, grid, warmup, **kwargs):
        _record_launch(self.fn, args, kwargs, out)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    interpreter.InterpretedFunction.run = recording


def record(path: Path, expr: str | None) -> int:
    """Runs the kernel tests in the interpreter, writing their distinct launches to ``path``;
    pytest's exit status."""
    os.environ["TRITON_INTERPRET"] = "1"
    import pytest

    launches: list = []
    record_launches(launches)
    own = "not compiles_for_hopper"  # (the module's own lighter compile check: all here)
    argv = [TESTS, "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-x"]
    status = pytest.main([*argv, "-k", f"({expr}) and {own}" if expr else own])
    distinct = {json.dumps(launch, sort_keys=True) for launch in launches}
    path.write_text(json.dumps([json.loads(d) for d in sorted(distinct)], indent=1))
    print(f"{len(launches)} launches, {len(distinct)} distinct: {path}")
    return int(status)


def compile_all(path: Path, arch: int) -> int:
    """Compiles each launch in ``path`` for sm_``arch``; how many failed."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "compile without the interpreter"
    target = GPUTarget("cuda", arch, 32)
    failed = 0
    launches = json.loads(path.read_text())
    for launch in launches:
        launch["constants"].update({k: v for k, v in AS_SERVED.items() if k in launch["constants"]})
    if arch >= 90:  # served on Hopper with PDL, which the interpreter's launches leave off
        launches += [_with_pdl(launch) for launch in launches]
        launches = [
            json.loads(d) for d in sorted({json.dumps(x, sort_keys=True) for x in launches})
        ]
    skipped = [launch for launch in launches if _not_on(launch, arch)]
    launches = [launch for launch in launches if not _not_on(launch, arch)]
    t0 = time.perf_counter()
    for launch in launches:
        module, name = launch["kernel"].split(":")
        fn = getattr(importlib.import_module(module), name)
        attrs = {(i,): [["tt.divisibility", 16]] for i in launch["hinted"]}
        src = ASTSource(fn, launch["signature"], launch["constants"], attrs)
        options = {k: v for k, v in launch["options"].items() if k != "launch_pdl"}
        if launch["options"].get("launch_pdl"):
            options["launch_pdl"] = True
        try:
            shared = triton.compile(src, target=target, options=options).metadata.shared
            limit = SHARED_LIMIT.get(arch, SHARED_LIMIT[90])
            if shared > limit:
                raise RuntimeError(f"shared memory {shared} bytes, over sm_{arch}'s {limit}")
        except Exception as exc:  # the compiler's own words, one line a failure
            failed += 1
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            said = lines[0] if len(lines) == 1 else f"{lines[0]} {lines[-1]}"  # where, and why
            consts = {k: v for k, v in launch["constants"].items() if v is not None}
            print(f"FAILED {name} {consts} {launch['options']}: {said}")
    took = time.perf_counter() - t0
    kernels = len({launch["kernel"] for launch in launches})
    print(
        f"sm_{arch}: {len(launches) - failed} of {len(launches)} launches of {kernels} kernels "
        f"compiled ({took:.0f} s)"
        + (
            f"; {len(skipped)} left out, which never run there ({_not_on.__doc__})"
            if skipped
            else ""
        )
    )
    return failed


def _with_pdl(launch: dict) -> dict:
    """The launch as a Hopper serves it: a kernel's PDL constant on and launched with PDL."""
    if "PDL" not in launch["constants"]:
        return launch
    return {
        **launch,
        "constants": {**launch["constants"], "PDL": True},
        "options": {**launch["options"], "launch_pdl": True},
    }


def _not_on(launch: dict, arch: int) -> str | None:
    """PDL below sm_90, FP8 below sm_89"""
    pdl = launch["constants"].get("PDL") or launch["options"].get("launch_pdl")
    fp8 = any(t.startswith("*fp8") for t in launch["signature"].values())
    return ("PDL" if pdl and arch < 90 else None) or ("FP8" if fp8 and arch < 89 else None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (default 90)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/voicert-kernel-launches.json"))
    ap.add_argument("--from", dest="source", type=Path, help="compile launches recorded before")
    ap.add_argument("--record-only", action="store_true")
    ap.add_argument("-k", dest="expr", help="only the kernel tests pytest's -k selects")
    args = ap.parse_args()
    if args.record_only:
        return record(args.out, args.expr)
    source = args.source
    if source is not None and not source.is_file():
        print(f"--from {source}: no such file (write one with --record-only --out)")
        return 2
    if source is None:
        cmd = [sys.executable, __file__, "--record-only", "--out", str(args.out)]
        status = subprocess.run(
            cmd + (["-k", args.expr] if args.expr else []), cwd=ROOT, check=False
        ).returncode
        if status:
            print(f"the kernel tests failed in the interpreter (exit {status})")
            return status
        source = args.out
    env_ok = os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    if not env_ok:
        print("unset TRITON_INTERPRET to compile")
        return 2
    return 1 if compile_all(source, args.arch) else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
