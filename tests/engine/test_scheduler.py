"""Scheduler bookkeeping with a deterministic stand-in for the model's argmax (no torch)."""

from voicert.core.chat import ChatMessage
from voicert.core.llm import GenerationRequest
from voicert.engine.core.kv_cache import BlockManager
from voicert.engine.core.scheduler import Scheduler, SchedulerConfig
from voicert.engine.core.sequence import Sequence, Status

STOP = 2


def next_token(prefix: list[int]) -> int:
    """What a greedy 'model' emits after ``prefix``; repeats with period 6 so n-grams match."""
    return 10 + (len(prefix) % 6)


def sample(step) -> list[list[int]]:
    if step.kind == "prefill":
        return [[next_token(c.seq.tokens[: c.end])] if c.samples else [] for c in step.chunks]
    out = []
    for s in step.seqs:
        ctx = list(s.tokens)
        row = []
        for d in [None, *s.draft]:
            if d is not None:
                ctx.append(d)
            row.append(next_token(ctx))
        out.append(row)
    return out


def run_all(sched: Scheduler, steps: list | None = None) -> None:
    while sched.has_work():
        step, failed = sched.schedule()
        assert not failed
        if steps is not None:
            steps.append(step)
        sched.postprocess(step, sample(step))


def seq(name: str, n_prompt: int, max_new: int = 10, first: int = 100) -> Sequence:
    req = GenerationRequest(name, [ChatMessage("user", name)], max_new)
    return Sequence(req, list(range(first, first + n_prompt)))


def reference(n_prompt: int, max_new: int, first: int = 100) -> list[int]:
    toks = list(range(first, first + n_prompt))
    for _ in range(max_new):
        toks.append(next_token(toks))
    return toks[n_prompt:]


def test_single_sequence_generates_greedy_tokens():
    sched = Scheduler(BlockManager(64, 4), SchedulerConfig(), {STOP})
    s = seq("a", 7)
    sched.add(s)
    run_all(sched)
    assert s.finish_reason == "length" and s.tokens[7:] == reference(7, 10)
    assert sched.blocks.available == 63  # everything free or cached-evictable again


def test_chunked_prefill_stays_within_budget_and_alternates_with_decode():
    sched = Scheduler(BlockManager(256, 4), SchedulerConfig(prefill_token_budget=16), {STOP})
    short = seq("short", 5, max_new=30)
    sched.add(short)
    steps: list = []
    step, _ = sched.schedule()
    sched.postprocess(step, sample(step))  # short is now decoding
    long = seq("long", 50, first=500)
    sched.add(long)
    run_all(sched, steps)
    prefill_steps = [st for st in steps if st.kind == "prefill"]
    assert len(prefill_steps) == 4  # 50 tokens in chunks of <= 16
    for st in prefill_steps:
        assert len(st.chunks) * max(c.end - c.start for c in st.chunks) <= 16
    kinds = [st.kind for st in steps[:8]]
    assert kinds == ["decode", "prefill"] * 4  # decode never waits more than one chunk
    assert short.tokens[5:] == reference(5, 30)
    assert long.tokens[50:] == reference(50, 10, first=500)


def test_batched_equals_one_at_a_time():
    lone = []
    for i, n in enumerate([3, 9, 17]):
        sched = Scheduler(BlockManager(64, 4), SchedulerConfig(), {STOP})
        s = seq(f"s{i}", n, first=100 * (i + 1))
        sched.add(s)
        run_all(sched)
        lone.append(s.tokens)
    sched = Scheduler(BlockManager(64, 4), SchedulerConfig(), {STOP})
    together = [seq(f"s{i}", n, first=100 * (i + 1)) for i, n in enumerate([3, 9, 17])]
    for s in together:
        sched.add(s)
    run_all(sched)
    assert [s.tokens for s in together] == lone


