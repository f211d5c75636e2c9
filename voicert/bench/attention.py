"""Attention kernels side by side, per phase: ``python -m voicert.bench.attention``.

For the prompt and context lengths voice turns use (a system prompt and history of a few hundred
tokens, mostly cached; a turn's new text of tens to hundreds of tokens; replies decoded one token,
or 1 + k drafts, at a time), each case times one layer's attention over the engine's paged KV
pool (random K/V; block tables shuffled, as a pool in use is):

- ``triton``: our paged kernel (engine/gpu/kernels/attention.py), straight from the pool, over
  tiles of query tokens: what the engine runs for decode and verify steps, and for prefill
  steps with ``llm.prefill_attention: paged`` (and ``auto`` where FlashAttention-4 does not
  import);
- ``gather+sdpa``: each row's blocks gathered, then PyTorch SDPA under the causal mask: what the
  engine ran for prefill steps before (``llm.prefill_attention: sdpa``; engine/models/layers.py
  ``Attention.attend``);
- ``flash``: FlashAttention-4 (the ``flash-attn-4`` package, CuTe DSL, Hopper and newer),
  ``flash_attn_varlen_func`` straight from the same pool (``page_table``, ``seqused_k``, causal);
- ``flash@128``: the same over a pool of 128-token pages (the size its TMA loads take whole;
  the engine's prefix cache shares 16-token blocks, so this is what a larger block would buy);
- ``triton@KEYS[:STAGES[:WARPS]]``: our paged kernel with a decode program's keys per inner
  step (``_DECODE_BLOCK_N``) and, given, its key loop's pipeline stages (``_DECODE_STAGES``)
  and its warps (``_DECODE_WARPS``) set: the tiles to try for decode steps of many streams,
  e.g. ``triton@64:2`` or ``triton@128:2:8``.

Each figure is GPU time per call inside a CUDA graph of ``--calls`` calls (as the engine replays
its steps: host overhead excluded), P50 and P99 over ``--replays`` replays, after a warm-up.
Every backend's output is checked against float32 SDPA over exactly each row's keys; the table
gives the largest absolute difference. The last column's ratio is against ``triton`` for decode
and verify steps, and against ``gather+sdpa`` (what ran before the paged prefill) for prefill.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from voicert.bench.cuda_time import graph_times

# (query heads, KV heads, head dim) of the shapes we serve
HEADS = {"llama-1b": (32, 8, 64), "llama-8b": (32, 8, 128), "smollm2": (9, 3, 64)}
BACKENDS = ("triton", "gather+sdpa", "flash", "flash@128")


@dataclass(frozen=True)
class Case:
    """One layer's attention: ``batch`` rows, each with ``new`` query tokens at the end of
    ``context`` keys (the cached prefix plus the new tokens)."""

    batch: int
    new: int
    context: int

    @property
    def phase(self) -> str:
        return "decode" if self.new == 1 else "verify" if self.new <= 4 else "prefill"

    @classmethod
    def parse(cls, text: str) -> Case:
        """``BxNxL``: batch x new tokens x context, e.g. ``8x1x600``."""
        try:
            b, n, ctx = (int(v) for v in text.lower().split("x"))
        except ValueError:
            raise ValueError(f"case {text!r}: expected BATCHxNEWxCONTEXT, e.g. 8x1x600") from None
        if not (b >= 1 and 1 <= n <= ctx):
            raise ValueError(f"case {text!r}: needs batch >= 1 and 1 <= new <= context")
        return cls(b, n, ctx)


DEFAULT_CASES = (
    "1x1x600",
    "8x1x600",
    "32x1x1024",
    "64x1x2048",
    "1x1x4096",  # decode
    "1x3x600",
    "16x3x1024",  # verify (2 drafts)
    "1x32x600",
    "1x128x600",
    "1x600x600",
    "4x128x600",
    "16x64x1024",
)  # prefill


@dataclass
class Pool:
    """Random K/V in the engine's paged layout, and one case's query over it."""

    k: torch.Tensor  # [NB, BS, KVH, D]; block 0 is the scratch block no row uses
    v: torch.Tensor  # [NB, BS, KVH, D]
    tables: torch.Tensor  # [B, MB] int64, each row's blocks in order
    positions: torch.Tensor  # [B, Q] int64, the new tokens' positions
    qkv: torch.Tensor  # [B, Q, (H + 2 KVH) * D], q heads first (the fused kernels' input)
    q: torch.Tensor  # [B, Q, H, D], a view of qkv

    @property
    def block_size(self) -> int:
        return self.k.shape[1]


def make_pool(
    case: Case,
    heads: tuple[int, int, int],
    block_size: int,
    dtype: torch.dtype,
    device: str,
    seed: int = 0,
) -> Pool:
    h, kvh, d = heads
    g = torch.Generator(device="cpu").manual_seed(seed)
    per_row = -(-case.context // block_size)
    nb = 1 + case.batch * per_row
    k = torch.randn(nb, block_size, kvh, d, generator=g).to(device, dtype)
    v = torch.randn(nb, block_size, kvh, d, generator=g).to(device, dtype)
    tables = (1 + torch.randperm(nb - 1, generator=g)).view(case.batch, per_row).to(device)
    first = case.context - case.new
    positions = (first + torch.arange(case.new)).expand(case.batch, -1).contiguous().to(device)
    qkv = torch.randn(case.batch, case.new, (h + 2 * kvh) * d, generator=g).to(device, dtype)
    q = qkv.view(case.batch, case.new, h + 2 * kvh, d)[:, :, :h]
    return Pool(k, v, tables, positions, qkv, q)


def repage(pool: Pool, block_size: int) -> Pool:
    """The same keys and values, each row's in order, in a pool of ``block_size``-token pages."""
    b, mb = pool.tables.shape
    span = mb * pool.block_size
    per_row = -(-span // block_size)
    kvh, d = pool.k.shape[2:]

    def lay(src: torch.Tensor) -> torch.Tensor:
        rows = src.index_select(0, pool.tables.view(-1)).view(b, span, kvh, d)  # [B, L, KVH, D]
        rows = F.pad(rows, (0, 0, 0, 0, 0, per_row * block_size - span))
        scratch = torch.zeros(1, block_size, kvh, d, dtype=src.dtype, device=src.device)
        return torch.cat([scratch, rows.view(b * per_row, block_size, kvh, d)])

    tables = 1 + torch.arange(b * per_row, device=pool.tables.device).view(b, per_row)
    return Pool(lay(pool.k), lay(pool.v), tables, pool.positions, pool.qkv, pool.q)


def reference(pool: Pool, heads: tuple[int, int, int]) -> torch.Tensor:
    """float32 SDPA of each row over exactly its keys: [B, Q, H * D]."""
    from voicert.engine.models.layers import causal_mask

    h, kvh, d = heads
    b, q_len = pool.q.shape[:2]
    span = pool.tables.shape[1] * pool.block_size
    keys = pool.k.index_select(0, pool.tables.view(-1)).view(b, span, kvh, d).float()
    vals = pool.v.index_select(0, pool.tables.view(-1)).view(b, span, kvh, d).float()
    mask = causal_mask(pool.positions, span, torch.float32)  # [B, 1, Q, L]
    out = F.scaled_dot_product_attention(
        pool.q.float().transpose(1, 2),
        keys.transpose(1, 2),
        vals.transpose(1, 2),
        attn_mask=mask,
        enable_gqa=h != kvh,
    )  # [B, H, Q, D]
    return out.transpose(1, 2).reshape(b, q_len, h * d)


def triton_tiles(name: str) -> tuple[int, int, int] | None:
    """``triton@KEYS[:STAGES[:WARPS]]`` -> (KEYS, STAGES, WARPS; 0: the default), None for
    any other name. Raises ValueError for such a name whose KEYS is not a power of two from
    16 to 256, whose STAGES is not 1-4 or whose WARPS is not 4 or 8."""
    if not name.startswith("triton@"):
        return None
    parts = name.removeprefix("triton@").split(":")
    try:
        keys, stages, warps = (int(p) for p in parts + ["0"] * (3 - len(parts)))
    except ValueError:
        keys = stages = warps = -1
    if (
        keys not in (16, 32, 64, 128, 256)
        or stages not in ((1, 2, 3, 4) if len(parts) > 1 else (0,))
        or warps not in ((4, 8) if len(parts) > 2 else (0,))
    ):
        raise ValueError(
            f"backend {name!r}: expected triton@KEYS[:STAGES[:WARPS]], KEYS a power of two "
            "from 16 to 256, STAGES 1-4, WARPS 4 or 8 (e.g. triton@64:2, triton@128:2:8)"
        )
    return keys, stages, warps


def backend(
    name: str, pool: Pool, heads: tuple[int, int, int], flash_splits: int = 1
) -> Callable[[], torch.Tensor]:
    """A call of backend ``name`` on ``pool`` returning [B, Q, H * D]. ``flash_splits``: FA4's
    ``num_splits`` (1: one program per row's keys, as the engine calls it; 0: its heuristic)."""
    h, kvh, d = heads
    b, q_len = pool.q.shape[:2]
    tiles = triton_tiles(name)
    if name == "triton" or tiles:
        from voicert.engine.gpu import kernels

        count = kernels.counters(pool.q.device)
        mod = kernels.attention
        chosen = tiles or (mod._DECODE_BLOCK_N, mod._DECODE_STAGES, mod._DECODE_WARPS)

        def paged() -> torch.Tensor:  # (the settings are read at launch: under capture too)
            saved = mod._DECODE_BLOCK_N, mod._DECODE_STAGES, mod._DECODE_WARPS
            mod._DECODE_BLOCK_N, mod._DECODE_STAGES, mod._DECODE_WARPS = chosen
            try:
                return kernels.paged_attention(
                    pool.qkv, pool.k, pool.v, pool.tables, pool.positions, h, kvh, count
                )
            finally:
                mod._DECODE_BLOCK_N, mod._DECODE_STAGES, mod._DECODE_WARPS = saved

        return paged
    if name == "gather+sdpa":
        from voicert.engine.models.layers import Attention, AttnInputs, causal_mask
        from voicert.engine.models.llama import LlamaConfig

        cfg = LlamaConfig(
            vocab_size=1,
            hidden_size=h * d,
            intermediate_size=1,
            num_layers=1,
            num_heads=h,
            num_kv_heads=kvh,
            head_dim=d,
            rms_norm_eps=1e-5,
            rope_theta=1e4,
            max_position=1 << 16,
            tie_word_embeddings=True,
        )
        layer = Attention(cfg)
        inp = AttnInputs(pool.positions, pool.positions.view(-1), pool.tables)
        mask = causal_mask(pool.positions, pool.tables.shape[1] * pool.block_size, pool.q.dtype)
        return lambda: layer.attend(pool.q, inp, mask, pool.k, pool.v)
    if name.startswith("flash"):
        from flash_attn.cute import flash_attn_varlen_func

        paged = repage(pool, 128) if name == "flash@128" else pool
        table = paged.tables.to(torch.int32)
        used = (pool.positions[:, -1] + 1).to(torch.int32)  # [B] keys each row sees
        q = pool.q.contiguous()  # [B, Q, H, D]

        def call() -> torch.Tensor:
            out = flash_attn_varlen_func(
                q,
                paged.k,
                paged.v,
                seqused_k=used,
                page_table=table,
                max_seqlen_q=q_len,
                causal=True,
                num_splits=flash_splits,
            )
            out = out[0] if isinstance(out, tuple) else out
            return out.reshape(b, q_len, h * d)

        return call
    raise ValueError(f"unknown backend {name!r}")


@dataclass
class Figure:
    p50_us: float | None = None
    p99_us: float | None = None
    max_err: float | None = None
    note: str = ""  # why there is no figure


def measure(case: Case, heads, args, flash_missing: str | None) -> dict[str, Figure]:
    dtype = getattr(torch, args.dtype)
    pool = make_pool(case, heads, args.block_size, dtype, "cuda")
    ref = reference(pool, heads)
    row: dict[str, Figure] = {}
    for name in args.backends:
        if name.startswith("flash") and flash_missing:
            row[name] = Figure(note="unavailable")
            continue
        try:
            fn = backend(name, pool, heads, args.flash_splits)
            err = (fn().float() - ref).abs().max().item()
            times = graph_times(fn, args.calls, args.replays)
        except Exception as exc:  # one backend failing a case is a finding, not the end of the run
            row[name] = Figure(note=f"failed: {type(exc).__name__}: {exc}"[:120])
            continue
        row[name] = Figure(float(np.percentile(times, 50)), float(np.percentile(times, 99)), err)
    return row


def baseline(case: Case) -> str:
    """What a case's figures are compared with: our paged kernel for decode and verify steps,
    gather + SDPA (what prefill steps ran before the paged kernel took them) for prefill."""
    return "gather+sdpa" if case.phase == "prefill" else "triton"


def render(label: str, results: list[tuple[Case, dict[str, Figure]]], backends) -> str:
    head = (
        "| phase | batch x new x context | "
        + " | ".join(backends)
        + " | fastest, against the baseline |"
    )
    lines = [
        f"### {label}",
        "",
        "GPU time per call, P50 (P99), in a CUDA graph; max |error| against float32 SDPA",
        "",
        head,
        "|---|---|" + "---:|" * len(backends) + "---|",
    ]
    for case, row in results:
        cells = []
        for name in backends:
            f = row.get(name, Figure(note="-"))
            cells.append(
                f.note
                if f.p50_us is None
                else f"{f.p50_us:.1f} ({f.p99_us:.1f}) us, err {f.max_err:.0e}"
            )
        timed = {n: f.p50_us for n, f in row.items() if f.p50_us is not None}
        base = baseline(case)
        best = min(timed, key=timed.get) if timed else "-"
        ratio = f"{best}, {timed[base] / timed[best]:.2f}x" if timed and base in timed else best
        lines.append(
            f"| {case.phase} | {case.batch} x {case.new} x {case.context} | "
            + " | ".join(cells)
            + f" | {ratio} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m voicert.bench.attention", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--shape", default="llama-1b", choices=sorted(HEADS))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--block-size", type=int, default=16, help="the engine's llm.block_size")
    ap.add_argument(
        "--cases", default=",".join(DEFAULT_CASES), help="comma-separated BATCHxNEWxCONTEXT"
    )
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument(
        "--flash-splits",
        type=int,
        default=1,
        help="FA4's num_splits (1: as the engine calls it; 0: FA4's heuristic)",
    )
    ap.add_argument("--calls", type=int, default=20, help="calls per captured graph")
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        cases = [Case.parse(c) for c in args.cases.split(",") if c.strip()]
        args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        unknown = {b for b in args.backends if triton_tiles(b) is None} - set(BACKENDS)
        if unknown:
            raise ValueError(
                f"--backends: unknown {sorted(unknown)} (known: {', '.join(BACKENDS)})"
            )
        if args.block_size not in (8, 16, 32, 64, 128, 256):
            raise ValueError("--block-size must be one of 8, 16, 32, 64, 128, 256")
    except ValueError as exc:
        ap.error(str(exc))
    if not torch.cuda.is_available():
        print(
            "bench.attention: needs a CUDA GPU (the kernels it compares run only there)",
            file=sys.stderr,
        )
        return 2
    heads = HEADS[args.shape]
    from voicert.engine.models.flash import unavailable

    flash_missing = unavailable("cuda", getattr(torch, args.dtype))
    results = []
    for case in cases:
        results.append((case, measure(case, heads, args, flash_missing)))
        print(f"attention: {case} done", file=sys.stderr, flush=True)
    label = (
        f"{args.shape} attention ({heads[0]} query heads, {heads[1]} KV heads, head dim "
        f"{heads[2]}), {args.dtype}, KV blocks of {args.block_size}, FA4 num_splits "
        f"{args.flash_splits}, {torch.cuda.get_device_name()}"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "label": label,
                    "rows": [
                        {
                            "case": vars(c) | {"phase": c.phase},
                            "backends": {n: vars(f) for n, f in row.items()},
                        }
                        for c, row in results
                    ],
                }
            )
        )
    else:
        print(render(label, results, args.backends))
        if flash_missing:
            print(f"\n(flash: {flash_missing})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
