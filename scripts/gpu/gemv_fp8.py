"""One-row Linears as a decode step reads them, RANDOM WEIGHTS, on the GPU machine: cuBLAS
(F.linear on bf16 weights), kernels.fp8_linear's MMA kernel (its former default tile and
another) and kernels.gemv (the CUDA cores, no MMA) over a set of tiles, FP8 ones on a few
tiles with ``GEMV_X_WIDE`` too (read in x's layout); the LM heads too.
Every call reads weights no call before it read in the last ~512 MB, as a step does (the same
weights back to back would sit in the 50 MB L2): each shape is held in enough copies and the
calls go round them. GPU time per call in a CUDA graph (median of 30 replays) and the weight
bytes read per second.

Then the chain, twice: the four Linears of each of 8 layers in order, launched with PDL as the
engine launches them, per layer: the MMA kernel (the path before; bf16 with the engine's
tiles), gemv's default tile with 1, 2 or 4 weight tiles loaded before the PDL wait, and the
best gemv tile of each shape.

Usage (GPU machine, repo root): python3 scripts/gpu/gemv_fp8.py [OUT.json] [8b,1b,8b-bf16]
[sweep|chain]
"""

import itertools
import json
import sys

import torch

from voicert.bench.fp8 import SHAPE_SETS, _linear, time_graph
from voicert.engine.gpu import kernels
from voicert.engine.gpu.fp8 import Fp8Linear

ROTATE_BYTES = 512 << 20
MMA_TILES = [(16, 32, 256, 4, 4), (16, 64, 128, 4, 4)]  # (BM, BN, BK, warps, stages)
# (BN, BK, warps) for kernels.gemv; the split over K by its default rule
GEMV_TILES = [(bn, bk, w) for bn, bk, w in itertools.product((4, 8, 16), (256, 512, 1024), (4, 8))]
# K split in 2 or 4 (more programs, more bytes in flight: o and down at 1B, 512 tiles)
GEMV_TILES += [(4, 1024, 4, 2), (4, 1024, 4, 4), (4, 512, 4, 2), (8, 1024, 4, 2)]
XWIDE_TILES = [kernels.matvec.GEMV_TILE, (8, 1024, 4), (4, 512, 4), (8, 512, 4), (4, 1024, 8)]
HEADS = {"llama-8b": ("head", 128256, 4096), "llama-1b": ("head", 128256, 2048)}


