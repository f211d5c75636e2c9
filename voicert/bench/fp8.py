"""FP8 weights, measured: ``python -m voicert.bench.fp8``.

Two tables:

- **quality**: top-1 agreement of the model with FP8 layer weights, or with a one-byte KV cache
  (``--quantize``: FP8 or INT8), with the unquantized one, teacher-forced over a
  fixed text set (every position's greedy next token, both models reading the same text), on the
  embedded SmolLM2's real weights (or ``--model``); and the voice prompt set's greedy replies
  side by side (token-identical replies, mean shared prefix);
- **kernels** (CUDA only): each Linear shape of the chosen model at decode batch sizes, the FP8
  kernel against ``F.linear`` on bf16 weights in the same process: time per call (CUDA graph of
  20 calls, median of repeats) and the weight bytes it read per second.

The issue's bar: top-1 agreement >= 97 % with the real weights.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from collections.abc import Callable
from typing import cast

import torch

from voicert.bench.cuda_time import graph_times
from voicert.engine.core.calibration import calibration_forward
from voicert.engine.core.runner import ModelRunner, Row
from voicert.engine.gpu.formats import E4M3_MAX
from voicert.engine.gpu.fp8 import FP8_GRID, Fp8Linear, quantize_fp8
from voicert.engine.gpu.int4 import GROUPS, Int4Linear, int8_groups, quantize_int4
from voicert.engine.models.layers import KV_DTYPES

# A fixed text set: voice-agent turns and plain prose, as the embedded model reads them.
TEXTS = [
    "Please confirm my order: two large pepperoni pizzas, one garlic bread and a diet cola.",
    "The capital of France is Paris. It lies on the Seine and has about two million people.",
    "I would like to book a table for four people tonight at seven thirty, near the window.",
    "To reset your password, open the settings page, choose security, then follow the link "
    "we send to your email address.",
    "The weather tomorrow will be cloudy in the morning with light rain in the afternoon and a "
    "high of fourteen degrees.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen inside the "
    "chloroplasts of plant cells.",
    "Your flight to London leaves from gate twelve at nine fifteen; boarding starts thirty "
    "minutes before departure.",
    "Count with me: one, two, three, four, five, six, seven, eight, nine, ten.",
    "Thank you for calling. Your appointment with Doctor Patel is on Tuesday the fourteenth at "
    "ten in the morning.",
    "Water boils at one hundred degrees Celsius at sea level, and at a lower temperature high in "
    "the mountains.",
]


def next_tokens(
    model, texts: list[list[int]], block_size: int = 16, kv_cache: str = "model"
) -> list[list[int]]:
    """The model's greedy next token after each position of each text (teacher-forced: one
    prefill of all the texts as rows of one step, through the engine's own runner; ``kv_cache``:
    int8 or fp8, its KV pool in one byte a value, which the prefill's attention reads back)."""
    rows, first = [], 1
    for ids in texts:
        blocks = -(-len(ids) // block_size)
        rows.append(Row(ids, 0, list(range(first, first + blocks)), 0))
        first += blocks
    return ModelRunner(model, first, block_size, kv_dtype=KV_DTYPES.get(kv_cache)).run_rows(rows)


def agreement(want: list[list[int]], got: list[list[int]]) -> tuple[int, int]:
    """(positions where ``got`` picks ``want``'s next token, positions), text by text."""
    same = sum(x == y for u, v in zip(want, got) for x, y in zip(u, v))
    return same, sum(map(len, want))


def top1_agreement(ref, quant, texts: list[list[int]], kv_cache: str = "model") -> tuple[int, int]:
    """(positions where both models pick the same next token, positions) over ``texts``
    (``kv_cache`` int8 / fp8: ``quant`` reads such a KV cache)."""
    return agreement(next_tokens(ref, texts), next_tokens(quant, texts, kv_cache=kv_cache))


def quantized_copy(model, tokenizer=None, quant: str = "fp8"):
    """A deep copy of ``model`` with FP8 (``quant`` "fp8") or INT4 ("int4") layer weights (the
    original is left as it is): rounded with GPTQ against the engine's calibration set given the
    ``tokenizer``, else to nearest."""
    q = copy.deepcopy(model)
    quantize = quantize_int4 if quant == "int4" else quantize_fp8
    quantize(q, calibration_forward(q, tokenizer) if tokenizer is not None else None)
    return q


VARIANTS = {
    "weights": "FP8 layer weights (GPTQ rounding, as served)",
    "weights-nearest": "FP8 layer weights (rounded to nearest)",
    "weights-nearest-a8": "FP8 layer weights (rounded to nearest), each Linear's rows rounded to "
    "FP8 too, a scale per row (what kernels.fp8_mm and fp8_scaled_mm serve)",
    "weights-a8-served": "FP8 layer weights (GPTQ rounding), a Linear's input rows rounded to FP8 "
    "where there are two or more, as served since kernels.fp8_mm (one-stream decode steps keep "
    "their row)",
    "int4": "INT4 layer weights, groups of {group} (GPTQ rounding, as served)",
    "int4-nearest": "INT4 layer weights, groups of {group} (rounded to nearest)",
    "int4-zero": "INT4 layer weights, groups of {group}, AWQ's grid (integer zeros; GPTQ)",
    "int4-zero-nearest": "INT4 layer weights, groups of {group}, AWQ's grid (nearest)",
    "int4-gguf": "INT4 from a GGUF model: its 4-bit layers as the file holds them (groups of 32), "
    "the rest FP8 (GPTQ), as served (llm.int4_gguf)",
    "int4-gguf-a8": "INT4 from a GGUF model as int4-gguf, each INT4 Linear's rows rounded to "
    "int8 too, a scale per row and group of the weights' (W4A8 on dp4a)",
    "int4-gguf-a8-served": "INT4 from a GGUF model as int4-gguf, an INT4 Linear's input rounded "
    "to int8 by group only where it is one row, as llm.int4_activations int8 serves it (a "
    "one-stream decode step; prompts keep x)",
    "kv-fp8": "FP8 KV cache",
    "kv-int8": "INT8 KV cache (a scale per token and KV head)",
}


def fp8_rows_reference(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] rounded as ``kernels.fp8_rows`` rounds a Linear's rows (e4m3, one scale per
    row: its largest magnitude maps to 448), widened back to x's dtype."""
    scale = x.float().abs().amax(-1, keepdim=True).clamp(min=1e-12) / E4M3_MAX  # [..., 1]
    return FP8_GRID.put(x.float(), scale, torch.zeros_like(scale)).to(x.dtype)


