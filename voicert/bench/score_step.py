"""``python -m voicert.bench.score_step``: what the end of a spoken turn costs the LLM on this machine.

When the early transcript is in, the session asks the engine for two things at once: the
end-of-turn scores of the transcript (a ``score_end`` request, the user's message left open) and
the reply itself (``turn.preempt``). This bench builds the engine as the server does (the config's
``llm`` section, the embedded model unless ``--set models.llm=...``) and times, on the engine core
with no server around it, the first token of:

- **reply alone**: the reply's prompt, its system prompt cached;
- **scores + reply**: both requests added together (the server's case: one prefill step when the
  scheduler packs them, two when it does not);
- **... right after a Whisper decode**: the same, each one just after ``asr`` transcribed a
  question (``asr.threads`` decides how many threads CTranslate2 ran it on; on a small machine
  they contend with the LLM's).

Each row: P50 / P95 over ``--rounds`` different questions, and the prefill steps it took.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from voicert.bench import DATA

QUESTIONS = (
    "What is the capital of France?",
    "Can you book me a table for four people tomorrow at eight?",
    "How far is it from the airport to the city centre?",
    "Tell me a joke about cats please.",
)


def _first_token(core, requests) -> tuple[float, int]:
    """(ms until the reply's first token, prefill steps taken), the requests aborted after."""
    for r in requests:
        core.add(r)
    reply = requests[-1].request_id
    t0 = time.perf_counter_ns()
    steps = 0
    while core.has_work():
        outs = core.step()
        steps += 1
        if any(o.request_id == reply and o.token_id >= 0 for o in outs):
            ms = (time.perf_counter_ns() - t0) / 1e6
            for r in requests:
                core.abort(r.request_id)
            while core.has_work():
                core.step()
            return ms, steps
    raise RuntimeError("the reply ended without a token")


def _row(name: str, samples: list[tuple[float, int]]) -> str:
    ms = sorted(s[0] for s in samples)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    steps = sorted({s[1] for s in samples})
    return f"| {name} | {statistics.median(ms):.1f} / {p95:.1f} ms | {', '.join(map(str, steps))} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m voicert.bench.score_step", description=__doc__)
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--rounds", type=int, default=16)
    args = ap.parse_args(argv)

    import numpy as np
    import soxr

    from voicert.audio.wav import read_wav
    from voicert.config import cache_dir, load_config
    from voicert.core.chat import ChatMessage
    from voicert.core.llm import GenerationRequest
    from voicert.engine.build import build_core
    from voicert.engine.loader import resolve_llm
    from voicert.engine.settings import engine_config
    from voicert.speech.asr import WhisperAsr, cpu_threads

    cfg = load_config(None, dict(kv.split("=", 1) for kv in args.set))
    model_dir = str(resolve_llm(cfg.models.llm, cache_dir(cfg.models)))
    core = build_core(model_dir, engine_config(cfg.llm))
    asr = WhisperAsr(cfg.asr, cfg.models.asr)
    audio, rate = read_wav(DATA / "capital_of_france.wav")
    audio = soxr.resample(audio, rate, 16000).astype(np.float32)
    system = ChatMessage("system", cfg.llm.system_prompt)

    def requests(i: int, both: bool) -> list[GenerationRequest]:
        text = f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"  # a new user turn each round
        messages = [system, ChatMessage("user", text)]
        reply = GenerationRequest(f"reply-{i}-{both}", messages, 8, "bench")
        if not both:
            return [reply]
        return [GenerationRequest(f"score-{i}", messages, 1, "bench", score_end=True), reply]

    _first_token(core, requests(-1, True))  # warm-up
    rows = {"reply alone": [], "scores + reply": [], "scores + reply, after a decode": []}
    for i in range(args.rounds):
        rows["reply alone"].append(_first_token(core, requests(i, False)))
        rows["scores + reply"].append(_first_token(core, requests(1000 + i, True)))
        asr.transcribe_sync(audio)
        rows["scores + reply, after a decode"].append(_first_token(core, requests(2000 + i, True)))
    threads = cpu_threads(cfg.asr.threads)
    print(f"llm {cfg.models.llm} on {cfg.llm.device}, asr.threads {cfg.asr.threads} ({threads})")
    print("| requests | reply's first token P50 / P95 | prefill steps |")
    print("|---|---:|---:|")
    for name, samples in rows.items():
        print(_row(name, samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