def test_speculation_equals_greedy_and_accepts_repeating_text():
    sched = Scheduler(BlockManager(64, 4), SchedulerConfig(spec_tokens=4), {STOP})
    s = seq("spec", 12, max_new=40)
    sched.add(s)
    run_all(sched)
    assert s.tokens[12:] == reference(12, 40)
    assert sched.spec.acceptance_rate > 0.5
    assert sched.spec.mean_accepted_length > 2


def test_cancel_frees_blocks_everywhere():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, SchedulerConfig(max_batch=1), {STOP})
    a, b = seq("a", 9), seq("b", 9, first=300)
    sched.add(a)
    sched.add(b)
    step, _ = sched.schedule()
    sched.postprocess(step, sample(step))
    assert sched.cancel("b").finish_reason == "cancelled"  # still waiting
    assert sched.cancel("a").finish_reason == "cancelled"  # running
    assert sched.cancel("zzz") is None
    assert not sched.has_work()
    assert bm.available == 63


def test_preemption_under_memory_pressure_keeps_outputs_exact():
    # 9 usable blocks of 4 slots: two sequences that each grow to 8 blocks cannot both fit.
    bm = BlockManager(10, 4)
    sched = Scheduler(bm, SchedulerConfig(), {STOP})
    a, b = seq("a", 10, max_new=20), seq("b", 10, max_new=20, first=700)
    sched.add(a)
    sched.add(b)
    run_all(sched)
    assert sched.preemptions > 0
    assert a.tokens[10:] == reference(10, 20)
    assert b.tokens[10:] == reference(10, 20, first=700)
    assert bm.available == 9


def test_stop_token_ends_the_sequence_without_emitting_it():
    sched = Scheduler(BlockManager(64, 4), SchedulerConfig(), {12})
    s = seq("stop", 5, max_new=50)  # next tokens: 15, 10, 11, 12 -> stop
    sched.add(s)
    run_all(sched)
    assert s.finish_reason == "stop" and s.tokens[5:] == [15, 10, 11]
    assert s.status is Status.FINISHED


def test_prompt_that_can_never_fit_fails_cleanly():
    sched = Scheduler(BlockManager(3, 4), SchedulerConfig(), {STOP})
    s = seq("huge", 40)
    sched.add(s)
    step, failed = sched.schedule()
    assert step is None and failed == [s] and s.finish_reason == "error"


def test_prefill_packs_into_captured_shapes_within_the_budget():
    # graphs exist for rows (1, 2, 4) x widths (8, 16, 32) with rows * width <= 32
    cfg = SchedulerConfig(
        prefill_token_budget=32, prefill_batches=(1, 2, 4), prefill_widths=(8, 16, 32)
    )
    sched = Scheduler(BlockManager(256, 4), cfg, {STOP})
    seqs = [
        seq("a", 5),
        seq("b", 8, first=200),
        seq("c", 3, first=300),
        seq("d", 7, first=400),
        seq("e", 9, first=500),
        seq("f", 2, first=600),
    ]
    for s in seqs:
        sched.add(s)
    step, _ = sched.schedule()
    # a (5 tokens) pads to width 8: b, c, d fit that width; 4 rows * 8 = 32; e (9) is too wide
    assert step.kind == "prefill" and [c.seq.id for c in step.chunks] == ["a", "b", "c", "d"]
    sched.postprocess(step, sample(step))
    steps = []
    run_all(sched, steps)
    # next prefill: e (9 -> width 16) with f; 2 rows * 16 = 32
    assert [c.seq.id for c in steps[1].chunks] == ["e", "f"]
    for st in steps:
        if st.kind == "prefill":
            width = next(
                w for w in cfg.prefill_widths if w >= max(c.end - c.start for c in st.chunks)
            )
            rows = next(b for b in cfg.prefill_batches if b >= len(st.chunks))
            assert rows * width <= 32
    for s, n, first in zip(seqs, (5, 8, 3, 7, 9, 2), (100, 200, 300, 400, 500, 600)):
        assert s.tokens[n:] == reference(n, 10, first)


