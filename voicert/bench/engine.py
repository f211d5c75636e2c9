"""Engine benchmark: ``python -m voicert.bench.engine``.

Runs voicert's engine and ``transformers`` ``generate()`` side by side in one process and prints
Markdown tables: TTFT for a 600-token prompt of which 500 are cached, TPOT at batch 1, throughput and
per-stream TPOT at several concurrency levels, and speculative decoding against plain greedy on a
voice-agent prompt set. ``--model llama-1b-random`` / ``smollm2-random`` build random-weight models of
those architectures (timing only; labelled as such in the output).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from voicert.bench.shapes import SHAPES, NullTokenizer, shape_config
from voicert.bench.streams import (
    TTFT_600,
    TTFT_TURN,
    measure,
    pct,
    tokens_per_s,
    tpot_decode,
)
from voicert.config import ConfigError
from voicert.core.chat import ChatMessage
from voicert.core.llm import GenerationRequest
from voicert.engine.clients.llm_engine import LLMEngine
from voicert.engine.gpu.int4 import GROUPS
from voicert.engine.models.llama import DTYPES, LlamaConfig, load_llama, random_llama
from voicert.engine.settings import EngineConfig
from voicert.telemetry.gcwatch import settle

# Voice-agent turns: short answers and confirmations that repeat what the caller said.
VOICE_PROMPTS = [
    "Please confirm my order: two large pepperoni pizzas, one garlic bread and a diet cola.",
    "Repeat my address back to me: 42 Baker Street, apartment 3B, London.",
    "Can you confirm the booking: a table for four at seven thirty tonight under the name Rivera?",
    "My phone number is 555 0134 2287. Please read it back to me.",
    "Confirm this appointment: Tuesday the 14th at 10 am with Doctor Patel.",
    "Read back my flight: British Airways 217 from Boston to London on March 3rd.",
    "Please repeat the list: milk, eggs, bread, butter and two apples.",
    "Confirm the transfer: 250 dollars from checking to savings today.",
    "Say back my email address: anna dot smith at example dot com.",
    "Repeat after me: the quick brown fox jumps over the lazy dog.",
]
VOICE_SYSTEM = (
    "You are a phone assistant. When the caller asks you to confirm or repeat "
    "something, repeat it back exactly, then ask if it is correct."
)


def voice_prompt_ids(tokenizer) -> list[list[int]]:
    """The voice prompt set as token ids, under the voice system prompt."""
    from voicert.engine.core.prompt import build_prompt

    return [
        build_prompt(tokenizer, [ChatMessage("system", VOICE_SYSTEM), ChatMessage("user", p)], 2048)
        for p in VOICE_PROMPTS
    ]


def shared_prefix(x: list[int], y: list[int]) -> int:
    """How many leading tokens two replies share."""
    return next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), min(len(x), len(y)))


@dataclass
class Row:
    name: str
    ours: float
    baseline: float | None
    unit: str

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or not self.ours:
            return None
        # lower is better for ms rows, higher for throughput rows
        return self.baseline / self.ours if self.unit == "ms" else self.ours / self.baseline


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


GPU_PREFILL_BUDGET = 2048  # configs/gpu.yaml's llm.prefill_token_budget (the CPU default is 128:
# 64 streams' 100-token prompts would take 64 prefill steps, one each)
# --against: this engine again with one setting changed, run side by side (label, the change)
TWINS = {
    "sdpa-prefill": ("voicert, prefill by gather + SDPA", {"prefill_attention": "sdpa"}),
    "model-kv": ("voicert, KV cache in the model's dtype", {"kv_cache": "model"}),
    "no-pdl": ("voicert, kernels launched without PDL", {"pdl": "off"}),
    "cublas-linear": ("voicert, small steps' Linears by cuBLAS", {"decode_linear": "cublas"}),
}


Q4KM = "; as llm.int4_gguf serves a Q4_K_M file: q/k/v and down FP8 in llama.cpp's more-bits layers"


def more_bits(i: int, n: int) -> bool:
    """Whether layer ``i`` of ``n`` gets the more-bits type (Q6_K) for attn_v and ffn_down in
    llama.cpp's Q4_K_M: the first and last eighth, and every third layer between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4km_layers(model) -> int:
    """In place: the q/k/v and down Linears of :func:`more_bits` layers to FP8 (nearest), as
    llm.int4_gguf serves a Q4_K_M file (its Q6_K parts); the rest are left for INT4. Returns
    how many became FP8."""
    from voicert.engine.gpu.fp8 import Fp8Linear

    n = len(model.layers)
    count = 0
    for i, layer in enumerate(model.layers):
        if more_bits(i, n):
            layer.attn.qkv = Fp8Linear.from_linear(layer.attn.qkv)
            layer.mlp.down = Fp8Linear.from_linear(layer.mlp.down)
            count += 2
    return count


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        dtype = DTYPES[args.dtype]
        if args.model in SHAPES:
            hf_cfg = shape_config(args.model)
            self.label = f"{args.model} (RANDOM WEIGHTS, timing only)"
            self.model = random_llama(LlamaConfig.from_hf(hf_cfg), dtype, args.device)
            self.tokenizer = None
            self.model_dir = None
            self.hf_cfg = hf_cfg
        else:
            from transformers import AutoTokenizer

            from voicert.config import cache_dir, load_config
            from voicert.engine.loader import resolve_llm

            self.model_dir = str(resolve_llm(args.model, cache_dir(load_config(environ={}).models)))
            self.label = f"{args.model} ({self.model_dir})"
            self.model = load_llama(self.model_dir, dtype, args.device)
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.vocab = self.model.cfg.vocab_size
        if args.q4km:
            q4km_layers(self.model)
        base = dict(
            device=args.device,
            dtype=args.dtype,
            kv_memory_gb=args.kv_gb,
            prefill_token_budget=args.prefill_token_budget,
            batch_window_ms=args.batch_window_ms,
            max_batch=max(args.streams),
            max_context_tokens=4096,
            int8=args.int8,
            cuda_graphs=args.cuda_graphs,
            fused_kernels=args.fused_kernels,
            torchscript=args.torchscript,
            overlap=args.overlap,
            fp8=args.fp8,
            int4=args.int4,
            int4_group=args.int4_group,
            int4_activations=args.int4_activations,
            fp8_activations=args.fp8_activations,
            quant_head=args.quant_head,
            # random weights have no text to calibrate on; the rounding changes no timing
            rounding="gptq" if self.tokenizer is not None else "nearest",
        )
        twin = TWINS.get(args.against)  # --against sdpa-prefill / model-kv: this engine, one change
        tok = self.tokenizer if self.tokenizer is not None else NullTokenizer(self.vocab)
        ours = dict(base, prefill_attention=args.prefill_attention, kv_cache=args.kv_cache)
        self.engine = LLMEngine(
            self.model_dir or "", EngineConfig(**ours), model=self.model, tokenizer=tok
        )
        self.twin = None
        if twin is not None:  # its own copy of the model: the prefill choice is the model's
            self.twin = LLMEngine(
                self.model_dir or "",
                EngineConfig(**(ours | twin[1])),
                model=copy.deepcopy(self.model),
                tokenizer=tok,
            )
        self.spec_engines: dict[str, LLMEngine] = {}  # label -> an engine that speculates
        if args.spec:
            self.spec_engines[f"n-gram prompt lookup, k={args.spec}"] = LLMEngine(
                self.model_dir or "",
                EngineConfig(**base, spec_tokens=args.spec),
                model=self.engine.core.model,  # (as built: quantized once)
                tokenizer=tok,
            )
        if args.heads:
            self.spec_engines[f"draft heads ({args.heads}), k={args.heads_k}"] = LLMEngine(
                self.model_dir or "",
                EngineConfig(**base, spec_tokens=args.heads_k, draft_heads=args.heads),
                model=self.engine.core.model,  # (as built: quantized once)
                tokenizer=tok,
            )
        self.hf = self._hf_model() if args.against == "transformers" else None
        self.rng = np.random.default_rng(0)
        self.hops: list[float] = []

    def _hf_model(self):
        from transformers import AutoModelForCausalLM
        from transformers import LlamaConfig as HFLlamaConfig

        dtype = DTYPES[self.args.dtype]
        if self.model_dir:
            m = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=dtype)
        else:
            m = AutoModelForCausalLM.from_config(HFLlamaConfig(**self.hf_cfg), dtype=dtype)
        m = m.to(self.args.device).eval()
        if self.args.int8:
            m = torch.ao.quantization.quantize_dynamic(m, {torch.nn.Linear}, dtype=torch.qint8)
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
        return m

    def tokens(self, n: int) -> list[int]:
        return self.rng.integers(100, min(self.vocab, 30000), n).tolist()

    # ---------------------------------------------------------------- ours

    async def _stream(self, engine: LLMEngine, prompt: list[int], new: int, tag: str):
        """Returns (client receive times of each token in ns, submit ns, token ids)."""
        req = GenerationRequest(
            f"{tag}-{time.perf_counter_ns()}", [], new, ignore_eos=True, prompt_ids=prompt
        )
        times, ids = [], []
        async for ev in engine.submit(req):
            if ev.finish_reason is None:
                now = time.perf_counter_ns()
                times.append(now)
                ids.append(ev.token_id)
                self.hops.append((now - ev.sampled_ns) / 1e3)  # engine thread -> asyncio, us
        return times, req.submit_ns, ids

    async def ours(self, prompt: list[int], new: int) -> tuple[list[int], int]:
        """A :data:`StreamFn` over this bench's engine."""
        times, t0, _ = await self._stream(self.engine, prompt, new, "b")
        return times, t0

    async def twin_stream(self, prompt: list[int], new: int) -> tuple[list[int], int]:
        """A :data:`StreamFn` over the baseline engine of ``--against sdpa-prefill | model-kv``."""
        times, t0, _ = await self._stream(self.twin, prompt, new, "s")
        return times, t0

    # ---------------------------------------------------------------- transformers

    @torch.inference_mode()
    def hf_time(self, prompts: list[list[int]], new: int) -> float:
        ids = torch.tensor(prompts, device=self.args.device)
        sync(self.args.device)
        t0 = time.perf_counter()
        self.hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
        )
        sync(self.args.device)
        return time.perf_counter() - t0

    def hf_ttft(self, reps: int, total: int = 600) -> list[float]:
        self.hf_time([self.tokens(total)], 1)
        return [self.hf_time([self.tokens(total)], 1) * 1000 for _ in range(reps)]

    def hf_concurrent(self, streams: int, new: int) -> tuple[float, float]:
        prompts = [self.tokens(self.args.prompt_tokens) for _ in range(streams)]
        t1 = self.hf_time(prompts, 1)
        tn = self.hf_time(prompts, new)
        return streams * new / tn, (tn - t1) * 1000 / (new - 1)

    # ---------------------------------------------------------------- speculative

    async def _voice_run(self, eng: LLMEngine, prompts: list[list[int]]) -> tuple[float, list]:
        """Mean TPOT (ms) over the voice prompts one at a time, and each reply's tokens."""
        tpots, outs = [], []
        for p in prompts:
            req = GenerationRequest(
                f"v-{time.perf_counter_ns()}", [], self.args.new_tokens, prompt_ids=p
            )
            times, ids = [], []
            async for ev in eng.submit(req):
                if ev.finish_reason is None:
                    times.append(time.perf_counter_ns())
                    ids.append(ev.token_id)
            outs.append(ids)
            if len(times) > 1:
                tpots.append((times[-1] - times[0]) / 1e6 / (len(times) - 1))
        return statistics.mean(tpots), outs

    async def spec_compare(self) -> list[dict]:
        """Each speculating engine against plain greedy, batch 1, on the voice prompt set."""
        if self.tokenizer is None:
            return []
        prompts = voice_prompt_ids(self.tokenizer)
        await self._voice_run(self.engine, prompts[:1])  # warm
        greedy_tpot, greedy = await self._voice_run(self.engine, prompts)
        out = []
        for name, eng in self.spec_engines.items():
            await self._voice_run(eng, prompts[:1])
            before = dataclasses.replace(eng.core.scheduler.spec)
            tpot, outs = await self._voice_run(eng, prompts)
            spec = eng.core.scheduler.spec
            steps, emitted = spec.seq_steps - before.seq_steps, spec.emitted - before.emitted
            proposed, accepted = spec.proposed - before.proposed, spec.accepted - before.accepted
            out.append(
                {
                    "name": name,
                    "greedy_tpot_ms": greedy_tpot,
                    "tpot_ms": tpot,
                    "speedup": greedy_tpot / tpot,
                    "identical": f"{sum(a == b for a, b in zip(greedy, outs))}/{len(prompts)}",
                    "acceptance_rate": accepted / proposed if proposed else 0.0,
                    "mean_accepted_length": emitted / steps if steps else 0.0,
                    "sample": self.tokenizer.decode(outs[0]),
                }
            )
        return out

    async def int8_check(self) -> dict | None:
        """INT8 replies against fp32 replies on the voice prompt set (real model, replies end at
        EOS): how many are token-identical, the mean shared prefix, and the share of the fp32
        reply's words the INT8 reply also says."""
        if self.tokenizer is None or not self.args.int8:
            return None
        prompts = voice_prompt_ids(self.tokenizer)
        cfg = dataclasses.replace(self.engine.cfg, int8=False, kv_memory_gb=0.25)
        # self.model is still fp32: quantize_dynamic gave the engine a quantized copy
        fp32 = LLMEngine(self.model_dir, cfg, model=self.model, tokenizer=self.tokenizer)
        try:
            _, ref = await self._voice_run(fp32, prompts)
        finally:
            fp32.close()
        _, ours = await self._voice_run(self.engine, prompts)
        prefix = [shared_prefix(x, y) for x, y in zip(ours, ref)]
        texts = [(self.tokenizer.decode(x), self.tokenizer.decode(y)) for x, y in zip(ours, ref)]
        overlap = [
            len(set(a.lower().split()) & set(b.lower().split()))
            / max(1, len(set(b.lower().split())))
            for a, b in texts
        ]
        return {
            "identical": f"{sum(x == y for x, y in zip(ours, ref))}/{len(ref)}",
            "prefix": statistics.mean(prefix),
            "overlap": statistics.mean(overlap),
            "samples": texts[:3],
        }

    # ---------------------------------------------------------------- all

    def hf_figures(self) -> dict[str, float]:
        """transformers generate()'s figures under the same row names (those it has)."""
        a, reps = self.args, max(3, self.args.reps // 4)
        out = {
            TTFT_600 + " (P50)": pct(self.hf_ttft(reps), 50),
            TTFT_TURN: pct(self.hf_ttft(reps, total=170), 50),
        }
        for n in a.streams:
            tps, tpot = self.hf_concurrent(n, a.new_tokens)
            out[tpot_decode(n)], out[tokens_per_s(n)] = tpot, tps
        return out

    async def run(self, baseline: dict[str, float] | None = None) -> dict:
        """Our figures beside ``baseline`` (by row name; None: transformers when it was loaded)."""
        a = self.args
        ours = await measure(
            self.ours, self.tokens, a.reps, a.streams, a.new_tokens, a.prompt_tokens
        )
        if baseline is None and self.hf is not None:
            baseline = self.hf_figures()
        if self.twin is not None:
            baseline = await measure(
                self.twin_stream, self.tokens, a.reps, a.streams, a.new_tokens, a.prompt_tokens
            )
        baseline = baseline or {}
        rows = [
            Row(name, v, baseline.get(name), "tok/s" if name.startswith("tokens/s") else "ms")
            for name, v in ours.items()
        ]
        rows.append(
            Row("engine thread -> asyncio hop per token (P50)", pct(self.hops, 50), None, "us")
        )
        rows.append(
            Row("engine thread -> asyncio hop per token (P99)", pct(self.hops, 99), None, "us")
        )
        spec = await self.spec_compare() if self.spec_engines else []
        return {"rows": rows, "spec": spec, "int8": await self.int8_check()}


def render(
    label: str, args: argparse.Namespace, result: dict, baseline: str = "transformers generate()"
) -> str:
    lines = [
        f"model: {label}; device {args.device}; dtype {args.dtype}"
        f"{'; FP8 weights' if args.fp8 else ''}"
        f"{'; INT4 weights (groups of ' + str(args.int4_group) + ')' if args.int4 else ''}"
        f"{Q4KM if args.q4km else ''}"
        f"{'; a one-row x rounded to int8 (W4A8)' if args.int4_activations == 'int8' else ''}"
        f"{'; x kept unrounded (W8A16)' if args.fp8 and args.fp8_activations == 'model' else ''}"
        f"{'; the LM head quantized too' if args.quant_head else ''}"
        f"{'; CUDA graphs' if args.cuda_graphs else ''}"
        f"{'; fused Triton kernels' if args.fused_kernels else ''}"
        f"{'; prefill attention ' + args.prefill_attention if args.fused_kernels else ''}"
        f"{'; overlapped decode steps' if args.overlap and args.cuda_graphs else ''}"
        f"{'; TorchScript forward' if args.torchscript else ''}"
        f"{'; int8 dynamic Linear' if args.int8 else ''}; prompt {args.prompt_tokens} tokens; "
        f"prefill steps of {args.prefill_token_budget} padded tokens; "
        f"{args.new_tokens} new tokens",
        "",
        f"| metric | voicert | {baseline} | ratio (x better) |",
        "|---|---:|---:|---:|",
    ]
    for r in result["rows"]:
        base = f"{r.baseline:.2f}" if r.baseline is not None else "-"
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        lines.append(f"| {r.name} | {r.ours:.2f} {r.unit} | {base} | {ratio} |")
    if result["spec"]:
        lines += [
            "",
            "| speculative (batch 1, voice prompt set) | greedy TPOT ms | speculative TPOT ms "
            "| speedup | identical | acceptance | mean accepted length |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for s in result["spec"]:
            lines.append(
                f"| {s['name']} | {s['greedy_tpot_ms']:.2f} | {s['tpot_ms']:.2f} | "
                f"{s['speedup']:.2f}x | {s['identical']} | {s['acceptance_rate']:.2f} | "
                f"{s['mean_accepted_length']:.2f} |"
            )
    if result.get("int8"):
        q = result["int8"]
        lines += [
            "",
            "| INT8 vs fp32 replies, voice prompt set | token-identical | mean shared "
            "prefix (tokens) | fp32 reply words also in the INT8 reply |",
            "|---|---:|---:|---:|",
            f"| {args.new_tokens} new tokens at most, EOS ends | {q['identical']} | "
            f"{q['prefix']:.1f} | {q['overlap']:.2f} |",
            "",
        ]
        lines += [f"- INT8: {a!r}\n  fp32: {b!r}" for a, b in q["samples"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m voicert.bench.engine")
    ap.add_argument(
        "--model", default="embedded", help="embedded | HF dir | .gguf | " + " | ".join(SHAPES)
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument(
        "--int8", action="store_true", help="CPU: dynamic INT8 Linear layers (both sides)"
    )
    ap.add_argument("--streams", default="1,8,32,64")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--spec", type=int, default=4, help="n-gram draft length (0: skip)")
    ap.add_argument("--heads", default="", help="draft heads to compare too (embedded | a file)")
    ap.add_argument("--heads-k", type=int, default=2, help="drafts per step from the heads")
    ap.add_argument("--kv-gb", type=float, default=0.0, help="KV pool size (0: automatic)")
    ap.add_argument(
        "--prefill-token-budget",
        type=int,
        default=None,
        help="padded prompt tokens a prefill step (llm.prefill_token_budget; default: "
        f"{GPU_PREFILL_BUDGET} on a GPU, as configs/gpu.yaml serves, else the llm default)",
    )
    ap.add_argument("--batch-window-ms", type=float, default=0.0)
    ap.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument(
        "--fused-kernels",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="GPU: the Triton kernels (default on a GPU)",
    )
    ap.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="GPU: queue each decode step (plain or draft heads) before reading "
        "the last one's tokens",
    )
    ap.add_argument(
        "--torchscript",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="CPU: the forward as a frozen TorchScript trace (default on the CPU)",
    )
    ap.add_argument(
        "--against",
        choices=("transformers", "vllm", *TWINS, "none"),
        default="transformers",
        help="the engine run side by side: transformers generate() in this process, "
        "vLLM (bench/vllm_side.py, in a child process first, same shape and "
        "prompts; needs vllm), or this engine with --prefill-attention sdpa "
        "(sdpa-prefill), with its KV cache in the model's dtype (model-kv) or "
        "with its kernels launched without programmatic dependent launch "
        "(no-pdl) or with small steps' Linears by cuBLAS (cublas-linear)",
    )
    ap.add_argument(
        "--prefill-attention",
        choices=("auto", "paged", "flash", "sdpa"),
        default="auto",
        help="GPU: prefill steps' attention (llm.prefill_attention)",
    )
    ap.add_argument("--no-baseline", dest="against", action="store_const", const="none")
    ap.add_argument(
        "--fp8",
        action="store_true",
        help="GPU: FP8 layer weights (engine/gpu/fp8.py); with --against vllm, vLLM's "
        "quantization=fp8 too",
    )
    ap.add_argument(
        "--int4",
        action="store_true",
        help="GPU: INT4 layer weights, a scale and low per 128 inputs (engine/gpu/int4.py)",
    )
    ap.add_argument(
        "--int4-group",
        type=int,
        choices=GROUPS,
        default=128,
        help="with --int4 (llm.int4_group)",
    )
    ap.add_argument(
        "--fp8-activations",
        choices=("fp8", "model"),
        default="fp8",
        help="with --fp8: model keeps x in the model's dtype at every row count, W8A16 "
        "(llm.fp8_activations)",
    )
    ap.add_argument(
        "--int4-activations",
        choices=("model", "int8"),
        default="model",
        help="with --int4: int8 rounds a one-stream step's x to int8 by group, W4A8 "
        "(llm.int4_activations)",
    )
    ap.add_argument(
        "--q4km",
        action="store_true",
        help="with --int4: the layers as llm.int4_gguf serves a Q4_K_M file: INT4 in groups of 32, "
        "and in the layers llama.cpp gives more bits (about half) q/k/v and down in FP8",
    )
    ap.add_argument(
        "--quant-head",
        action="store_true",
        help="GPU, with --fp8 or --int4: the LM head in that format too (llm.quant_head)",
    )
    ap.add_argument(
        "--kv-cache",
        choices=("model", "int8", "fp8"),
        default="model",
        help="GPU: the KV cache's values (llm.kv_cache)",
    )
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    args.streams = [int(s) for s in args.streams.split(",")]
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.prefill_token_budget is None:
        gpu = args.device.startswith("cuda")
        args.prefill_token_budget = (
            GPU_PREFILL_BUDGET if gpu else EngineConfig().prefill_token_budget
        )
    if args.cuda_graphs is None:
        args.cuda_graphs = args.device.startswith("cuda")
    if args.fused_kernels is None:
        args.fused_kernels = args.device.startswith("cuda")
    if args.torchscript is None:
        args.torchscript = args.device == "cpu"
    if (args.fp8 or args.int4 or args.kv_cache != "model") and not args.device.startswith("cuda"):
        ap.error("--fp8, --int4 and --kv-cache int8 | fp8 are GPU options")
    if args.fp8 and args.int4:
        ap.error("--fp8 and --int4 are two quantizations: choose one")
    if args.int4_activations != "model" and not args.int4:
        ap.error("--int4-activations is a setting of --int4")
    if args.q4km and not args.int4:
        ap.error("--q4km is a layout of --int4")
    if args.q4km:
        args.int4_group = 32
    if args.quant_head and not (args.fp8 or args.int4):
        ap.error("--quant-head needs --fp8 or --int4 (the head takes the layers' format)")
    if args.int4 and args.against == "vllm":
        ap.error("--int4 against vLLM is not measured by this bench (vLLM needs a GPTQ checkpoint)")
    if args.against == "model-kv" and args.kv_cache == "model":
        ap.error(
            "--against model-kv compares a one-byte KV cache with the model's dtype: add "
            "--kv-cache int8 or fp8"
        )
    if args.against in ("sdpa-prefill", "no-pdl", "cublas-linear") and not args.fused_kernels:
        ap.error(
            f"--against {args.against} changes the fused GPU path's kernels: it needs "
            "--fused-kernels (a CUDA device)"
        )
    against, baseline, failed = "transformers generate()", None, False
    if args.against in TWINS:
        against = TWINS[args.against][0]
    if args.against == "vllm":  # first, in a child: its memory is back before ours loads
        from voicert.bench.vllm_side import measure_in_child

        try:
            side = measure_in_child(
                args.model,
                args.dtype,
                args.fp8,
                args.streams,
                args.new_tokens,
                args.prompt_tokens,
                args.reps,
            )
            against, baseline = side["engine"], side["figures"]
        except RuntimeError as e:  # ours is still measured (its column alone); exit status 1
            print(f"error: {e}", file=sys.stderr)
            against, baseline, failed = "vLLM (failed: see stderr)", {}, True
    try:
        bench = Bench(args)
    except (ConfigError, ValueError, OSError) as exc:  # a model path, a setting: one line
        print(f"bench.engine: {exc}", file=sys.stderr)
        return 2
    settle()  # as the server does: loaded objects out of the collector's way
    result = asyncio.run(bench.run(baseline))
    text = render(bench.label, args, result, against)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "label": bench.label,
                    "args": vars(args),
                    "rows": [asdict(r) | {"ratio": r.ratio} for r in result["rows"]],
                    "spec": result["spec"],
                    "int8": result["int8"],
                    "table": text,
                },
                f,
                indent=1,
                default=str,
            )
    bench.engine.close()
    if bench.twin is not None:
        bench.twin.close()
    for eng in bench.spec_engines.values():
        eng.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
