"""GPU path checks (skipped without CUDA; run them on the GPU machine): CUDA-graph decode equals
eager decode token for token in fp32; in bf16 the agreement rate with fp32 is reported."""

import asyncio
import dataclasses

import pytest
import torch

from voicert.bench.shapes import NullTokenizer, shape_config
from voicert.core.llm import GenerationRequest, Sampling
from voicert.engine.clients.llm_engine import LLMEngine
from voicert.engine.models.llama import LlamaConfig, random_llama
from voicert.engine.settings import EngineConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def run_engine(engine, prompts, new=32, sequential=False, sampling=None):
    """Each prompt's reply; ``sampling``: one Sampling per prompt (default greedy)."""

    async def main():
        async def one(i, p):
            req = GenerationRequest(f"g{i}-{sequential}", [], new, ignore_eos=True, prompt_ids=p)
            if sampling is not None:
                req = dataclasses.replace(req, sampling=sampling[i])
            return [e.token_id async for e in engine.submit(req) if e.finish_reason is None]

        if sequential:  # one sequence at a time: its prefill runs through the prefill graphs
            return [await one(i, p) for i, p in enumerate(prompts)]
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    return asyncio.run(main())


def make(
    model,
    graphs,
    spec=0,
    heads="",
    fused=True,
    overlap=True,
    policy="always",
    kv_cache="model",
    pdl="auto",
    linear="auto",
):
    cfg = EngineConfig(
        device="cuda",
        dtype=str(next(model.parameters()).dtype).split(".")[-1],
        num_blocks=512,
        cuda_graphs=graphs,
        max_batch=16,
        max_context_tokens=1024,
        spec_tokens=spec,
        draft_heads=heads,
        fused_kernels=fused,
        overlap=overlap,
        spec_policy=policy,
        kv_cache=kv_cache,
        pdl=pdl,
        decode_linear=linear,
    )
    return LLMEngine("", cfg, model=model, tokenizer=NullTokenizer(model.cfg.vocab_size))


def smollm2_shape() -> LlamaConfig:
    return LlamaConfig.from_hf(shape_config("smollm2-random"))


def repeat_heads(cfg: LlamaConfig, tmp_path) -> str:
    """Heads that guess 'the same token again' (zero layers: the LM head sees the target's own
    state): right whenever a random model repeats itself, so drafts get accepted."""
    from safetensors.torch import save_file

    hid = cfg.hidden_size
    path = tmp_path / "repeat-heads.safetensors"
    save_file(
        {
            f"proj.{i}.{p}": torch.zeros((hid, hid) if p == "weight" else (hid,))
            for i in range(2)
            for p in ("weight", "bias")
        },
        str(path),
        metadata={"vocab_size": str(cfg.vocab_size)},
    )
    return str(path)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    return [
        torch.randint(100, 40000, (int(n),), generator=g).tolist()
        for n in torch.randint(5, 300, (12,), generator=g)
    ]


def test_graph_decode_equals_eager_fp32(prompts):
    cfg = LlamaConfig.from_hf(shape_config("smollm2-random"))
    model = random_llama(cfg, torch.float32, "cuda")
    eager, graphed = make(model, False), make(model, True)
    try:
        assert (
            graphed.core.runner.graphs is not None
            and graphed.core.runner.prefill_graphs is not None
        )
        assert run_engine(graphed, prompts) == run_engine(eager, prompts)
        assert max(r.batch for r in graphed.drain_steps() if r.kind == "prefill") > 1
        assert run_engine(graphed, prompts, sequential=True) == run_engine(
            eager, prompts, sequential=True
        )
        assert graphed.core.runner.eager_steps == {"prefill": 0, "decode": 0}  # every step replayed
    finally:
        eager.close()
        graphed.close()