def test_a_wider_prompt_joins_the_step_while_the_padded_step_fits_the_budget():
    # an end-of-turn score (its message left open) and its reply (a few tokens longer) arrive
    # together: they share one prefill step, so the reply's first token comes with the score
    sched = Scheduler(BlockManager(256, 4), SchedulerConfig(prefill_token_budget=32), {STOP})
    score, reply, long = seq("score", 5), seq("reply", 9, first=200), seq("long", 20, first=300)
    for s in (score, reply, long):
        sched.add(s)
    step, _ = sched.schedule()
    # 2 rows x 9 = 18 <= 32 (widened from 5); a third row would pad to 3 x 20 = 60 > 32
    assert [(c.seq.id, c.end - c.start) for c in step.chunks] == [("score", 5), ("reply", 9)]
    tight = Scheduler(BlockManager(256, 4), SchedulerConfig(prefill_token_budget=16), {STOP})
    for s in (seq("score", 5), seq("reply", 9, first=200)):
        tight.add(s)
    step, _ = tight.schedule()
    assert [c.seq.id for c in step.chunks] == ["score"]  # 2 x 9 = 18 > 16: the reply waits


def test_a_long_prompt_goes_in_short_chunks_while_others_run_and_whole_alone():
    cfg = SchedulerConfig(prefill_token_budget=32, long_prompt_chunk=8, long_prompt_skips=0)
    sched = Scheduler(BlockManager(256, 4), cfg, {STOP})
    long = seq("long", 100)
    sched.add(long)
    step, _ = sched.schedule()
    assert [(c.seq.id, c.end - c.start) for c in step.chunks] == [("long", 32)]  # alone: whole
    sched.postprocess(step, sample(step))
    sched.add(seq("caller", 5, first=200))
    step, _ = sched.schedule()
    assert [(c.seq.id, c.end - c.start) for c in step.chunks] == [("long", 8), ("caller", 5)]
    steps: list = []
    run_all(sched, steps)
    assert long.tokens[100:] == reference(100, 10, 100)  # chunked any way, the same tokens


def sample_with_heads(step, right: bool = True) -> tuple[list[list[int]], list]:
    """:func:`sample`, plus two 'draft heads' guesses at each sampled position: right (what the
    model will emit next) or wrong (a constant)."""
    toks = sample(step)
    drafts = []
    for row, t in zip(step.chunks or step.seqs, toks):
        base = row.seq.tokens[: row.end] if step.kind == "prefill" else row.tokens + row.draft
        guesses = []
        for j in range(len(t)):  # the context up to and including this position's token
            ctx = (base if step.kind == "prefill" else base[: len(row.tokens) + j]) + [t[j]]
            nxt = next_token(ctx)
            guesses.append([nxt, next_token([*ctx, nxt])] if right else [1, 1])
        drafts.append(guesses)
    return toks, drafts


def test_head_drafts_come_from_the_last_step_and_keep_greedy():
    """With head drafts, a sequence's next drafts are the guesses made where its last emitted token
    was sampled; here the 'heads' guess right (the reference) or wrong (a constant)."""
    for right in (True, False):
        sched = Scheduler(
            BlockManager(256, 4), SchedulerConfig(spec_tokens=2, head_drafts=True), {STOP}
        )
        s = seq("h", 6, max_new=12)
        sched.add(s)
        while sched.has_work():
            step, _ = sched.schedule()
            sched.postprocess(step, *sample_with_heads(step, right))
        assert s.tokens[6:] == reference(6, 12)
        spec = sched.spec
        assert (spec.accepted > 0) == right and spec.proposed > 0


