"""Trace the adaptive speculation policy's decisions step by step (debugging aid for the GPU
machine): python3 scripts/gpu/spec_trace.py GGUF STREAMS ROUNDS"""

import argparse
import asyncio
import sys

from voicert.bench import spec as S
from voicert.engine.core.spec_policy import bucket_of

args = argparse.Namespace(
    model=sys.argv[1],
    drafter="heads",
    k=2,
    streams=[int(sys.argv[2])],
    new_tokens=64,
    rounds=1,
    device="cuda",
    dtype="bfloat16",
    kv_gb=4.0,
)
label, engines, prompts, ignore_eos = S.build(args)
eng = engines["adaptive"]
pol = eng.core.scheduler.policy
observe = pol.observe
rows = []


def traced(batch, drafts, seconds, live, emitted):
    want = pol.drafts(batch)
    observe(batch, drafts, seconds, live, emitted)
    b = pol.buckets[bucket_of(batch)]
    rows.append(
        (
            batch,
            drafts,
            want,
            round(seconds * 1e3, 3),
            live,
            emitted,
            round(pol.gain.value, 2),
            b.spec.n,
            b.plain.n,
            round(b.plain.value * 1e3, 3),
            round(b.spec.value * 1e3, 3),
            b.probing,
            b.since_other,
            b.winner,
            eng.core.ahead_steps,
        )
    )


pol.observe = traced
n = int(sys.argv[2])
for _r in range(int(sys.argv[3])):
    asyncio.run(S.run_streams(eng, [prompts[i % len(prompts)] for i in range(n)], 64, False))
print(
    "batch drafts wanted_before ms live emitted gain spec_n plain_n plain_ms spec_ms probing since winner ahead"
)
for row in rows:
    print(*row)
for e in engines.values():
    e.close()