@pytest.mark.parametrize("linear", ["cublas", "triton"])
def test_fused_kernels_equal_the_torch_path_fp32(prompts, linear):
    """Triton kernels (graphed, as served) against the torch path (eager) in fp32: same tokens,
    with decode, multi-prompt prefill and speculative verification all exercised; small steps'
    Linears by cuBLAS or by the Triton kernel (``llm.decode_linear``)."""
    cfg = LlamaConfig.from_hf(shape_config("smollm2-random"))
    fused_model = random_llama(cfg, torch.float32, "cuda")
    torch_model = random_llama(cfg, torch.float32, "cuda")  # same seed: same weights
    fused = make(fused_model, True, spec=4, linear=linear)
    ref = make(torch_model, False, fused=False)
    rep = [(p[:20] * 6)[:100] for p in prompts[:6]]
    try:
        assert fused_model.use_kernels and not torch_model.use_kernels
        assert (fused_model.triton_linear_rows > 0) == (linear == "triton")
        assert run_engine(fused, prompts) == run_engine(ref, prompts)
        assert run_engine(fused, rep, new=48) == run_engine(ref, rep, new=48)
        assert fused.core.scheduler.spec.proposed > 0
    finally:
        fused.close()
        ref.close()


def test_bf16_agreement_with_fp32_is_reported(prompts):
    cfg = LlamaConfig.from_hf(shape_config("smollm2-random"))
    ref = make(random_llama(cfg, torch.float32, "cuda"), True)
    bf = make(random_llama(cfg, torch.bfloat16, "cuda"), True)
    try:
        a, b = run_engine(ref, prompts), run_engine(bf, prompts)
    finally:
        ref.close()
        bf.close()
    first = sum(x[0] == y[0] for x, y in zip(a, b)) / len(a)
    same = sum(x == y for x, y in zip(a, b)) / len(a)
    print(
        f"bf16 vs fp32 (random weights): first token agree {first:.2f}, whole 32 tokens {same:.2f}"
    )
    assert first >= 0.5  # random weights have flat logits; a real bug gives ~0


def test_speculative_verify_graphs_equal_greedy_fp32(prompts):
    """Repetitive prompts make the n-gram drafter propose; graphed verification must keep greedy."""
    cfg = LlamaConfig.from_hf(shape_config("smollm2-random"))
    model = random_llama(cfg, torch.float32, "cuda")
    plain, spec = make(model, True), make(model, True, spec=4)
    rep = [(p[:20] * 6)[:100] for p in prompts[:6]]
    try:
        assert run_engine(spec, rep, new=48) == run_engine(plain, rep, new=48)
        assert spec.core.scheduler.spec.proposed > 0
    finally:
        plain.close()
        spec.close()


def test_sampled_speculation_in_graphs_equals_eager_fp32(prompts):
    """Rejection sampling over drafts reads every verified position's logits from the decode
    graph's kept LM-head output: the same seeded replies as the eager path, drafts kept."""
    cfg = LlamaConfig.from_hf(shape_config("smollm2-random"))
    model = random_llama(cfg, torch.float32, "cuda")
    eager, graphed = make(model, False, spec=4), make(model, True, spec=4)
    rep = [(p[:20] * 6)[:100] for p in prompts[:6]]
    draws = [Sampling(1.0, top_k=3, seed=i) for i in range(len(rep))]
    try:
        want = run_engine(eager, rep, new=32, sampling=draws)
        assert run_engine(graphed, rep, new=32, sampling=draws) == want
        assert graphed.core.scheduler.spec.accepted > 0
    finally:
        eager.close()
        graphed.close()


def test_draft_head_graphs_equal_greedy_fp32(prompts):
    """The embedded heads fit the SmolLM2 shape: graphed steps that also emit the heads' drafts
    must keep greedy tokens, and drafts must be proposed (prefill and decode graphs), with verify
    steps overlapped (queued before the last one's tokens are read)."""
    cfg = LlamaConfig.from_hf(shape_config("smollm2-random"))
    model = random_llama(cfg, torch.float32, "cuda")
    plain, heads = make(model, True), make(model, True, spec=2, heads="embedded")
    try:
        assert run_engine(heads, prompts, new=40) == run_engine(plain, prompts, new=40)
        assert heads.core.scheduler.spec.proposed > 0
        assert heads.core.ahead_steps > 0  # verify steps fed from the last one's results on the GPU
        assert heads.core.runner.eager_steps == {"prefill": 0, "decode": 0}
    finally:
        plain.close()
        heads.close()


