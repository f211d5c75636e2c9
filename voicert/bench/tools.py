"""Function-calling benchmark: ``python -m voicert.bench.tools {eval,masks}``.

``eval``: a real server in this process (the config's models and tools), one native session per
prompt of an eval set (JSON lines ``{"text": ..., "tool": name or null}``), each prompt typed
(``user.text``). Prints, per prompt, the tool called and its arguments, and in all: how often the
right tool was called (or none, when none should be), and the latency stages of the turns
(``tool_call_ms``: endpoint -> the first call's arguments complete; for a typed turn the endpoint
is the text's arrival, so a spoken turn adds its ``asr_ms``).

``masks``: the engine alone; the same batch decoded with and without a grammar (a tool call of a
schema with a long free string, so rows live as long as unguided ones), decode-step time compared:
the per-step cost of guided decoding at each batch size, and the host time its masks took.
``--model smollm2-random`` / ``llama-1b-random`` are random-weight models (timing only; labelled);
their tokenizer is the embedded model's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from voicert.core.chat import ChatMessage, ToolChoice, ToolChoiceMode, ToolSpec
from voicert.core.llm import GenerationRequest

DEFAULT_CONFIG = "examples/restaurant/config.yaml"
DEFAULT_PROMPTS = "examples/restaurant/eval.jsonl"


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


# ------------------------------------------------------------------------------------ eval


async def _one_turn(url: str, text: str, choice: str) -> dict:
    """One native session: tools are the server's; one typed turn; what came back."""
    import websockets

    from voicert.protocol import native as p

    out: dict = {"calls": [], "text": "", "stages": {}, "outputs": []}
    async with websockets.connect(url, max_size=None) as ws:
        start = p.SessionStart(
            tool_choice=None if choice == "server" else ToolChoice(ToolChoiceMode(choice))
        )
        await ws.send(p.encode(start))
        await ws.send(p.encode(p.UserText(text)))
        while True:
            msg = p.decode_server(await asyncio.wait_for(ws.recv(), 600))
            kind = msg["type"]
            if kind == "tool.call":
                out["calls"].append((msg["name"], msg["arguments"]))
            elif kind == "tool.output":
                out["outputs"].append(msg["output"])
            elif kind == "response.done":
                out["text"] = msg["text"]
            elif kind == "turn.latency":
                out["stages"] = msg["stages"]
                return out
            elif kind == "error" and msg.get("fatal"):
                raise RuntimeError(msg["message"])


async def run_eval(args: argparse.Namespace) -> dict:
    from voicert.config import load_config
    from voicert.server.app import VoiceServer, load_services

    cfg = load_config(args.config, {"server.port": 0, "server.host": "127.0.0.1"})
    text = await asyncio.to_thread(Path(args.prompts).read_text)
    prompts = [json.loads(line) for line in text.splitlines() if line.strip()]
    svc = load_services(cfg)
    server = VoiceServer(svc)
    await server.start()
    rows = []
    try:
        url = f"ws://127.0.0.1:{server.port}/v1/stream"
        for prompt in prompts:
            got = await _one_turn(url, prompt["text"], args.choice)
            called = got["calls"][0][0] if got["calls"] else None
            rows.append(
                {
                    "text": prompt["text"],
                    "want": prompt["tool"],
                    "called": called,
                    "arguments": got["calls"][0][1] if got["calls"] else "",
                    "right": called == prompt["tool"],
                    "reply": got["text"],
                    **{k: got["stages"].get(k) for k in ("tool_call_ms", "ttft_ms", "total_ms")},
                }
            )
            print(
                f"  {'ok ' if rows[-1]['right'] else 'BAD'} want={prompt['tool']} "
                f"got={called} {rows[-1]['arguments'][:60]}",
                file=sys.stderr,
            )
    finally:
        await server.shutdown()
        svc.engine.close()
        svc.asr.close()
    calls = [r["tool_call_ms"] for r in rows if r["tool_call_ms"] is not None]
    should = [r for r in rows if r["want"]]
    return {
        "config": args.config,
        "choice": args.choice,
        "llm": cfg.models.llm,
        "device": cfg.llm.device,
        "rows": rows,
        "right": sum(r["right"] for r in rows),
        "n": len(rows),
        "right_when_a_tool_is_wanted": sum(r["right"] for r in should),
        "n_wanted": len(should),
        "called_when_none_is_wanted": sum(r["called"] is not None for r in rows if not r["want"]),
        "tool_call_ms": {"p50": pct(calls, 50), "p95": pct(calls, 95), "n": len(calls)},
        "ttft_ms": {"p50": pct([r["ttft_ms"] for r in rows if r["ttft_ms"] is not None], 50)},
    }