def _copies(nbytes: int) -> int:
    return max(4, -(-ROTATE_BYTES // nbytes))


def _rotating(fns: list):
    it = itertools.cycle(fns)
    return lambda: next(it)()


def _weights(n: int, k: int, fp8: bool, copies: int):
    """``copies`` random weights [n, k]: (weight, scale or None, bytes each)."""
    out = []
    for _ in range(copies):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        if fp8:
            q = Fp8Linear.from_linear(_linear(w))
            out.append((q.weight, q.scale, q.weight.nbytes + q.scale.nbytes))
        else:
            out.append((w, None, w.nbytes))
    return out


def _time(ws, x, count, call) -> float:
    return time_graph(_rotating([lambda w=w, s=s: call(x, w, s, count) for w, s, _ in ws]), len(ws))


def _mma(n: int, k: int, fp8: bool, tiles: dict) -> tuple:
    """The MMA kernel's tile at one row before gemv: bf16 weights from the engine's table
    (``tiles``, bf16 only), FP8 ones by ``fp8_blocks`` as ``Fp8Linear`` took it."""
    return (not fp8 and tiles.get((n, k))) or kernels.fp8_blocks(1, n, k, 1 if fp8 else 2)[:5]


def _key(label: str, name: str, n: int, k: int, fp8: bool) -> str:
    """A shape's entry in the sweep's results."""
    return f"{label} {name} {n}x{k} {'fp8' if fp8 else 'bf16'}"


def _best(cell: dict) -> tuple[float, str]:
    return min((v, key) for key, v in cell.items() if key.startswith("gemv "))


def sweep(label: str, fp8: bool, tiles: dict) -> dict:
    """Each Linear of ``label``'s shape set and its LM head (FP8 ones in FP8) at one row: us per
    call, each path and tile."""
    results = {}
    count = kernels.counters("cuda", 1 << 16)
    for name, n, k in SHAPE_SETS[label] + [HEADS[label]]:
        ws = _weights(n, k, fp8, _copies(n * k * (1 if fp8 else 2)))
        bf = ws if not fp8 else _weights(n, k, False, _copies(n * k * 2))
        nbytes = ws[0][2]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        w0, s0, _ = ws[0]
        want = torch.nn.functional.linear(
            x.float(), w0.float() * (1 if s0 is None else s0[:, None])
        )
        cell = {
            "cublas_bf16": _time(bf, x, count, lambda x, w, s, c: torch.nn.functional.linear(x, w))
        }
        for tile in [_mma(n, k, fp8, tiles), *MMA_TILES]:
            cell["mma " + "x".join(map(str, tile))] = _time(
                ws, x, count, lambda x, w, s, c, t=tile: kernels.fp8_linear(x, w, s, None, c, t)
            )
        for tile in GEMV_TILES:
            got = kernels.gemv(x, w0, s0, None, count, tile).float()
            err = ((got - want).abs().max() / want.abs().max()).item()
            assert err < 2e-2, (name, tile, err)
            cell["gemv " + "x".join(map(str, tile))] = _time(
                ws, x, count, lambda x, w, s, c, t=tile: kernels.gemv(x, w, s, None, c, t)
            )
        cell["default"] = _time(
            ws, x, count, lambda x, w, s, c: kernels.fp8_linear(x, w, s, None, c)
        )
        wide = (
            kernels.matvec.GEMV_X_WIDE
        )  # FP8 weights read in x's layout (no shared memory a step)
        for tile in XWIDE_TILES if fp8 else ():
            kernels.matvec.GEMV_X_WIDE = True
            got = kernels.gemv(x, w0, s0, None, count, tile).float()
            assert ((got - want).abs().max() / want.abs().max()).item() < 2e-2, (name, tile)
            cell["xwide " + "x".join(map(str, tile))] = _time(
                ws, x, count, lambda x, w, s, c, t=tile: kernels.gemv(x, w, s, None, c, t)
            )
            kernels.matvec.GEMV_X_WIDE = wide
        mma = cell["mma " + "x".join(map(str, _mma(n, k, fp8, tiles)))]
        best = _best(cell)
        gbs = lambda t, b=nbytes: b / t / 1e3
        print(
            f"| {label} {name} {n}x{k} {'FP8' if fp8 else 'bf16'} | "
            f"{cell['cublas_bf16']:.1f} ({n * k * 2 / cell['cublas_bf16'] / 1e3:.0f}) | "
            f"{mma:.1f} ({gbs(mma):.0f}) | {cell['default']:.1f} ({gbs(cell['default']):.0f}) | "
            f"{best[1]} {best[0]:.1f} ({gbs(best[0]):.0f}) | "
            + " ".join(f"{key} {v:.1f}" for key, v in cell.items() if key.startswith("xwide"))
            + " |",
            flush=True,
        )
        results[_key(label, name, n, k, fp8)] = cell
    return results


def chain(label: str, fp8: bool, results: dict, tiles: dict, layers: int = 8) -> None:
    """The four Linears of ``layers`` layers in order under PDL, us per layer: the MMA kernel,
    gemv's default tile with 1, 2 and 4 weight tiles loaded before the PDL wait, and (after a
    sweep, ``results``) each shape's best gemv tile."""
    shapes = SHAPE_SETS[label]
    ws = {name: _weights(n, k, fp8, layers) for name, n, k in shapes}
    xs = {name: torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for name, n, k in shapes}
    ways = {
        f"pre{p}": {name: (*kernels.matvec.GEMV_TILE, 0, p) for name, _, _ in shapes}
        for p in (1, 2, 4)
    }
    if results:
        ways["best"] = {
            name: tuple(
                int(v)
                for v in _best(results[_key(label, name, n, k, fp8)])[1].split()[1].split("x")
            )
            for name, n, k in shapes
        }
    count = kernels.counters("cuda", 1 << 16)

    def run(how: str) -> float:
        def step():
            for i in range(layers):
                for name, n, k in shapes:
                    w, s, _ = ws[name][i]
                    if how == "mma":
                        t = _mma(n, k, fp8, tiles)
                        kernels.fp8_linear(xs[name], w, s, None, count, t, pdl=True)
                    else:
                        kernels.gemv(xs[name], w, s, None, count, ways[how][name], pdl=True)

        return time_graph(step, 1) / layers

    nbytes = sum(ws[name][0][2] for name, _, _ in shapes)
    times = {how: run(how) for how in ["mma", *ways]}
    print(
        f"{label} {'FP8' if fp8 else 'bf16'}, chain of {layers} layers, one row, PDL, us a "
        "layer (GB/s): "
        + " | ".join(f"{h} {t:.1f} ({nbytes / t / 1e3:.0f})" for h, t in times.items())
        + f" | best {ways.get('best')}",
        flush=True,
    )


def main(out: str = "", sets: str = "8b,1b", sweep_too: str = "sweep") -> None:
    """``sets``: 8b (FP8), 1b (bf16) and/or 8b-bf16; ``sweep_too``: "chain" for the chains
    alone."""
    tiles = kernels.linear_tiles(torch.cuda.get_device_name(), torch.bfloat16)  # as the engine
    chosen = [(f"llama-{s.removesuffix('-bf16')}", s == "8b") for s in sets.split(",")]
    results = {}
    if sweep_too == "sweep":
        print(f"# {torch.cuda.get_device_name()}; us per call (GB/s of weights), one row\n")
        print(
            "| Linear | cuBLAS bf16 | MMA kernel (before) | default (gemv) | best gemv | X_WIDE |"
        )
        print("|---|---:|---:|---:|---:|---|")
        for label, fp8 in chosen:
            results.update(sweep(label, fp8, tiles))
        if out:
            with open(out, "w") as f:
                json.dump(results, f, indent=1)
    for label, fp8 in chosen:
        for _ in range(2):
            chain(label, fp8, results, tiles)


if __name__ == "__main__":
    main(*sys.argv[1:])