def _round_inputs(
    model: torch.nn.Module,
    kind: type,
    rounding: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor],
) -> int:
    """Round the input rows of each of ``model``'s modules of ``kind`` by ``rounding(module,
    x)`` before it runs (a forward pre-hook). Returns how many were hooked."""
    hooked = [m for m in model.modules() if isinstance(m, kind)]
    for m in hooked:
        m.register_forward_pre_hook(lambda mod, args: (rounding(mod, args[0]), *args[1:]))
    return len(hooked)


def round_linear_rows(model: torch.nn.Module, served: bool = False) -> int:
    """Round the input rows of each of ``model``'s FP8 Linears to FP8 before it runs
    (:func:`fp8_rows_reference`): the activations' side of W8A8 as the GPU serves it for many
    rows, on any device. ``served``: only inputs of two or more rows, as a bf16 model's FP8
    Linears take them (``kernels.fp8_mm`` and ``fp8_scaled_mm``; one row: ``kernels.gemv``).
    Returns how many Linears were hooked."""

    def rounding(_lin: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return x if served and _one_row(x) else fp8_rows_reference(x)

    return _round_inputs(model, Fp8Linear, rounding)


def _one_row(x: torch.Tensor) -> bool:
    """Whether a Linear's input x [..., K] is one row (a one-stream decode step's)."""
    return x.numel() == x.shape[-1]


def round_int4_rows(model: torch.nn.Module, one_row: bool = False) -> int:
    """Round the input rows of each of ``model``'s INT4 Linears to int8 in groups of its weights'
    group, as the kernel rounds them (``int4.int8_groups``): the activations' side of W4A8.
    ``one_row``: only an input of one row, what ``llm.int4_activations: int8`` does (int4.py
    ``a8_rounds``), whatever the dtype. Returns how many Linears were hooked."""

    def rounding(lin: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if one_row and not _one_row(x):
            return x
        return int8_groups(x, cast(Int4Linear, lin).group).to(x.dtype)

    return _round_inputs(model, Int4Linear, rounding)


def turn_texts(per_text: int = 8) -> list[str]:
    """A second, larger text set: the end-of-turn set's sentences (bench/turn_set.py, pauses
    removed), ``per_text`` to a text (~1250 tokens in all for SmolLM2's tokenizer)."""
    from voicert.bench.turn_set import ITEMS

    said = [" ".join(item.text.replace("|", " ").split()) for item in ITEMS]
    return [" ".join(said[i : i + per_text]) for i in range(0, len(said), per_text)]


def quality(
    model_name: str,
    device: str,
    dtype: str,
    variant: str = "weights",
    prompts: int = 0,
    group: int = 128,
    head: bool = False,
) -> dict:
    """Top-1 agreement over TEXTS and over :func:`turn_texts`, and the voice prompt set's
    replies (its first ``prompts``; 0: all), ``variant`` (a key of VARIANTS; INT4 in groups of
    ``group``; ``head``: the LM head too, to nearest) against ``dtype``. The reference's
    figures are taken first and the weights then quantized in place, so one copy of the model
    is held (a 1.5B model in fp32 on a 24 GB machine)."""
    import asyncio

    from transformers import AutoTokenizer

    from voicert.bench.engine import shared_prefix, voice_prompt_ids
    from voicert.config import cache_dir, load_config
    from voicert.core.llm import GenerationRequest
    from voicert.engine.clients.llm_engine import LLMEngine
    from voicert.engine.loader import resolve_llm
    from voicert.engine.models.llama import DTYPES
    from voicert.engine.models.registry import load_model
    from voicert.engine.settings import EngineConfig

    model_dir = str(resolve_llm(model_name, cache_dir(load_config(environ={}).models)))
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = load_model(model_dir, DTYPES[dtype], device)
    texts = [tok(t)["input_ids"] for t in TEXTS]
    more = [tok(t)["input_ids"] for t in turn_texts()]
    asked = voice_prompt_ids(tok)[: prompts or None]

    async def replies(kv_cache: str = "model") -> list[list[int]]:
        eng = LLMEngine(
            model_dir,
            EngineConfig(
                device=device,
                dtype=dtype,
                kv_memory_gb=0.25,
                kv_cache=kv_cache,
                torchscript=False,  # a CPU trace would fold INT4's widened weights in: fp32 again
            ),
            model=model,
            tokenizer=tok,
        )
        outs = []
        try:
            for ids in asked:
                req = GenerationRequest(f"q-{len(outs)}", [], 48, prompt_ids=ids)
                outs.append(
                    [ev.token_id async for ev in eng.submit(req) if ev.finish_reason is None]
                )
        finally:
            eng.close()
        return outs

    want, want_more = next_tokens(model, texts), next_tokens(model, more)
    a = asyncio.run(replies())
    gptq = variant in ("weights", "weights-a8-served", "int4", "int4-zero")
    gptq = gptq or variant.startswith("int4-gguf")
    calibrate = calibration_forward(model, tok) if gptq else None
    if variant.startswith("int4-gguf"):
        from voicert.engine.gpu.gguf import GgufFile, quantize_from_gguf
        from voicert.engine.loader import gguf_source

        source = gguf_source(model_dir)
        if source is None:
            raise ValueError(f"--quantize int4-gguf: {model_name} is not a .gguf model")
        quantize_from_gguf(model, GgufFile(source), calibrate, True, group, head)
        if variant.endswith("-a8"):
            round_int4_rows(model)
        elif variant.endswith("-a8-served"):
            round_int4_rows(model, one_row=True)
    elif variant.startswith("int4"):
        zero = variant.startswith("int4-zero")
        quantize_int4(model, calibrate, group=group, head=head, integer_zero=zero)
    elif variant.startswith("weights"):
        quantize_fp8(model, calibrate, head=head)
        if variant.endswith("-a8"):
            round_linear_rows(model)
        elif variant.endswith("-a8-served"):
            round_linear_rows(model, served=True)
    kv_cache = variant.removeprefix("kv-") if variant.startswith("kv-") else "model"
    same, total = agreement(want, next_tokens(model, texts, kv_cache=kv_cache))
    same_more, total_more = agreement(want_more, next_tokens(model, more, kv_cache=kv_cache))
    b = asyncio.run(replies(kv_cache))
    prefix = [shared_prefix(u, v) for u, v in zip(a, b)]
    return {
        "model": model_dir,
        "variant": variant,
        "group": group,
        "head": head,
        "same": same,
        "total": total,
        "same_more": same_more,
        "total_more": total_more,
        "identical": sum(u == v for u, v in zip(a, b)),
        "replies": len(a),
        "prefix": statistics.mean(prefix),
        "samples": [(tok.decode(u), tok.decode(v)) for u, v in zip(a[:3], b[:3])],
    }


def time_graph(fn, reps: int = 20, repeats: int = 30) -> float:
    """Median GPU time of one ``fn()`` call in us: ``reps`` calls captured in a CUDA graph,
    replayed ``repeats`` times between CUDA events."""
    return statistics.median(graph_times(fn, reps, repeats))


def kernels_table(
    shapes: list[tuple[str, int, int]],
    rows: list[int],
    blocks: list[tuple[int, ...] | None],
    kind: str = "fp8",
    group: int = 128,
) -> list[dict]:
    """Each (name, N, K) at each row count: bf16 F.linear against the ``kind`` kernel (fp8 or
    int4, in groups of ``group``; each block config in ``blocks``; None: the default choice),
    GPU time and the GB/s of the weight bytes each read (INT4: the codes, scales and lows)."""
    from voicert.engine.gpu import kernels

    out = []
    for name, n, k in shapes:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        if kind == "int4":
            q4 = Int4Linear.from_linear(_linear(w), None, group)
            nbytes = q4.weight.nbytes + q4.scale.nbytes + q4.low.nbytes

            def run(x, count, cfg, q4=q4):
                return kernels.int4_linear(x, q4.weight, q4.scale, q4.low, None, count, cfg)
        else:
            q8 = Fp8Linear.from_linear(_linear(w))
            nbytes = q8.weight.nbytes + q8.scale.nbytes

            def run(x, count, cfg, q8=q8):
                return kernels.fp8_linear(x, q8.weight, q8.scale, None, count, cfg)

        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = time_graph(lambda: torch.nn.functional.linear(x, w))
            row = {
                "name": name,
                "n": n,
                "k": k,
                "m": m,
                "bf16_us": ref,
                "bf16_gbs": n * k * 2 / ref / 1e3,
            }
            for cfg in blocks:
                count = kernels.counters(x.device)
                t = time_graph(lambda: run(x, count, cfg))
                key = "default" if cfg is None else "x".join(map(str, cfg))
                row[key] = (t, nbytes / t / 1e3)
            out.append(row)
    return out


def _linear(w: torch.Tensor) -> torch.nn.Linear:
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
    lin.weight.data.copy_(w)
    return lin


SHAPE_SETS = {  # (name, N, K) of each layer Linear, fused as the engine holds them
    "llama-1b": [
        ("qkv", 3072, 2048),
        ("o", 2048, 2048),
        ("gate_up", 16384, 2048),
        ("down", 2048, 8192),
    ],
    "llama-8b": [
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate_up", 28672, 4096),
        ("down", 4096, 14336),
    ],
}


def render_quality(q: dict) -> str:
    share = q["same"] / q["total"]
    share_more = q["same_more"] / q["total_more"]
    what = VARIANTS[q["variant"]].format(group=q["group"])
    if q["head"]:
        what += ", the LM head too (nearest)"
    lines = [
        f"model: {q['model']} (real weights)",
        "",
        f"| {what} against the unquantized model | value |",
        "|---|---:|",
        f"| top-1 agreement, teacher-forced over {len(TEXTS)} texts | {q['same']}/{q['total']}"
        f" = {share:.1%} |",
        f"| top-1 agreement, teacher-forced over the end-of-turn set's sentences | "
        f"{q['same_more']}/{q['total_more']} = {share_more:.1%} |",
        f"| voice prompt set: greedy replies token-identical (48 tokens at most) | "
        f"{q['identical']}/{q['replies']} |",
        f"| voice prompt set: mean shared prefix, tokens | {q['prefix']:.1f} |",
        "",
    ]
    lines += [f"- quantized:  {b!r}\n  ref:  {a!r}" for a, b in q["samples"]]
    return "\n".join(lines)


def render_kernels(rows: list[dict], kind: str = "fp8") -> str:
    keys = [k for k in rows[0] if k not in ("name", "n", "k", "m", "bf16_us", "bf16_gbs")]
    label = kind.upper()
    head = (
        "| shape | rows | bf16 F.linear us (GB/s) | "
        + " | ".join(f"{label} {k} us (GB/s)" for k in keys)
        + f" | {label} default vs bf16 |"
    )
    lines = [head, "|---|---:|---:|" + "---:|" * len(keys) + "---:|"]
    for r in rows:
        cells = " | ".join(f"{r[k][0]:.1f} ({r[k][1]:.0f})" for k in keys)
        lines.append(
            f"| {r['name']} {r['n']}x{r['k']} | {r['m']} | {r['bf16_us']:.1f} "
            f"({r['bf16_gbs']:.0f}) | {cells} | {r['bf16_us'] / r[keys[0]][0]:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m voicert.bench.fp8")
    ap.add_argument("--model", default="embedded", help="the model whose quality is measured")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--dtype",
        default=None,
        help="the reference's dtype (default: bfloat16 on a GPU, float32 on the CPU)",
    )
    ap.add_argument(
        "--shapes",
        default="llama-1b,llama-8b",
        help="kernel shapes (CUDA): " + ", ".join(SHAPE_SETS),
    )
    ap.add_argument("--rows", default="1,8,32,64")
    ap.add_argument(
        "--blocks",
        default="",
        help="extra tile configs to time: FP8 BMxBNxBKxWARPSxSTAGES[xSPLIT], INT4 "
        "BMxBNxWARPSxSTAGES[xSPLIT],... (no SPLIT: chosen as by default)",
    )
    ap.add_argument("--kernel", choices=("fp8", "int4"), default="fp8", help="the kernel table's")
    ap.add_argument("--no-quality", dest="quality", action="store_false")
    ap.add_argument("--prompts", type=int, default=0, help="voice prompts replied to (0: all ten)")
    ap.add_argument(
        "--int4-group", type=int, default=128, choices=GROUPS, help="INT4's input columns per scale"
    )
    ap.add_argument(
        "--quant-head",
        action="store_true",
        help="with FP8 / INT4 weights: the LM head in that format too (llm.quant_head)",
    )
    ap.add_argument(
        "--quantize",
        default="weights",
        help="what the quality tables quantize, comma-separated: weights (FP8, GPTQ "
        "rounding), weights-nearest (FP8, nearest), weights-nearest-a8 (and the rows in FP8), "
        "weights-a8-served (GPTQ, and rows of two or more in FP8, as served), "
        "int4, int4-nearest, int4-zero, int4-zero-nearest (AWQ's grid), int4-gguf (a .gguf "
        "model's own 4-bit layers), int4-gguf-a8 (and the INT4 Linears' rows in int8), "
        "int4-gguf-a8-served (only one-row inputs in int8, as served), kv-fp8, "
        "kv-int8 (the KV cache)",
    )
    args = ap.parse_args(argv)
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    try:
        shapes = [s for name in args.shapes.split(",") if name for s in SHAPE_SETS[name]]
        extra = [tuple(int(v) for v in b.split("x")) for b in args.blocks.split(",") if b]
        rows = [int(r) for r in args.rows.split(",")]
    except (KeyError, ValueError) as e:
        ap.error(f"bad --shapes, --rows or --blocks: {e}")
    sizes = (5, 6) if args.kernel == "fp8" else (4, 5)
    if any(len(b) not in sizes for b in extra):
        ap.error(f"--blocks: {' or '.join(map(str, sizes))} numbers each for {args.kernel}")
    variants = args.quantize.split(",")
    if any(v not in VARIANTS for v in variants):
        ap.error(f"--quantize: any of {', '.join(VARIANTS)}")
    if any(v.startswith("kv-") for v in variants) and not args.device.startswith("cuda"):
        ap.error("--quantize kv-int8 / kv-fp8: the one-byte KV cache is a GPU option")
    if args.quant_head and any(v.startswith("kv-") for v in variants):
        ap.error("--quant-head quantizes the LM head with the weights: not with kv-int8 / kv-fp8")
    for variant in variants if args.quality else []:
        q = quality(
            args.model, args.device, dtype, variant, args.prompts, args.int4_group, args.quant_head
        )
        print(render_quality(q) + "\n", flush=True)
    if args.device.startswith("cuda") and shapes:
        table = kernels_table(shapes, rows, [None, *extra], args.kernel, args.int4_group)
        print("\n" + render_kernels(table, args.kernel), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