def run_overlapped(
    sched: Scheduler, cancel: dict[int, str] | None = None, heads: bool = False
) -> int:
    """Drive the scheduler as the engine does with ``overlap``: after launching a step, plan the
    next one before reading this one's tokens. The stand-in 'GPU' computes a step's tokens when
    they are read, from the sequences' tokens by then (what feeding the previous token on the
    GPU amounts to). ``cancel``: {step number: request id} cancelled between launch and read.
    Returns how many steps were launched ahead."""
    ahead, n, launched_ahead = None, 0, 0
    while sched.has_work() or ahead is not None:
        if ahead is not None:
            step, ahead = ahead, None
            sched.bind_ahead(step)
        else:
            step, failed = sched.schedule()
            assert not failed
            if step is None:
                continue
        ahead = sched.plan_ahead(step)
        launched_ahead += ahead is not None
        k = sched.cfg.spec_tokens
        for s in ahead.seqs if ahead is not None else []:  # room for the slots it may write
            assert len(s.blocks.table) * sched.blocks.block_size >= len(s.tokens) + 2 * k + 1
        if cancel and n in cancel:
            sched.cancel(cancel[n])
        sched.postprocess(step, *(sample_with_heads(step) if heads else (sample(step),)))
        n += 1
    return launched_ahead


def test_overlapped_steps_give_the_same_tokens_and_free_every_block():
    """Steps planned ahead of their inputs: the same tokens as plain stepping for sequences that
    end by length, by a stop token (its row in the step already planned is ignored) and by a
    cancel between launch and read; every block comes back; no ahead step past a length limit."""
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, SchedulerConfig(), {15})
    a, b, c = (
        seq("a", 6, max_new=4),
        seq("b", 8, max_new=50, first=300),
        seq("c", 7, max_new=40, first=500),
    )
    for s in (a, b, c):
        sched.add(s)
    ahead = run_overlapped(sched, cancel={4: "c"})
    assert ahead > 0
    assert a.finish_reason == "length" and a.tokens[6:] == [10, 11, 12, 13]
    assert b.finish_reason == "stop" and b.tokens[8:] == [12, 13, 14]  # 15 stops it
    got_c = c.tokens[7:]
    assert c.finish_reason == "cancelled" and got_c == [11, 12, 13, 14][: len(got_c)]
    assert bm.available == 63


def test_no_step_is_planned_ahead_when_anything_else_may_want_it():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, SchedulerConfig(), {STOP})
    a = seq("a", 6, max_new=3)
    sched.add(a)
    step, _ = sched.schedule()
    assert sched.plan_ahead(step) is None  # a prefill step
    sched.postprocess(step, sample(step))
    sched.add(seq("late", 4, first=400))
    step, _ = sched.schedule()  # decode of a; "late" waits for its prefill
    assert step.kind == "prefill" or sched.plan_ahead(step) is None
    spec = Scheduler(BlockManager(64, 4), SchedulerConfig(spec_tokens=2), {STOP})
    spec.add(seq("s", 6))
    step, _ = spec.schedule()
    spec.postprocess(step, sample(step))
    step, _ = spec.schedule()
    assert step.kind == "decode" and spec.plan_ahead(step) is None  # speculation: drafts first
    last = Scheduler(BlockManager(64, 4), SchedulerConfig(), {STOP})
    one = seq("one", 6, max_new=2)
    last.add(one)
    step, _ = last.schedule()
    last.postprocess(step, sample(step))
    step, _ = last.schedule()
    assert one.remaining == 1 and last.plan_ahead(step) is None  # its last token: nothing after


def test_overlapped_steps_with_head_drafts_keep_greedy_tokens():
    """Speculation with draft heads, each step planned before the last one's tokens are read:
    greedy tokens, drafts accepted, steps planned ahead; blocks come back."""
    bm = BlockManager(256, 4)
    sched = Scheduler(bm, SchedulerConfig(spec_tokens=2, head_drafts=True), {STOP})
    a, b = seq("a", 6, max_new=30), seq("b", 9, max_new=25, first=300)
    sched.add(a)
    sched.add(b)
    assert run_overlapped(sched, heads=True) > 0
    assert a.tokens[6:] == reference(6, 30) and b.tokens[9:] == reference(9, 25, first=300)
    assert sched.spec.accepted > 0 and bm.available == 255