def render_eval(r: dict) -> str:
    lines = [
        f"### Tool choice on {r['n']} prompts ({r['config']}, tool_choice={r['choice']}, "
        f"llm {r['llm']} on {r['device']})",
        "",
        "| prompt | wanted | called | arguments | tool_call_ms |",
        "|---|---|---|---|---:|",
    ]
    for row in r["rows"]:
        ms = f"{row['tool_call_ms']:.0f}" if row["tool_call_ms"] is not None else "-"
        lines.append(
            f"| {row['text']} | {row['want'] or '-'} | {row['called'] or '-'} | "
            f"`{row['arguments'][:70]}` | {ms} |"
        )
    t = r["tool_call_ms"]
    timing = (
        f"Endpoint -> call complete: P50 {t['p50']:.0f} ms, P95 {t['p95']:.0f} ms over "
        f"{t['n']} calls"
        if t["n"]
        else "Endpoint -> call complete: no call was made, so no timing"
    )
    ttft = r["ttft_ms"]["p50"]
    lines += [
        "",
        f"Right: {r['right']}/{r['n']} (a tool wanted: {r['right_when_a_tool_is_wanted']}"
        f"/{r['n_wanted']}; a call where none was wanted: {r['called_when_none_is_wanted']}). "
        + timing
        + (f"; TTFT P50 {ttft:.0f} ms." if ttft == ttft else "."),  # NaN: no reply timed
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ masks


def _core(args: argparse.Namespace):
    import torch
    from transformers import AutoTokenizer

    from voicert.bench.shapes import SHAPES, shape_config
    from voicert.config import cache_dir, load_config
    from voicert.engine.build import build_core
    from voicert.engine.loader import resolve_llm
    from voicert.engine.models.llama import DTYPES, LlamaConfig, load_llama, random_llama
    from voicert.engine.settings import EngineConfig

    model_dir = args.tokenizer or str(
        resolve_llm("embedded", cache_dir(load_config(environ={}).models))
    )
    tok = AutoTokenizer.from_pretrained(model_dir)
    dtype = DTYPES[args.dtype]
    if args.model in SHAPES:
        torch.manual_seed(0)
        model = random_llama(LlamaConfig.from_hf(shape_config(args.model)), dtype, args.device)
        label = f"{args.model} (RANDOM WEIGHTS, timing only; the embedded tokenizer)"
    else:
        model = load_llama(model_dir, dtype, args.device)
        label = f"embedded SmolLM2-135M ({model_dir})"
    cfg = EngineConfig(
        device=args.device,
        dtype=args.dtype,
        max_batch=max(args.batches),
        kv_memory_gb=args.kv_gb,
        max_context_tokens=1024,
        cuda_graphs=args.cuda_graphs,
        fused_kernels=args.fused_kernels,
        torchscript=args.device == "cpu",
    )
    return build_core(model_dir, cfg, model=model, tokenizer=tok), label


NOTE = ToolSpec.of(
    "take_note",
    "Write down what the caller says, word for word",
    {
        "type": "object",
        "required": ["text"],
        "additionalProperties": False,
        "properties": {"text": {"type": "string"}},
    },
)


def _batch(core, n: int, new: int, guided: bool, tag: str) -> dict:
    """Decode ``n`` requests together to the end; decode-step figures."""
    core.drain_steps()
    steps0, ns0 = core.guided_steps, core.guide_ns
    for i in range(n):
        core.add(
            GenerationRequest(
                f"{tag}-{i}",
                [ChatMessage("user", f"Please note down item number {i} of the list.")],
                new,
                ignore_eos=not guided,
                tools=(NOTE,) if guided else (),
                tool_choice=ToolChoice(ToolChoiceMode.REQUIRED),
            )
        )
    tokens = 0
    while core.has_work():
        tokens += sum(o.finish_reason is None for o in core.step())
    records = [r for r in core.drain_steps() if r.kind == "decode"]
    full = [r.seconds * 1e3 for r in records if r.batch == n]
    return {
        "decode_steps": len(records),
        "full_batch_steps": len(full),
        "step_ms": statistics.fmean(full) if full else float("nan"),
        "step_ms_p50": pct(full, 50),
        "tokens": tokens,
        "mean_batch": statistics.fmean(r.batch for r in records) if records else 0.0,
        "guide_us_per_step": ((core.guide_ns - ns0) / 1e3 / max(core.guided_steps - steps0, 1))
        if guided
        else 0.0,
    }


def run_masks(args: argparse.Namespace) -> dict:
    core, label = _core(args)
    core.warmup()
    rows = []
    for n in args.batches:
        _batch(core, n, 16, False, f"warm{n}")  # graphs and caches warm for this size
        _batch(core, n, 16, True, f"warmg{n}")
        plain = _batch(core, n, args.new, False, f"plain{n}")
        guided = _batch(core, n, args.new, True, f"guided{n}")
        rows.append(
            {
                "batch": n,
                "plain": plain,
                "guided": guided,
                "overhead_ms": guided["step_ms"] - plain["step_ms"],
            }
        )
    return {
        "label": label,
        "device": args.device,
        "dtype": args.dtype,
        "cuda_graphs": args.cuda_graphs,
        "new": args.new,
        "rows": rows,
    }


def render_masks(r: dict) -> str:
    lines = [
        f"### Guided decoding, per decode step ({r['label']}, {r['device']} {r['dtype']}, "
        f"cuda_graphs={r['cuda_graphs']}, {r['new']} new tokens)",
        "",
        "| batch | unguided step ms | guided step ms | overhead ms | host guide us/step "
        "| full-batch steps (unguided / guided) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        p, g = row["plain"], row["guided"]
        lines.append(
            f"| {row['batch']} | {p['step_ms']:.3f} | {g['step_ms']:.3f} | "
            f"{row['overhead_ms']:+.3f} | {g['guide_us_per_step']:.0f} | "
            f"{p['full_batch_steps']} / {g['full_batch_steps']} |"
        )
    lines += [
        "",
        "Step times are the mean of decode steps that ran the whole batch (guided rows "
        "end when their call is complete; steps after that are left out).",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m voicert.bench.tools",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    ev = sub.add_parser("eval", help="tool choice and call latency over an eval set")
    ev.add_argument("--config", default=DEFAULT_CONFIG)
    ev.add_argument("--prompts", default=DEFAULT_PROMPTS)
    ev.add_argument(
        "--choice",
        default="server",
        choices=["server", "auto", "required"],
        help="server: the config's tools.choice",
    )
    ev.add_argument("--json", action="store_true")
    ms = sub.add_parser("masks", help="per-step cost of grammar masks")
    ms.add_argument(
        "--model", default="smollm2-random", help="embedded | smollm2-random | llama-1b-random"
    )
    ms.add_argument("--device", default="cpu")
    ms.add_argument("--dtype", default="float32")
    ms.add_argument("--batches", default="1,8", type=lambda s: [int(x) for x in s.split(",")])
    ms.add_argument("--new", type=int, default=64)
    ms.add_argument("--kv-gb", type=float, default=1.0)
    ms.add_argument("--cuda-graphs", action="store_true")
    ms.add_argument("--fused-kernels", action="store_true")
    ms.add_argument(
        "--tokenizer", default="", help="a tokenizer dir (default: the embedded model's)"
    )
    ms.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "eval":
        for path in (args.config, args.prompts):
            if not Path(path).is_file():
                print(f"error: {path} not found (run from the repository root)", file=sys.stderr)
                return 2
        result = asyncio.run(run_eval(args))
        print(json.dumps(result, indent=1) if args.json else render_eval(result))
    else:
        result = run_masks(args)
        print(json.dumps(result, indent=1) if args.json else render_masks(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