def test_overlapped_decode_equals_step_by_step_fp32(prompts):
    """Decode steps queued before the previous step's tokens are read (their input tokens fed on
    the GPU) give the same tokens as stepping one at a time, with sequences ending at different
    lengths, on a stop token and by a cancel mid-reply; every KV block comes back."""
    cfg = LlamaConfig.from_hf(shape_config("smollm2-random"))
    model = random_llama(cfg, torch.float32, "cuda")
    step, over = make(model, True, overlap=False), make(model, True)

    def run(engine, stop=None, cancel_after=None):
        engine.core.scheduler.stop_ids = {stop} if stop is not None else set()

        async def main():
            async def one(i, p):
                req = GenerationRequest(f"o{i}", [], 8 + 5 * i, prompt_ids=p)
                got = []
                async for e in engine.submit(req):
                    if e.finish_reason is not None:
                        return got, e.finish_reason
                    got.append(e.token_id)
                    if i == 0 and cancel_after is not None and len(got) == cancel_after:
                        engine.cancel(req.request_id)

            return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts[:8])))

        return asyncio.run(main())

    try:
        free = over.core.blocks.available
        want = run(step)
        assert run(over) == want and over.core.ahead_steps > 0
        stop = want[5][0][len(want[5][0]) // 2]  # a token one reply makes midway: it stops there
        want = run(step, stop)
        assert any(r == "stop" for _, r in want)
        assert run(over, stop) == want
        got = run(over, cancel_after=3)
        assert got[0][1] == "cancelled" and got[0][0] == run(step)[0][0][: len(got[0][0])]
        assert got[1:] == run(step)[1:]
        assert over.core.blocks.available == free and step.core.runner.eager_steps["decode"] == 0
    finally:
        step.close()
        over.close()


def test_overlapped_verify_steps_with_accepted_drafts_equal_greedy_fp32(prompts, tmp_path):
    """Heads that guess 'the same token again' (zero layers: the LM head sees the target's own
    state) are right whenever the random model repeats itself, so drafts get accepted and verify
    steps fed on the GPU must shift their positions and slots by the accepted count."""
    model = random_llama(smollm2_shape(), torch.float32, "cuda")
    path = repeat_heads(model.cfg, tmp_path)
    plain = make(model, True, overlap=False)
    over, step = (
        make(model, True, spec=2, heads=path),
        make(model, True, spec=2, heads=path, overlap=False),
    )
    try:
        want = run_engine(plain, prompts, new=60)
        assert run_engine(over, prompts, new=60) == want
        assert run_engine(step, prompts, new=60) == want
        assert over.core.scheduler.spec.accepted > 0 and over.core.ahead_steps > 0
        assert step.core.ahead_steps == 0
    finally:
        plain.close()
        over.close()
        step.close()


def test_speculating_on_some_steps_only_with_overlap_equals_greedy_fp32(prompts, tmp_path):
    """The speculation policy turns drafts on and off between decode steps; a step launched ahead
    keeps its predecessor's width, so a change of mind waits for the next step that is not
    launched ahead. With heads that get accepted, graphed and overlapped, tokens stay greedy."""
    from voicert.engine.core.spec_policy import SpecPolicy

    class Flipping(SpecPolicy):
        def drafts(self, batch, prompts_waiting=False):
            return 0 if (self.spec_steps + self.plain_steps) // 4 % 2 else self.k

    model = random_llama(smollm2_shape(), torch.float32, "cuda")
    path = repeat_heads(model.cfg, tmp_path)
    plain, flip = make(model, True, overlap=False), make(model, True, spec=2, heads=path)
    flip.core.scheduler.policy = policy = Flipping(2)
    try:
        assert run_engine(flip, prompts, new=60) == run_engine(plain, prompts, new=60)
        assert policy.spec_steps > 0 and policy.plain_steps > 0
        assert flip.core.scheduler.spec.accepted > 0 and flip.core.ahead_steps > 0
    finally:
        plain.close()
        flip.close()


def test_guided_rows_in_graph_steps_equal_eager_fp32():
    """Tool calls decoded under their grammars beside plain rows: the graphed steps (the refused
    rows picked again from the graph's kept LM-head output) give the eager path's tokens, and
    every call parses. The tokenizer: VOICERT_TEST_TOKENIZER (a dir), else the embedded one."""
    import json
    import os

    from transformers import AutoTokenizer

    from voicert.agent.tool_calls import CallClosed, CallParser
    from voicert.core.chat import ChatMessage, ToolChoice, ToolChoiceMode, ToolSpec
    from voicert.engine.build import build_core
    from voicert.engine.settings import EngineConfig as CoreConfig

    tok_dir = os.environ.get("VOICERT_TEST_TOKENIZER")
    if not tok_dir:
        from voicert.config import ConfigError, cache_dir, load_config
        from voicert.engine.loader import resolve_llm

        try:
            tok_dir = str(resolve_llm("embedded", cache_dir(load_config(environ={}).models)))
        except ConfigError as exc:  # a GPU box without the embedded model's package
            pytest.skip(f"no tokenizer here: set VOICERT_TEST_TOKENIZER to a dir ({exc})")
    tok = AutoTokenizer.from_pretrained(tok_dir)
    cfg = LlamaConfig.from_hf(shape_config("smollm2-random"))
    model = random_llama(cfg, torch.float32, "cuda")
    tool = ToolSpec.of(
        "book",
        "Book a table",
        {
            "type": "object",
            "required": ["people", "note"],
            "additionalProperties": False,
            "properties": {
                "people": {"type": "integer", "minimum": 1, "maximum": 12},
                "note": {"type": "string", "maxLength": 12},
            },
        },
    )

    def run(graphs: bool) -> dict:
        core = build_core(
            "",
            CoreConfig(
                device="cuda",
                dtype="float32",
                num_blocks=512,
                cuda_graphs=graphs,
                max_batch=16,
                max_context_tokens=1024,
                fused_kernels=True,
            ),
            model=model,
            tokenizer=tok,
        )
        for i in range(12):
            guided = i % 2 == 0
            core.add(
                GenerationRequest(
                    f"r{i}",
                    [ChatMessage("user", f"Request number {i}, please.")],
                    48,
                    ignore_eos=not guided,
                    tools=(tool,) if guided else (),
                    tool_choice=ToolChoice(ToolChoiceMode.REQUIRED),
                )
            )
        out: dict = {f"r{i}": [] for i in range(12)}
        while core.has_work():
            for o in core.step():
                if o.finish_reason is None:
                    out[o.request_id].append(o.token_id)
        if graphs:
            assert core.runner.eager_steps["decode"] == 0 and core.guided_steps > 0
        return out

    graphed, eager = run(True), run(False)
    assert graphed == eager
    for i in range(0, 12, 2):
        parser = CallParser()
        pieces = parser.feed(tok.decode(graphed[f"r{i}"])) + parser.close()
        calls = [p for p in pieces if isinstance(p, CallClosed)]
        assert calls and json.loads(calls[0].arguments)["people"] >= 1


def test_fp8_graphed_and_fused_equals_fp8_eager_and_batched_equals_one_at_a_time(prompts):
    """FP8 weights (engine/gpu/fp8.py), as served (CUDA graphs, fused kernels) against eager torch
    layers over the same FP8 weights, fp32 activations: same tokens, together or one at a time."""
    from voicert.engine.gpu.fp8 import quantize_fp8

    cfg = LlamaConfig.from_hf(shape_config("smollm2-random"))
    model = random_llama(cfg, torch.float32, "cuda")
    quantize_fp8(model)
    assert_served_is_eager(model, prompts)


def assert_served_is_eager(model, prompts) -> None:
    """``model`` as served (CUDA graphs, fused kernels) gives eager torch layers' tokens over
    the same weights, together or one at a time."""
    eager, served = make(model, False, fused=False), make(model, True)
    try:
        want = run_engine(eager, prompts)
        assert run_engine(served, prompts) == want
        assert run_engine(served, prompts, sequential=True) == want
    finally:
        eager.close()
        served.close()


def test_int4_graphed_and_fused_equals_int4_eager_batched_one_at_a_time_and_speculative(prompts):
    """INT4 weights (engine/gpu/int4.py; SmolLM2's K of 576 in groups of 64, of 1536 in 128), as
    served (CUDA graphs, the Triton kernel) against eager torch layers over the same codes, fp32
    activations: same tokens, together or one at a time, and with speculation's verify steps."""
    from voicert.engine.gpu.int4 import quantize_int4

    cfg = LlamaConfig.from_hf(shape_config("smollm2-random"))
    model = random_llama(cfg, torch.float32, "cuda")
    assert quantize_int4(model) == 4 * cfg.num_layers
    eager, served = make(model, False, fused=False), make(model, True)
    spec = make(model, True, spec=2)
    try:
        want = run_engine(eager, prompts)
        assert run_engine(served, prompts) == want
        assert run_engine(served, prompts, sequential=True) == want
        assert run_engine(spec, prompts) == want
    finally:
        for e in (eager, served, spec):
            e.close()


def test_a_model_of_int4_and_fp8_layers_graphed_and_fused_equals_it_eager(prompts):
    """A GGUF Q4_K_M model as ``llm.int4`` serves it: INT4 layers in groups of 32 beside FP8
    ones (its Q6_K layers: q/k/v and down in every other layer here), as served against eager
    torch layers over the same weights: same tokens, together or one at a time."""
    from voicert.engine.gpu.fp8 import Fp8Linear
    from voicert.engine.gpu.int4 import Int4Linear, quantize_int4

    cfg = LlamaConfig.from_hf(shape_config("smollm2-random"))
    model = random_llama(cfg, torch.float32, "cuda")
    for layer in model.layers[1::2]:
        layer.attn.qkv = Fp8Linear.from_linear(layer.attn.qkv)
        layer.mlp.down = Fp8Linear.from_linear(layer.mlp.down)
    assert quantize_int4(model, group=32) == 4 * cfg.num_layers - 2 * len(model.layers[1::2])
    assert isinstance(model.layers[0].mlp.down, Int4Linear)
    assert_served_is_eager(model, prompts)


@pytest.mark.parametrize("kind,dtype", [("fp8", torch.float8_e4m3fn), ("int8", torch.int8)])
def test_one_byte_kv_cache_graphed_and_fused_equals_eager_and_batched_equals_one_at_a_time(
    prompts, kind, dtype
):
    """A one-byte KV cache (llm.kv_cache) as served (CUDA graphs; the Triton kernels round k and
    v into it and widen them as they read) against the eager torch layers over such a pool, fp32
    activations: same tokens, together or one at a time, and with speculation's verify steps."""
    model = random_llama(smollm2_shape(), torch.float32, "cuda")
    eager, served = make(model, False, fused=False, kv_cache=kind), make(model, True, kv_cache=kind)
    spec = make(model, True, spec=2, kv_cache=kind)
    try:
        assert served.core.runner.k_pool.dtype == dtype
        want = run_engine(eager, prompts)
        assert run_engine(served, prompts) == want
        assert run_engine(served, prompts, sequential=True) == want
        assert run_engine(spec, prompts) == want
    finally:
        for e in (eager, served, spec):
            e.close()


def test_gptq_block_loop_replayed_as_a_cuda_graph_equals_the_eager_loop():
    """FP8's GPTQ rounding replays each block's column loop as a CUDA graph: the same kernels as
    the eager loop, so the same bits, and the graph is reused across blocks and calls."""
    from voicert.engine.gpu.fp8 import _BlockGraph, _round_block, gptq_round, gptq_weights

    g = torch.Generator(device="cuda").manual_seed(0)
    stack, n, block = 2, 96, 32
    wb = torch.randn(stack, block, n, device="cuda", generator=g)  # columns as rows
    a = torch.randn(stack, block, block, device="cuda", generator=g)
    eye = torch.eye(block, device="cuda")
    hb = torch.linalg.cholesky(a @ a.transpose(1, 2) + block * eye, upper=True)
    scale = torch.rand(stack, block, n, device="cuda", generator=g) / 100 + 1e-3  # [L, B, N]
    zero = torch.zeros_like(scale)
    outs = []
    for fn in (_round_block, _BlockGraph((stack, block, n), torch.device("cuda"))):
        w, q, errs = wb.clone(), torch.empty_like(wb), torch.empty_like(wb)
        fn(w, hb, scale, zero, q, errs)
        outs.append((w, q, errs))
    for x, y in zip(*outs):
        assert torch.equal(x, y)
    graphs: dict = {}
    x = torch.randn(500, 3 * block, device="cuda", generator=g)
    ws = [torch.randn(n, 3 * block, device="cuda", generator=g) for _ in range(stack)]
    on_gpu = gptq_weights(ws, [x.T @ x / 500] * stack, block=block, graphs=graphs)
    assert [key[:3] for key in graphs] == [(stack, block, n)]  # one graph, replayed for 3 blocks
    from voicert.engine.gpu.int4 import grid

    on_cpu = gptq_weights([w.cpu() for w in ws], [(x.T @ x / 500).cpu()] * stack, block=block)
    for (q1, s1), (q2, s2) in zip(on_gpu, on_cpu):
        assert torch.allclose(
            s1.cpu(), s2, rtol=1e-6, atol=0
        )  # a division may differ in its last bit
        assert (
            q1.cpu().float() != q2.float()
        ).float().mean() < 0.01  # the CPU's float order differs
    x, ws = x[:, :64], [w[:, :64] for w in ws]  # (a K of whole groups)
    h = x.T @ x / 500
    int4 = gptq_round(ws, [h] * stack, grid(64), block=block, graphs=graphs)
    assert len(graphs) == 2  # its own graph: another grid
    cpu = gptq_round([w.cpu() for w in ws], [h.cpu()] * stack, grid(64), block=block)
    assert (int4[0].cpu() != cpu[0]).float().mean() < 0.01  # the CPU's float order differs


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
    reason="programmatic dependent launch: compute capability 9.0 or newer",
)
@pytest.mark.parametrize("fp8", [False, True])
def test_pdl_served_engine_gives_the_tokens_of_plain_launches_bf16(prompts, fp8):
    """``llm.pdl`` as served (bf16, CUDA graphs, fused kernels, small steps' Linears by the Triton
    kernel; with FP8 weights too): the same tokens as the same engine launching its kernels
    plainly, batched and one at a time."""
    from voicert.engine.gpu.fp8 import quantize_fp8

    models = [random_llama(smollm2_shape(), torch.bfloat16, "cuda") for _ in range(2)]  # same seed
    for m in models if fp8 else ():
        quantize_fp8(m)
    plain = make(models[0], True, pdl="off", linear="triton")
    pdl = make(models[1], True, pdl="on", linear="triton")
    try:
        assert models[1].pdl and not models[0].pdl
        assert run_engine(pdl, prompts) == run_engine(plain, prompts)
        assert run_engine(pdl, prompts, sequential=True) == run_engine(
            plain, prompts, sequential=True
        )
    finally:
        plain.close()
        pdl.close()