def test_decode_steps_between_a_newcomers_prefill_chunks_carry_no_drafts():
    from voicert.engine.core.spec_policy import SpecPolicy

    sched = Scheduler(
        BlockManager(256, 4),
        SchedulerConfig(prefill_token_budget=16, spec_tokens=2),
        {STOP},
        policy=SpecPolicy(2),
    )
    short = seq("short", 5, max_new=30)
    sched.add(short)
    step, _ = sched.schedule()
    sched.postprocess(step, sample(step))
    step, _ = sched.schedule()
    assert step.kind == "decode" and step.drafts == 2  # alone: speculation
    sched.postprocess(step, sample(step))
    long = seq("long", 50, first=500)
    sched.add(long)
    steps: list = []
    run_all(sched, steps)
    first_sample = next(
        i for i, st in enumerate(steps) if st.kind == "prefill" and st.chunks[-1].end == 50
    )
    between = [st for st in steps[:first_sample] if st.kind == "decode"]
    assert len(between) == 3 and all(st.drafts == 0 for st in between)
    assert any(st.drafts == 2 for st in steps[first_sample + 1 :] if st.kind == "decode")
    assert short.tokens[5:] == reference(5, 30) and long.tokens[50:] == reference(50, 10, first=500)


def test_a_short_prompt_is_not_held_behind_every_chunk_of_a_long_one():
    sched = Scheduler(BlockManager(512, 4), SchedulerConfig(prefill_token_budget=16), {STOP})
    long, short = seq("long", 100, first=500), seq("short", 6, first=900)
    sched.add(long)
    step, _ = sched.schedule()  # the long prompt's first chunk
    sched.postprocess(step, sample(step))
    sched.add(short)
    steps: list = []
    run_all(sched, steps)
    prefills = [[c.seq.id for c in st.chunks] for st in steps if st.kind == "prefill"]
    assert prefills[0] == ["short"]  # done in the very next prefill step, not after 6 more chunks
    assert short.tokens[6:] == reference(6, 10, first=900)
    assert long.tokens[100:] == reference(100, 10, first=500)  # order changes no token


def test_a_long_prompt_still_moves_under_a_steady_flow_of_short_ones():
    cfg = SchedulerConfig(prefill_token_budget=16)
    sched = Scheduler(BlockManager(2048, 4), cfg, {STOP})
    long = seq("long", 64, first=500)
    sched.add(long)
    led: list[str] = []
    for i in range(40):
        sched.add(seq(f"s{i}", 4, max_new=1, first=1000 + 10 * i))  # one more every step
        step, _ = sched.schedule()
        if step.kind == "prefill":
            led.append(step.chunks[0].seq.id)
        sched.postprocess(step, sample(step))
        if long.status is Status.DECODE:
            break
    assert long.status is Status.DECODE  # its 4 chunks went through
    runs = "".join("L" if x == "long" else "s" for x in led).split("L")
    assert max(len(r) for r in runs[:-1]) <= cfg.long_prompt_skips


def test_with_no_skips_prompts_are_prefilled_first_come_first_served():
    cfg = SchedulerConfig(prefill_token_budget=16, long_prompt_skips=0)
    sched = Scheduler(BlockManager(512, 4), cfg, {STOP})
    long, short = seq("long", 40, first=500), seq("short", 6, first=900)
    sched.add(long)
    sched.add(short)
    steps: list = []
    run_all(sched, steps)
    prefills = [[c.seq.id for c in st.chunks] for st in steps if st.kind == "prefill"]
    assert prefills == [["long"], ["long"], ["long", "short"]]  # short waits for every chunk
