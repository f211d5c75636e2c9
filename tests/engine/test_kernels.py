"""The Triton kernels against the torch path they replace. On a machine without CUDA they run in
Triton's interpreter on CPU tensors (slow: the model here is tiny); on the GPU machine, compiled."""

import dataclasses
import os

import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"
if DEV == "cpu":  # read when the kernels are decorated, i.e. at their import
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from voicert.engine.gpu import kernels  # noqa: E402


def _interpreter_index_fix() -> None:
    """Triton 3.6's interpreter turns a scalar (a one-element array) into a loop bound with
    ``int(array)``, which NumPy >= 2.4 refuses for arrays of one dimension: take the element."""
    from triton.runtime import interpreter

    patch = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


def _compile_kernels():
    """scripts/compile_kernels.py, as a module."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "compile_kernels.py"
    spec = importlib.util.spec_from_file_location("compile_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LAUNCHES: list[dict] = []  # (CPU) every interpreted launch of this module's tests, in order


if DEV == "cpu":  # (for test_each_kernel_launched_here_compiles_for_hopper_as_served)
    _interpreter_index_fix()
    _compile_kernels().record_launches(LAUNCHES)
from tests.engine.quantized import TINY  # noqa: E402
from voicert.engine.core.runner import ModelRunner, Row  # noqa: E402
from voicert.engine.models.llama import AttnInputs, LlamaConfig, random_llama  # noqa: E402


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return torch.allclose(a.float(), b.float(), atol=tol, rtol=tol)


def test_add_rms_norm_matches_torch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 96, generator=g).to(DEV)
    res = torch.randn(5, 3, 96, generator=g).to(DEV)
    w = torch.randn(96, generator=g).to(DEV)
    want_res = res + x
    want = torch.nn.functional.rms_norm(want_res, (96,), w, 1e-5)
    got, got_res = kernels.add_rms_norm(x, res.clone(), w, 1e-5)
    assert close(got_res, want_res, 0) and close(got, want)
    alone, same = kernels.add_rms_norm(x, None, w, 1e-5)
    assert same is x and close(alone, torch.nn.functional.rms_norm(x, (96,), w, 1e-5))


def test_silu_mul_matches_torch():
    gu = torch.randn(4, 2, 2 * 1500, generator=torch.Generator().manual_seed(1)).to(DEV)
    gate, up = gu.chunk(2, dim=-1)
    assert close(kernels.silu_mul(gu), torch.nn.functional.silu(gate) * up)


def block_tables(lengths: list[int], bs: int, room: int) -> tuple[list[list[int]], int]:
    """Each sequence's blocks (block 0 left as scratch), with room for ``room`` more tokens, and
    the number of blocks the pool needs."""
    tables, nxt = [], 1
    for n in lengths:
        k = -(-(n + room) // bs)
        tables.append(list(range(nxt, nxt + k)))
        nxt += k
    return tables, nxt


def run_layers(model, runner, rows, fused: bool) -> torch.Tensor:
    model.use_kernels = fused
    ids, inp = runner.prepare(rows)
    with torch.inference_mode():
        return model(ids, inp, runner.k_pool, runner.v_pool)  # [B, Q, hidden]


def _slots_of(table: torch.Tensor, pos: torch.Tensor, bs: int) -> torch.Tensor:
    """The pool slots [B * Q] of the positions pos [B, Q] through the block table [B, MB]."""
    return torch.stack([table[b][pos[b] // bs] * bs + pos[b] % bs for b in range(len(pos))]).view(
        -1
    )


def _tiny_model(qk: bool, g: torch.Generator):
    """TINY in fp32; with ``qk``, Qwen3's q/k norms and biases, the norms' weights drawn from
    ``g`` (they start at one: make them matter)."""
    cfg = dataclasses.replace(TINY, qk_norm=True, attention_bias=True) if qk else TINY
    model = random_llama(cfg, torch.float32, DEV)
    if qk:
        with torch.no_grad():
            for layer in model.layers:
                for norm in (layer.attn.q_norm, layer.attn.k_norm):
                    norm.weight.copy_(torch.rand(cfg.head_dim, generator=g) + 0.5)
    return model


def _cached_step(model, lengths: list[int], width: int, g: torch.Generator):
    """Two runners whose pools hold the same cached prefixes of ``lengths`` tokens (torch path;
    blocks of 16, room for 40 more), and a step's rows of ``width`` new tokens after them
    (every other row one token short when ``width`` > 1: padding), tokens drawn from ``g``."""
    tables, nxt = block_tables(lengths, 16, 40)
    runners = [ModelRunner(model, nxt, 16) for _ in range(2)]
    prefix = [torch.randint(0, 300, (n,), generator=g).tolist() for n in lengths]
    for runner in runners:
        run_layers(model, runner, [Row(p, 0, t, len(p)) for p, t in zip(prefix, tables)], False)
    rows = [
        Row(torch.randint(0, 300, (width - i % 2 * (width > 1),), generator=g).tolist(), n, t, 0)
        for i, (n, t) in enumerate(zip(lengths, tables))
    ]
    return runners, rows


@pytest.mark.parametrize(
    "case",
    [
        "decode",
        "decode-wide",
        "decode-triton-linear",
        "decode-one-triton-linear",
        "decode-qk-norm",
        "verify",
        "verify-one",
        "prefill-short",
        "prefill-on-prefix",
        "prefill-sdpa",
        "prefill-qk-norm",
        "long-split",
    ],
)
def test_fused_forward_matches_torch_forward(case):
    """Same hidden states and the same KV pool contents as the torch path, over the shapes the
    engine runs: batched decode of ragged lengths, speculative verify rows (padded), a prefill
    on top of a cached prefix (the paged kernel over tiles of query tokens, short and long; and
    with ``prefill_attention: sdpa``, gather + SDPA) and a long context at batch 1 (split
    keys). ``qk-norm``: Qwen3's per-head q and k norms (in the RoPE kernel), with q/k biases."""
    model = _tiny_model(case.endswith("qk-norm"), torch.Generator().manual_seed(3))
    if case == "prefill-sdpa":
        model.prefill_attention = "sdpa"
    if "triton-linear" in case:  # Linears by the FP8 kernel (unscaled; one row: gemv)
        model.triton_linear_rows = 16
    lengths = {
        "decode": [5, 40, 17],
        "decode-wide": [5, 40, 17, 3, 60, 21],
        "decode-triton-linear": [5, 40, 17],
        "decode-one-triton-linear": [40],
        "decode-qk-norm": [5, 40, 17],
        "prefill-qk-norm": [20, 33],
        "verify": [30, 9],
        "verify-one": [45],
        "prefill-short": [70],
        "prefill-on-prefix": [20, 33],
        "prefill-sdpa": [20, 33],
        "long-split": [300],
    }[case]
    width = {
        "verify": 3,
        "verify-one": 3,
        "prefill-short": 7,
        "prefill-on-prefix": 24,
        "prefill-sdpa": 24,
        "prefill-qk-norm": 24,
    }.get(case, 1)
    runners, rows = _cached_step(model, lengths, width, torch.Generator().manual_seed(2))
    want = run_layers(model, runners[0], rows, False)
    got = run_layers(model, runners[1], rows, True)
    for i, r in enumerate(rows):  # padding positions are don't-care
        assert close(got[i, : len(r.tokens)], want[i, : len(r.tokens)], 1e-4), f"row {i}"
    assert close(runners[1].k_pool[:, 1:], runners[0].k_pool[:, 1:], 1e-5)  # block 0: scratch
    assert close(runners[1].v_pool[:, 1:], runners[0].v_pool[:, 1:], 1e-5)


@pytest.mark.parametrize("lengths", [[40], [5, 40]])
def test_the_glu_in_a_one_row_gate_up_gives_the_bits_of_silu_muls_launch(monkeypatch, lengths):
    """``GEMV_GLU``: a one-row step whose gate_up runs by gemv takes SiLU(gate) * up in that
    launch, with the hidden states and pools of gate_up then ``silu_mul``, bit for bit, and no
    ``silu_mul`` launch; a step of two rows keeps the launch."""
    model = _tiny_model(False, torch.Generator().manual_seed(3))
    model.triton_linear_rows = 16  # Linears by the FP8 kernel, unscaled; one row: gemv
    runners, rows = _cached_step(model, lengths, 1, torch.Generator().manual_seed(2))
    launched, real = [], kernels.norms._silu_mul_kernel

    class Counted:  # silu_mul's launches, wherever silu_mul is called from
        def __getitem__(self, grid):
            launched.append(1)
            return real[grid]

    monkeypatch.setattr(kernels.norms, "_silu_mul_kernel", Counted())
    monkeypatch.setattr(kernels.matvec, "GEMV_GLU", False)
    want = run_layers(model, runners[0], rows, True)
    off = len(launched)
    monkeypatch.setattr(kernels.matvec, "GEMV_GLU", True)
    got = run_layers(model, runners[1], rows, True)
    assert (off, len(launched) - off) == (
        TINY.num_layers,
        0 if len(lengths) == 1 else TINY.num_layers,
    )
    assert torch.equal(got, want)
    assert torch.equal(runners[1].k_pool[:, 1:], runners[0].k_pool[:, 1:])  # block 0: scratch


@pytest.mark.parametrize("case", ["decode", "verify", "qk-norm", "long-split"])
def test_rope_in_the_attention_gives_the_bits_of_its_own_launch(monkeypatch, case):
    """``ROPE_IN_ATTENTION_ROWS``: a decode or verify step of at least that many rows does its
    RoPE and KV write inside the paged attention, with the same hidden states and pool contents,
    bit for bit, as rope_kv_write's launch before it, which is then not launched; a step of
    fewer rows, or of more tokens than one program's 16 query rows, keeps the launch. Ragged
    rows, padded verify rows, a long row split over the keys, and Qwen3's q/k norms."""
    g = torch.Generator().manual_seed(13)
    model = _tiny_model(case == "qk-norm", g)
    lengths = {"decode": [5, 40, 17], "verify": [30, 9], "qk-norm": [5, 40, 17]}.get(case, [300])
    width = 3 if case == "verify" else 1
    runners, rows = _cached_step(model, lengths, width, g)
    launched, real = [], kernels.rope_kv_write
    monkeypatch.setattr(kernels, "rope_kv_write", lambda *a: launched.append(1) or real(*a))
    att, n = kernels.attention, len(rows) * width  # the step's rows
    monkeypatch.setattr(att, "ROPE_IN_ATTENTION_ROWS", n + 1)  # one more than the step has
    want = run_layers(model, runners[0], rows, True)
    assert launched and att.rope_in_attention(len(rows), width, 3) is False
    launched.clear()
    monkeypatch.setattr(att, "ROPE_IN_ATTENTION_ROWS", n)
    assert att.rope_in_attention(len(rows), 6, 3) is False  # 18 query rows: not one program's
    got = run_layers(model, runners[1], rows, True)
    assert not launched, "rope_kv_write launched beside the attention that does its work"
    assert torch.equal(got, want)
    # block 0 is the scratch block every padding token writes, in no set order on a GPU: the
    # two runners' prefills leave different values there (the H200 showed it), so it is left out
    assert torch.equal(runners[1].k_pool[:, 1:], runners[0].k_pool[:, 1:])
    assert torch.equal(runners[1].v_pool[:, 1:], runners[0].v_pool[:, 1:])


@pytest.mark.parametrize("pool", [torch.float32, torch.float8_e4m3fn, torch.int8])
def test_rope_in_the_attention_writes_each_new_key_once_in_any_pool(pool):
    """The paged attention given ``rope``: decode and verify rows whose new keys straddle two
    key splits (each split's program writes its own) equal rope_kv_write then the attention,
    bit for bit, in a float32, FP8 or int8 pool (scales after each row), and leave qkv as it
    was."""
    if pool == torch.int8 and DEV == "cpu":
        pytest.skip("the int8 pool rounds by libdevice.rint, which Triton's interpreter lacks")
    g = torch.Generator().manual_seed(14)
    h, kvh, d, bs, blocks, q_len = 6, 2, 16, 16, 12, 3
    row = d + 4 if pool == torch.int8 else d  # an int8 row carries its float32 scale
    shape = (1 + 2 * blocks, bs, kvh, row)
    base = torch.randn(2, *shape[:-1], d, generator=g)
    if pool == torch.int8:
        pools = torch.zeros(2, *shape, dtype=torch.int8)
        pools[..., :d] = (base * 40).round().clamp(-127, 127).to(torch.int8)
        pools[..., d:] = torch.full((*shape[:-1], 1), 0.02).view(torch.int8)
    else:
        pools = base.to(pool)
    qkv = torch.randn(2, q_len, (h + 2 * kvh) * d, generator=g).to(DEV)
    table = (torch.randperm(2 * blocks, generator=g) + 1).view(2, blocks).to(DEV)
    pos = (torch.tensor([[62], [120]]) + torch.arange(q_len)).to(DEV)  # row 0: 62-64, a split at 64
    slots = _slots_of(table, pos, bs)
    cos, sin = (
        torch.randn(256, d // 2, generator=g).to(DEV),
        torch.randn(256, d // 2, generator=g).to(DEV),
    )
    results = []
    for fused in (False, True):
        k_pool, v_pool = (p.clone().to(DEV) for p in pools)
        q = qkv.clone()
        if fused:
            rope = kernels.attention.RopeInputs(cos, sin, slots)
            out = kernels.paged_attention(q, k_pool, v_pool, table, pos, h, kvh, rope=rope)
            assert torch.equal(q, qkv), "qkv left as it was"
        else:
            kernels.rope_kv_write(
                q.view(2 * q_len, -1), pos.view(-1), cos, sin, slots, k_pool, v_pool, h, kvh
            )
            out = kernels.paged_attention(q, k_pool, v_pool, table, pos, h, kvh)
        results.append((out, k_pool.view(torch.uint8), v_pool.view(torch.uint8)))
    for want, got in zip(*results):
        assert torch.equal(got, want)


def test_fused_q_k_norms_other_than_rmsnorm_are_refused_not_computed_wrong():
    """The RoPE kernel computes layers.RMSNorm (Qwen3's); Gemma's norm (1 + weight) would come
    out wrong there, so a model whose q/k norms are another type stops with a message."""
    from voicert.engine.models.gemma import GemmaNorm

    model = random_llama(dataclasses.replace(TINY, qk_norm=True), torch.float32, DEV)
    model.layers[0].attn.q_norm = GemmaNorm(TINY.head_dim, TINY.rms_norm_eps).to(DEV)
    tables, nxt = block_tables([5], 16, 4)
    runner = ModelRunner(model, nxt, 16)
    with pytest.raises(NotImplementedError, match="fused q/k norms of GemmaNorm"):
        run_layers(model, runner, [Row([1, 2, 3, 4, 5], 0, tables[0], 5)], True)


def test_paged_attention_splits_keys_for_a_small_batch():
    """The split-keys path (several programs per KV head, then a combine) is the one taken at
    batch 1; it must agree with a single pass over the same keys."""
    model = random_llama(TINY, torch.float32, DEV)
    attn = model.layers[0].attn
    b, q_len, span_blocks, bs = 1, 2, 20, 16
    pool = torch.randn(2, 1 + span_blocks, bs, 2, 16, generator=torch.Generator().manual_seed(3))
    k_pool, v_pool = pool[0].to(DEV), pool[1].to(DEV)
    qkv = torch.randn(b, q_len, (6 + 4) * 16, generator=torch.Generator().manual_seed(4)).to(DEV)
    table = torch.arange(1, 1 + span_blocks, device=DEV).view(1, -1)
    pos = torch.tensor([[250, 251]], device=DEV)
    inp = AttnInputs(pos, torch.zeros(2, dtype=torch.long, device=DEV), table)
    count = kernels.counters(DEV, 8)
    got = kernels.paged_attention(qkv, k_pool, v_pool, table, pos, 6, 2, count)
    again = kernels.paged_attention(qkv, k_pool, v_pool, table, pos, 6, 2, count)
    assert not count.any(), "the last split program leaves its counter at zero"
    assert torch.equal(got, again)
    span = torch.arange(span_blocks * bs, device=DEV)
    mask = (
        torch.zeros(())
        .to(DEV)
        .masked_fill(~(span.view(1, 1, -1) <= pos.unsqueeze(-1)).unsqueeze(1), float("-inf"))
    )
    q = qkv.view(b, q_len, 10, 16)[:, :, :6]
    want = attn.attend(q, inp, mask, k_pool, v_pool)
    assert close(got, want, 1e-5)


def test_paged_attention_over_query_tiles_equals_sdpa_over_each_rows_keys():
    """A prefill step's rows take several tiles of query tokens, each split over the keys: every
    real query row equals SDPA over exactly the keys it may see, padding tokens included in the
    step (right-padded rows, position 0) change nothing, and the counters end at zero."""
    model = random_llama(TINY, torch.float32, DEV)
    attn = model.layers[0].attn
    g = torch.Generator().manual_seed(5)
    bs, blocks, q_len = 16, 12, 45  # 21 tokens a tile with 3 query heads per KV head: 3 tiles
    pool = torch.randn(2, 1 + 2 * blocks, bs, 2, 16, generator=g)
    k_pool, v_pool = pool[0].to(DEV), pool[1].to(DEV)
    qkv = torch.randn(2, q_len, (6 + 4) * 16, generator=g).to(DEV)
    table = torch.stack(
        [
            torch.randperm(2 * blocks, generator=g)[:blocks] + 1,
            torch.randperm(2 * blocks, generator=g)[:blocks] + 1,
        ]
    ).to(DEV)
    starts, real = (100, 7), (q_len, 30)  # row 1: 30 real tokens after 7 cached, then padding
    pos = torch.zeros(2, q_len, dtype=torch.long)
    for i, (s0, n) in enumerate(zip(starts, real)):
        pos[i, :n] = torch.arange(s0, s0 + n)
    pos = pos.to(DEV)
    inp = AttnInputs(pos, torch.zeros(2 * q_len, dtype=torch.long, device=DEV), table)
    count = kernels.counters(DEV, 64)
    got = kernels.paged_attention(qkv, k_pool, v_pool, table, pos, 6, 2, count)
    assert not count.any(), "the last split program of each tile leaves its counter at zero"
    span = torch.arange(blocks * bs, device=DEV)
    mask = (
        torch.zeros(())
        .to(DEV)
        .masked_fill(~(span.view(1, 1, -1) <= pos.unsqueeze(-1)).unsqueeze(1), float("-inf"))
    )
    want = attn.attend(qkv.view(2, q_len, 10, 16)[:, :, :6], inp, mask, k_pool, v_pool)
    for i, n in enumerate(real):
        assert close(got[i, :n], want[i, :n], 1e-5), f"row {i}"


@pytest.mark.parametrize(
    "head_dim, tiles",
    [(64, None), (128, None), (128, (64, 2, 4)), (128, (32, 1, 4)), (128, (128, 2, 8))],
)
def test_paged_decode_attention_equals_softmax_attention_at_the_served_head_dims(
    monkeypatch, head_dim, tiles
):
    """Decode rows of ragged lengths at the head dims the served models have (each dim takes its
    own keys per step) equal softmax attention over exactly each row's keys; so do the keys a
    step, pipeline stages and warps set by ``_DECODE_BLOCK_N``, ``_DECODE_STAGES`` and
    ``_DECODE_WARPS``."""
    if tiles:
        monkeypatch.setattr(kernels.attention, "_DECODE_BLOCK_N", tiles[0])
        monkeypatch.setattr(kernels.attention, "_DECODE_STAGES", tiles[1])
        monkeypatch.setattr(kernels.attention, "_DECODE_WARPS", tiles[2])
    g = torch.Generator().manual_seed(head_dim)
    h, kvh, bs, blocks = 4, 2, 16, 12
    k_pool = torch.randn(1 + 2 * blocks, bs, kvh, head_dim, generator=g).to(DEV)
    v_pool = torch.randn(1 + 2 * blocks, bs, kvh, head_dim, generator=g).to(DEV)
    qkv = torch.randn(2, 1, (h + 2 * kvh) * head_dim, generator=g).to(DEV)
    table = (torch.randperm(2 * blocks, generator=g) + 1).view(2, blocks).to(DEV)
    pos = torch.tensor([[150], [37]], device=DEV)
    got = kernels.paged_attention(
        qkv, k_pool, v_pool, table, pos, h, kvh, kernels.counters(DEV, 16)
    )
    for b in range(2):
        n = int(pos[b, 0]) + 1
        slots = (table[b].repeat_interleave(bs) * bs + torch.arange(bs, device=DEV).repeat(blocks))[
            :n
        ]
        keys = k_pool.view(-1, kvh, head_dim)[slots].repeat_interleave(h // kvh, dim=1)  # [n, H, D]
        vals = v_pool.view(-1, kvh, head_dim)[slots].repeat_interleave(h // kvh, dim=1)
        q = qkv[b, 0, : h * head_dim].view(h, head_dim)
        w = torch.softmax(torch.einsum("hd,nhd->hn", q, keys) * head_dim**-0.5, dim=-1)
        want = torch.einsum("hn,nhd->hd", w, vals).reshape(-1)
        assert close(got[b, 0], want, 1e-4), f"row {b}"


def _reads_before_the_wait(monkeypatch, module) -> set[int]:
    """From now on, the byte addresses that each interpreted program of ``module``'s kernels
    loads before its ``_pdl_enter`` (the PDL wait), gathered in the set returned."""
    from triton.runtime import interpreter

    builder, waited, before = interpreter.interpreter_builder, [False], set()
    grid, load = builder.set_grid_idx, builder.create_masked_load

    def next_program(x, y, z):
        waited[0] = False
        return grid(x, y, z)

    def masked_load(ptrs, mask, *rest):
        if not waited[0]:
            before.update(ptrs.data[mask.data].reshape(-1).tolist())
        return load(ptrs, mask, *rest)

    monkeypatch.setattr(builder, "set_grid_idx", next_program)
    monkeypatch.setattr(builder, "create_masked_load", masked_load)
    monkeypatch.setattr(module, "_pdl_enter", lambda pdl: waited.__setitem__(0, True))
    return before


def _bytes(t: torch.Tensor) -> range:
    return range(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())


@pytest.mark.skipif(DEV != "cpu", reason="watches the interpreter's loads")
@pytest.mark.parametrize("q_len", [1, 3])
def test_rope_and_attention_read_nothing_the_kernel_before_writes_until_the_pdl_wait(
    monkeypatch, q_len
):
    """Under PDL a kernel starts while the one before it still runs, so before its wait it may
    read only what that kernel does not write. rope_kv_write (after the qkv Linear) reads its
    positions, slots and tables early, never qkv; the paged attention (after rope_kv_write)
    reads its positions and its first key tile's block-table entries early (no kernel of the
    step writes the table), never q nor this step's new keys and values (decode and a verify
    step of 3 tokens); doing RoPE itself (after the qkv Linear), never qkv."""
    g = torch.Generator().manual_seed(8)
    h, kvh, d, bs, blocks = 4, 2, 16, 16, 6
    k_pool = torch.randn(1 + 2 * blocks, bs, kvh, d, generator=g)
    v_pool = torch.randn(1 + 2 * blocks, bs, kvh, d, generator=g)
    qkv = torch.randn(2, q_len, (h + 2 * kvh) * d, generator=g)
    table = (torch.randperm(2 * blocks, generator=g) + 1).view(2, blocks)
    pos = torch.tensor([[40], [13]]) + torch.arange(q_len)  # [2, Q]: this step's new keys
    slots = _slots_of(table, pos, bs)
    cos, sin = torch.randn(64, d // 2, generator=g), torch.randn(64, d // 2, generator=g)
    written = [_bytes(qkv)] + [
        _bytes(pool.view(-1, kvh, d)[s]) for pool in (k_pool, v_pool) for s in slots.tolist()
    ]
    raw = qkv.clone(), k_pool.clone(), v_pool.clone()  # (for the attention with RoPE inside)
    before = _reads_before_the_wait(monkeypatch, kernels.attention)
    kernels.rope_kv_write(
        qkv.view(2 * q_len, -1), pos.view(-1), cos, sin, slots, k_pool, v_pool, h, kvh
    )
    assert not any(a in _bytes(qkv) for a in before), "rope read q, k or v before the wait"
    assert any(a in _bytes(pos) for a in before) and any(a in _bytes(cos) for a in before)
    before.clear()
    want = kernels.paged_attention(qkv, k_pool, v_pool, table, pos, h, kvh)
    assert not any(a in span for span in written for a in before), "read what rope writes"
    assert any(a in _bytes(pos) for a in before) and any(a in _bytes(table) for a in before)
    before.clear()  # with RoPE inside, the kernel before is the qkv Linear: qkv it writes
    roped = kernels.attention.RopeInputs(cos, sin, slots)
    assert torch.equal(kernels.paged_attention(*raw, table, pos, h, kvh, rope=roped), want)
    assert before and not any(a in _bytes(raw[0]) for a in before), "read qkv before the wait"
    monkeypatch.undo()  # the same attention, the interpreter as it was
    assert torch.equal(kernels.paged_attention(qkv, k_pool, v_pool, table, pos, h, kvh), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_rows_matches_torch_argmax_ties_included(dtype):
    """Many programs per row, the last one to finish picks: the same index as torch.argmax,
    including ties across and within chunks (the first column wins) and a ragged last chunk."""
    g = torch.Generator().manual_seed(5)
    v = 3 * 4096 + 77  # four chunks, the last one short
    x = torch.randn(6, v, generator=g).to(dtype)
    x[1, [10, 5000, 9000]] = 50.0  # tie across chunks: 10
    x[2, [4200, 4100]] = 50.0  # tie within a chunk: 4100
    x[3, v - 1] = 50.0  # in the short chunk
    x[4] = 1.0  # all equal: 0
    x = x.to(DEV)
    count = kernels.counters(DEV, 16)
    got = kernels.argmax_rows(x, count)
    assert got.dtype == torch.long and torch.equal(got, x.float().argmax(-1))
    assert got[1:5].tolist() == [10, 4100, v - 1, 0]
    assert not count.any()
    buf = torch.full((2, 10), -1, dtype=torch.long, device=DEV)  # rows written into a strided view
    kernels.argmax_rows(x.view(2, 3, v), count, out=buf[:, :3])
    assert torch.equal(buf[:, :3].reshape(-1), got) and (buf[:, 3:] == -1).all()


def test_model_greedy_uses_the_kernel_and_matches_the_torch_path():
    model = random_llama(TINY, torch.float32, DEV)
    h = torch.randn(2, 3, 96, generator=torch.Generator().manual_seed(6)).to(DEV)
    model.use_kernels = False
    want = model.greedy(h)
    model.use_kernels = True
    assert torch.equal(model.greedy(h), want)


def test_rope_tables_hold_the_torch_paths_cos_and_sin():
    model = random_llama(TINY, torch.float32, DEV)
    cos, sin = model.rope_tables()
    pos = torch.tensor([[0, 1, 517, 4095]], device=DEV)
    c, s = model._rope(pos)  # [1, 4, 1, D]: halves repeated, sin with rotate_half's sign
    half = TINY.head_dim // 2
    assert cos.shape == (TINY.max_position, half)
    assert torch.equal(c[0, :, 0, :half], cos[pos[0]]) and torch.equal(
        c[0, :, 0, half:], cos[pos[0]]
    )
    assert torch.equal(s[0, :, 0, half:], sin[pos[0]]) and torch.equal(
        s[0, :, 0, :half], -sin[pos[0]]
    )


def test_feed_step_takes_inputs_from_the_previous_steps_results():
    """A verify step (W = 3) fed from the previous one: row 0 from previous row 1, whose drafts
    were accepted once (n = 1); row 1 from previous row 0 (n = 0); row 2 staged by the host.
    The kernel and the torch fallback agree, and so do their accept counts."""
    from voicert.engine.core.runner import accept_counts, feed_step

    bs = 4
    out = torch.tensor(
        [
            [10, 11, 12, 20, 21, 22, 30, 31, 32],  # greedy tokens, rows of W
            [40, 41, 42, 50, 51, 52, 60, 61, 62],  # head 0's guesses
            [70, 71, 72, 80, 81, 82, 90, 91, 92],
        ],
        device=DEV,
    )  # head 1's
    acc = torch.tensor([0, 1, 2], device=DEV)
    tables = torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4], [9, 9, 9, 9]], device=DEV)
    for use_kernels in (True, False):
        ids = torch.tensor([[0, 0, 0], [0, 0, 0], [7, 8, 9]], device=DEV)
        pos = torch.tensor([[8, 9, 10], [3, 4, 5], [1, 2, 3]], device=DEV)  # laid out for n = 2
        slots = torch.full((3, 3), -1, device=DEV)
        src = torch.tensor([[1, -1, -1], [0, -1, -1], [-1, -1, -1]], device=DEV)
        feed_step(ids, pos, slots, src, tables, out, acc, bs, use_kernels)
        assert ids.tolist() == [[21, 51, 81], [10, 40, 70], [7, 8, 9]]
        assert pos.tolist() == [[7, 8, 9], [1, 2, 3], [1, 2, 3]]
        assert slots.tolist() == [
            [6 * 4 + 3, 7 * 4, 7 * 4 + 1],
            [1 * 4 + 1, 1 * 4 + 2, 1 * 4 + 3],
            [-1, -1, -1],
        ]
        got = torch.full((4,), -1, device=DEV)
        step_out = torch.tensor([51, 81, 5, 99, 40, 0, 8, 5, 1], device=DEV)  # accepts 2, 0, 1
        accept_counts(ids, step_out, got, use_kernels)
        assert got[:3].tolist() == [2, 0, 1] and got[3] == -1
        one = torch.zeros(2, dtype=torch.long, device=DEV)
        accept_counts(ids[:2, :1].contiguous(), step_out, one, use_kernels)  # W = 1: nothing
        assert one.tolist() == [0, 0]


@pytest.mark.parametrize("rows", [1, 5, 40, 130])
def test_fp8_linear_kernel_computes_with_the_dequantized_weights(rows):
    """The Triton FP8 kernel against F.linear on the widened weights: decode-sized and
    prefill-sized row counts (each picks other tiles), N and K not multiples of the tiles, a bias,
    and a strided input (a view of a wider tensor)."""
    from voicert.engine.gpu.fp8 import Fp8Linear

    g = torch.Generator().manual_seed(6)
    lin = torch.nn.Linear(200, 90, bias=True)
    q = Fp8Linear.from_linear(lin).to(DEV)
    wide = torch.randn(rows, 260, generator=g).to(DEV)
    x = wide[:, :200]
    want = torch.nn.functional.linear(x, q.dequantized(torch.float32), q.bias)
    got = kernels.fp8_linear(x, q.weight, q.scale, q.bias)
    assert got.shape == (rows, 90) and close(got, want, 1e-4)
    count = kernels.counters(DEV)  # K split in two (tiles of 64, 128 columns a split): the last
    split = kernels.fp8_linear(x, q.weight, q.scale, q.bias, count, (16, 32, 64, 4, 2, 3))
    assert close(split, want, 1e-4) and not count.any()  # split to finish adds; counters reset
    if DEV == "cuda":  # bf16 activations, the served dtype: fp32 sums, one rounding at the end
        xb = x.bfloat16()  # (kept in bf16: by default 2-64 rows are rounded to FP8: fp8_mm)
        want = torch.nn.functional.linear(xb.float(), q.dequantized(torch.float32), q.bias)
        got = kernels.fp8_linear(xb, q.weight, q.scale, q.bias.bfloat16(), round_rows=False)
        assert got.dtype == torch.bfloat16 and close(got, want, 2e-2)


@pytest.mark.parametrize(
    "rows, k, group",
    [
        (1, 256, 128),
        (5, 192, 128),
        (40, 256, 128),
        (130, 384, 128),
        (170, 256, 128),
        (3, 96, 32),
        (1, 576, 32),
        (1, 192, 64),
    ],
)
def test_int4_linear_kernel_computes_with_the_dequantized_weights(rows, k, group):
    """The Triton INT4 kernel against F.linear on the widened weights: decode-sized and
    prefill-sized row counts (each of the three paths, by choice or forced), groups
    of 128, of 64 (K = 192) and of 32 (``llm.int4_group``), N not a multiple of the tiles, a
    bias, a strided input, and K split over programs (the last split to finish adds)."""
    from voicert.engine.gpu.int4 import Int4Linear

    SCALED, GEMV = kernels.Int4Path.SCALED, kernels.Int4Path.GEMV
    g = torch.Generator().manual_seed(7)
    lin = torch.nn.Linear(k, 90, bias=True)
    q = Int4Linear.from_linear(lin, None, group).to(DEV)
    wide = torch.randn(rows, k + 60, generator=g).to(DEV)
    x = wide[:, :k]
    want = torch.nn.functional.linear(x, q.dequantized(torch.float32), q.bias)
    got = kernels.int4_linear(x, q.weight, q.scale, q.low, q.bias)
    assert got.shape == (rows, 90) and close(got, want, 1e-4)
    count = kernels.counters(DEV)
    for swap in (False, True):  # the weights as the MMA's second operand, or its first
        split = kernels.int4_linear(
            x, q.weight, q.scale, q.low, None, count, (16, 32, 4, 2, 2), swap=swap
        )
        assert close(split, want - q.bias, 1e-4) and not count.any()
    for swap in (False, True):  # each weight widened whole with its scale (the many-row path)
        whole = kernels.int4_linear(
            x, q.weight, q.scale, q.low, q.bias, count, (16, 32, 4, 2, 2), swap=swap, path=SCALED
        )
        assert close(whole, want, 1e-4) and not count.any()
    if rows == 1:  # one row on the CUDA cores: unsplit, split, a step past K (masked)
        for blocks in (None, (16, 8, 1), (8, 16, 2, 2), (32, 64, 4)):
            one = kernels.int4_linear(x, q.weight, q.scale, q.low, q.bias, count, blocks, path=GEMV)
            assert close(one, want, 1e-4) and not count.any(), blocks
    wide = kernels.int4_dequantize(q.weight, q.scale, q.low, torch.float32)  # prefill's path
    assert torch.equal(wide, q.dequantized(torch.float32))
    if DEV == "cuda":  # bf16 / fp16 activations: codes widened by their bits, fp32 sums
        for dt in (torch.bfloat16, torch.float16):
            xh = x.to(dt)
            want = torch.nn.functional.linear(xh.float(), q.dequantized(torch.float32), q.bias)
            got = kernels.int4_linear(xh, q.weight, q.scale, q.low, q.bias.to(dt))
            assert got.dtype == dt and close(got, want, 2e-2)
            for magic, swap in ((True, False), (False, True), (True, True)):
                other = kernels.int4_linear(
                    xh, q.weight, q.scale, q.low, q.bias.to(dt), magic=magic, swap=swap
                )
                assert close(other, want, 2e-2), (magic, swap)
            # widened whole, the weights are int4_dequantize's in dt: F.linear's on them
            want = torch.nn.functional.linear(xh.float(), q.dequantized(dt).float(), q.bias)
            whole = kernels.int4_linear(xh, q.weight, q.scale, q.low, q.bias.to(dt), path=SCALED)
            assert close(whole, want, 1e-2)
            if rows == 1:  # the fp32 sums of the exact codes, one rounding to dt at the end
                want = torch.nn.functional.linear(xh.float(), q.dequantized(torch.float32), q.bias)
                one = kernels.int4_linear(xh, q.weight, q.scale, q.low, q.bias.to(dt), path=GEMV)
                assert close(one, want, 2e-2)


@pytest.mark.parametrize("k, group, unroll", [(512, 128, 0), (512, 32, 1 << 30), (384, 64, 40)])
def test_int4_gemv_matches_the_dequantized_weights_on_whole_steps_and_part_ones(
    k, group, unroll, monkeypatch
):
    """One row on the CUDA cores where every step is whole (N a multiple of the rows a program,
    K of its columns: no masks but on the reads ahead) and where the last one is not, unsplit
    and split over K, one to four steps a program, the K loop as it is and unrolled (at up to
    ``INT4_GEMV_UNROLL_TILES`` programs); a bias; the counters left at zero."""
    from voicert.engine.gpu.int4 import Int4Linear

    monkeypatch.setattr(kernels.int4_matmul, "INT4_GEMV_UNROLL_TILES", unroll)

    g = torch.Generator().manual_seed(11)
    lin = torch.nn.Linear(k, 40, bias=True)
    q = Int4Linear.from_linear(lin, None, group).to(DEV)
    x = torch.randn(1, k, generator=g).to(DEV)
    want = torch.nn.functional.linear(x, q.dequantized(torch.float32), q.bias)
    count = kernels.counters(DEV)
    for blocks in ((4, 16, 1), (8, 32, 1, 2), (4, 64, 1), (2, 16, 1, 3), (4, 64, 2), (2, 128, 1)):
        got = kernels.int4_gemv(x, q.weight, q.scale, q.low, q.bias, count, blocks)
        assert close(got, want, 1e-4) and not count.any(), blocks


@pytest.mark.parametrize("rows, group", [(2, 128), (3, 32), (4, 64)])
def test_int4_gemv_of_a_few_rows_matches_the_dequantized_weights(rows, group):
    """2-4 rows at once (the codes widened once for all of them; three padded to four): each
    row's sums as F.linear's on the widened weights, unsplit and split over K; a bias; a row
    stride wider than K; the counters left at zero."""
    from voicert.engine.gpu.int4 import Int4Linear

    g = torch.Generator().manual_seed(17)
    q = Int4Linear.from_linear(torch.nn.Linear(512, 40, bias=True), None, group).to(DEV)
    x = torch.randn(rows, 600, generator=g).to(DEV)[:, :512]
    want = torch.nn.functional.linear(x, q.dequantized(torch.float32), q.bias)
    count = kernels.counters(DEV)
    for blocks in ((2, 16, 1), (1, 64, 1), (2, 16, 1, 2), (1, 32, 1, 4)):
        got = kernels.int4_gemv(x, q.weight, q.scale, q.low, q.bias, count, blocks)
        assert got.shape == (rows, 40) and close(got, want, 1e-4) and not count.any(), blocks


def test_int4_path_takes_a_few_rows_to_int4_gemv_only_where_switched_on_and_steps_are_whole(
    monkeypatch,
):
    """Rows past one go to the CUDA cores only up to ``INT4_GEMV_ROWS`` (two by default: four
    measured slower than the MMA), for weights wider than deep, and where the default tile's
    steps are whole (K a multiple of 1024 columns); one row always. Four rows run there on one
    weight row a program."""
    P = kernels.Int4Path
    assert [kernels.int4_path(m, 6144, 4096) for m in (1, 2, 3)] == [P.GEMV, P.GEMV, P.GROUPS]
    assert [kernels.int4_path(m, 4096, 4096) for m in (1, 2)] == [P.GEMV, P.GROUPS]  # not wide
    assert kernels.int4_path(1, 576, 576, 64) is P.GEMV  # (masked steps)
    monkeypatch.setattr(kernels.int4_matmul, "INT4_GEMV_ROWS", 4)
    four = [kernels.int4_path(m, 6144, 4096) for m in (1, 2, 3, 4, 5)]
    assert four == [P.GEMV, P.GEMV, P.GEMV, P.GEMV, P.GROUPS]
    assert kernels.int4_path(2, 1152, 576, 64) is P.GROUPS  # a part step: not at two rows
    from voicert.engine.gpu.int4 import Int4Linear  # four rows: one weight row a program

    q = Int4Linear.from_linear(torch.nn.Linear(1024, 41, bias=False), None, 128).to(DEV)
    x = torch.randn(4, 1024, generator=torch.Generator().manual_seed(2)).to(DEV)
    assert kernels.int4_path(4, 41, 1024) is P.GROUPS  # (deeper than wide)
    got = kernels.int4_linear(x, q.weight, q.scale, q.low, None, path=P.GEMV)
    assert close(got, torch.nn.functional.linear(x, q.dequantized(torch.float32)), 1e-4)


def int8_groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [1, K] rounded as int4_gemv_a8 rounds it: (q [1, K] float, -127..127; scales [K //
    group])."""
    g = x.float().view(-1, group)
    sx = g.abs().amax(1).clamp(min=1e-30) / 127.0
    return torch.floor(g / sx[:, None] + 0.5).view(1, -1), sx


@pytest.mark.parametrize(
    "n, k, group, bias, blocks",
    [(40, 256, 128, False, None), (33, 192, 64, True, None), (64, 512, 32, True, (2, 16, 1, 3))],
)
def test_int4_gemv_a8_sums_the_int8_rounded_row_and_the_dequantized_weights(
    n, k, group, bias, blocks
):
    """W4A8 (``int4_gemv_a8``): x rounded to int8 by the weights' groups (a scale each, the
    largest magnitude at 127, a group of zeros left zero), each word's codes summed against it
    by dp4a (emulated by shifts in the interpreter), against F.linear of the rounded x and the
    widened weights; N not a multiple of the tile, K split (the counters left at zero)."""
    from voicert.engine.gpu.int4 import Int4Linear

    g = torch.Generator().manual_seed(n + k)
    q = Int4Linear.from_linear(torch.nn.Linear(k, n, bias=bias), None, group).to(DEV)
    x = torch.randn(1, k, generator=g)
    x[0, :group] *= 50.0  # a group of its own range
    x[0, group : 2 * group] = 0.0
    x = x.to(DEV)
    planes = kernels.int4_a8_planes(x, group)
    xq, want_sx = int8_groups(x, group)
    assert torch.equal(planes[3, : k // group].view(torch.float32), want_sx)
    q4 = xq.view(-1, 2, group // 8, 4).long() & 0xFF  # [groups, half, word, byte]
    words = (q4 << torch.tensor([0, 8, 16, 24], device=q4.device)).sum(-1)  # [groups, 2, WPG]
    words = (words + 2**31) % 2**32 - 2**31  # (as int32)
    assert torch.equal(planes[0].long(), words[:, 0].reshape(-1))  # low nibbles' columns
    assert torch.equal(planes[1].long(), words[:, 1].reshape(-1))  # high nibbles' columns
    sums = xq.view(-1, 2, group // 8, 4).sum((1, 3)) * want_sx[:, None]  # [groups, WPG]
    assert close(planes[2].view(torch.float32), sums.reshape(-1), 1e-6)
    want = torch.nn.functional.linear(
        (xq.view(-1, group) * want_sx[:, None]).view(1, -1), q.dequantized(torch.float32), q.bias
    )
    count = kernels.counters(DEV)
    got = kernels.int4_gemv_a8(x, q.weight, q.scale, q.low, q.bias, count, blocks)
    assert got.shape == (1, n) and close(got, want, 1e-4) and not count.any()


def test_an_a8_int4_layer_rounds_one_bf16_row_to_int8_on_both_paths(monkeypatch):
    """An Int4Linear with ``a8`` (``llm.int4_activations: int8``): a one-row step of bf16 (the
    served dtype) takes the W4A8 kernel, and the torch path rounds x as it does; fp32 rows (the
    exactness tests' dtype) and two rows keep x as it is."""
    from voicert.engine.gpu.int4 import Int4Linear, a8_rounds

    launched = []
    monkeypatch.setattr(
        kernels.int4_matmul,
        "_int4_a8_planes_kernel",
        _Spy(kernels.int4_matmul._int4_a8_planes_kernel, launched),
    )
    q = Int4Linear.from_linear(torch.nn.Linear(256, 48, bias=False), None, 128)
    q.a8 = True
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(14)).bfloat16()
    xq, sx = int8_groups(x, 128)
    rounded = (xq.view(-1, 128) * sx[:, None]).view(1, -1)
    want = torch.nn.functional.linear(rounded, q.dequantized(torch.float32))
    assert torch.equal(q(x), want.bfloat16())  # the torch path
    assert not torch.equal(rounded, x.float())
    assert close(q(x.float()), torch.nn.functional.linear(x.float(), q.dequantized(torch.float32)))
    q = q.to(DEV)
    got = kernels.int4_linear(x.to(DEV), q.weight, q.scale, q.low, None, a8=True)
    assert got.dtype == torch.bfloat16 and close(got.float().cpu(), want, 2e-2)
    assert len(launched) == 1
    assert a8_rounds(1, torch.float16) and not a8_rounds(1, torch.float32)
    assert not a8_rounds(2, torch.bfloat16)


class _Spy:
    """A kernel's launcher that notes each launch (its grid) before running it."""

    def __init__(self, kernel, calls: list):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        self.calls.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize(
    "n, group, bf16", [(512, 128, 1), (576, 32, 1), (2048, 64, 1), (192, 64, 0)]
)
def test_kernels_that_write_x_lay_it_out_for_int4_gemv_as_int4_planes_does(n, group, bf16):
    """add_rms_norm's and silu_mul's planes (the INT4 one-row kernel's x, written where x is)
    equal int4_planes' of their own output, bit for bit, and int4_gemv given them computes what
    it computes laying x out itself. In fp32 too, where no rounding to the model's dtype
    stands between a norm's product and the planes' sums: an FMA there would differ."""
    from voicert.engine.gpu.int4 import Int4Linear

    g = torch.Generator().manual_seed(13)
    dt = torch.bfloat16 if DEV == "cuda" and bf16 else torch.float32
    x = torch.randn(1, 1, n, generator=g).to(DEV, dt)
    res = torch.randn(1, 1, n, generator=g).to(DEV, dt)
    w = (torch.rand(n, generator=g) + 0.5).to(DEV, dt)
    planes = torch.full((10, n // 8), float("nan"), device=DEV)
    y, _ = kernels.add_rms_norm(x, res.clone(), w, 1e-6, planes=planes, group=group)
    want = kernels.int4_planes(y.view(1, n), group)
    assert torch.equal(planes, want)
    y0, _ = kernels.add_rms_norm(x, res.clone(), w, 1e-6)
    assert torch.equal(y, y0)  # the normed x itself unchanged
    gu = torch.randn(1, 2 * n, generator=g).to(DEV, dt)
    planes.fill_(float("nan"))
    act = kernels.silu_mul(gu, planes=planes, group=group)
    assert torch.equal(act, kernels.silu_mul(gu))
    assert torch.equal(planes, kernels.int4_planes(act, group))
    q = Int4Linear.from_linear(torch.nn.Linear(n, 24, bias=False), None, group).to(DEV)
    alone = kernels.int4_linear(act, q.weight, q.scale, q.low, None)
    given = kernels.int4_linear(act, q.weight, q.scale, q.low, None, planes=planes)
    assert torch.equal(alone, given)


@pytest.mark.parametrize("n, group", [(512, 128), (576, 32), (2048, 64)])
def test_kernels_that_write_x_lay_it_out_for_int4_gemv_a8_as_int4_a8_planes_does(n, group):
    """Given int32 planes, add_rms_norm and silu_mul write W4A8's x (x rounded to int8 by group,
    the groups' scales): int4_a8_planes' of their own output, bit for bit; int4_gemv_a8 given
    them computes what it computes laying x out itself."""
    from voicert.engine.gpu.int4 import Int4Linear

    g = torch.Generator().manual_seed(15)
    x = torch.randn(1, 1, n, generator=g).to(DEV, torch.bfloat16)
    res = torch.randn(1, 1, n, generator=g).to(DEV, torch.bfloat16)
    w = (torch.rand(n, generator=g) + 0.5).to(DEV, torch.bfloat16)
    planes = torch.full((4, n // 8), -7, dtype=torch.int32, device=DEV)
    y, _ = kernels.add_rms_norm(x, res.clone(), w, 1e-6, planes=planes, group=group)
    assert torch.equal(y, kernels.add_rms_norm(x, res.clone(), w, 1e-6)[0])
    want = kernels.int4_a8_planes(y.view(1, n), group)
    assert torch.equal(planes[:3], want[:3])
    assert torch.equal(planes[3, : n // group], want[3, : n // group])
    gu = torch.randn(1, 2 * n, generator=g).to(DEV, torch.bfloat16)
    planes.fill_(-7)
    act = kernels.silu_mul(gu, planes=planes, group=group)
    assert torch.equal(act, kernels.silu_mul(gu))
    want = kernels.int4_a8_planes(act, group)
    assert torch.equal(planes[:3], want[:3])
    assert torch.equal(planes[3, : n // group], want[3, : n // group])
    q = Int4Linear.from_linear(torch.nn.Linear(n, 24, bias=False), None, group).to(DEV)
    alone = kernels.int4_linear(act, q.weight, q.scale, q.low, None, a8=True)
    given = kernels.int4_linear(act, q.weight, q.scale, q.low, None, planes=planes, a8=True)
    assert torch.equal(alone, given)


@pytest.mark.parametrize("a8", [False, True])
def test_one_row_int4_layers_fed_x_laid_out_by_the_norms_compute_the_same(monkeypatch, a8):
    """A one-row decode step of an INT4 model with ``INT4_PLANES_FUSED`` (the RMSNorms and SiLU *
    up lay x out for the INT4 Linears after them) gives the hidden states it gives with each
    Linear laying its own, bit for bit, and those of the torch path to the kernel's rounding.
    ``a8`` (``llm.int4_activations: int8``, a bf16 model): W4A8's x, which the torch path
    rounds as the kernel does. Int4Linear takes the kernels here even on CPU tensors (Triton's
    interpreter)."""
    from tests.engine.quantized import SMALL
    from voicert.engine.gpu.int4 import Int4Linear, quantize_int4, set_activations

    def on_kernels(self, x, pdl=False, planes=None):
        return kernels.int4_linear(
            x, self.weight, self.scale, self.low, self.bias, planes=planes, a8=self.a8
        )

    cfg = dataclasses.replace(SMALL, num_layers=1)
    model = random_llama(cfg, torch.float32, DEV)
    assert quantize_int4(model, group=64) == 4
    if a8:
        model = model.to(torch.bfloat16)
        assert set_activations(model, True) == 4
    g = torch.Generator().manual_seed(8)
    tables, nxt = block_tables([30], 16, 8)
    runners = [ModelRunner(model, nxt, 16) for _ in range(3)]
    prefix = torch.randint(0, 300, (30,), generator=g).tolist()
    for runner in runners:
        run_layers(model, runner, [Row(prefix, 0, tables[0], 30)], False)
    rows = [Row([7], 30, tables[0], 0)]
    want = run_layers(model, runners[0], rows, False)
    monkeypatch.setattr(Int4Linear, "forward", on_kernels)
    monkeypatch.setattr(kernels.int4_matmul, "INT4_PLANES_FUSED", False)
    alone = run_layers(model, runners[1], rows, True)
    launched = []
    name = "_int4_a8_planes_kernel" if a8 else "_int4_planes_kernel"
    monkeypatch.setattr(
        kernels.int4_matmul, name, _Spy(getattr(kernels.int4_matmul, name), launched)
    )
    monkeypatch.setattr(kernels.int4_matmul, "INT4_PLANES_FUSED", True)
    fused = run_layers(model, runners[2], rows, True)
    assert torch.equal(fused, alone)
    if not a8:
        assert close(fused, want, 1e-3)  # (the one-row kernel's sums keep ~2^-15: int4_gemv)
    elif DEV == "cuda":  # (the interpreter's bf16 forward is not the GPU's, a8 or not)
        assert close(fused, want, 5e-2)
    assert len(launched) == 1  # only o's input is laid out apart


def test_int4_path_takes_the_scaled_kernel_only_for_wide_weights_at_middle_row_counts(
    monkeypatch,
):
    """One row on the CUDA cores (unless switched off); else by groups for decode rows, the
    scaled kernel from 33 to 160 rows where both sides of the weights are 4096 or more
    (Llama-8B), widened for prefill; narrower weights (Llama-1B) go by groups up to 64 rows."""
    P = kernels.Int4Path
    assert kernels.int4_path(1, 6144, 4096) is P.GEMV  # one row: the CUDA cores
    assert kernels.int4_path(1, 6144, 4096, 32) is P.GEMV
    monkeypatch.setattr(kernels.int4_matmul, "INT4_GEMV_ROWS", 0)
    eight = [kernels.int4_path(m, 6144, 4096) for m in (1, 32, 33, 64, 160, 161, 600)]
    assert eight == [P.GROUPS, P.GROUPS, P.SCALED, P.SCALED, P.SCALED, P.WIDEN, P.WIDEN]
    one = [kernels.int4_path(m, 2048, 8192) for m in (1, 33, 64, 65, 128)]
    small = [kernels.int4_path(m, 6144, 4096, 32) for m in (1, 32, 33, 161)]
    assert small == [P.GROUPS, P.GROUPS, P.SCALED, P.WIDEN]  # groups of 32: as of 128
    assert one == [P.GROUPS, P.GROUPS, P.GROUPS, P.WIDEN, P.WIDEN]


def test_int4_tiles_asked_for_run_a_kernel_where_the_default_would_widen(monkeypatch):
    """Past the kernels' row counts ``int4_linear`` widens the weights for cuBLAS, unless the
    caller names tiles (the benchmarks' tables): then the groups kernel runs them."""
    from voicert.engine.gpu.int4 import Int4Linear

    q = Int4Linear.from_linear(torch.nn.Linear(128, 40, bias=False), None, 64).to(DEV)
    x = torch.randn(70, 128, generator=torch.Generator().manual_seed(3)).to(DEV)
    want = torch.nn.functional.linear(x, q.dequantized(torch.float32))
    widened = []
    real = kernels.int4_dequantize
    monkeypatch.setattr(
        kernels.int4_matmul, "int4_dequantize", lambda *a: widened.append(1) or real(*a)
    )
    assert close(kernels.int4_linear(x, q.weight, q.scale, q.low, None), want, 1e-4)
    assert widened == [1]
    tiles = kernels.int4_linear(x, q.weight, q.scale, q.low, None, None, (32, 32, 4, 2))
    assert close(tiles, want, 1e-4) and widened == [1]


@pytest.mark.parametrize("rows", [1, 5])
def test_the_fp8_kernel_unscaled_is_a_plain_linear_over_weights_in_the_inputs_dtype(rows):
    """``scale`` None: the weights are used as they are (the model's ``triton_linear_rows``), with
    and without a bias, K split or not."""
    g = torch.Generator().manual_seed(9)
    w = torch.randn(90, 200, generator=g).to(DEV)
    bias = torch.randn(90, generator=g).to(DEV)
    x = torch.randn(rows, 200, generator=g).to(DEV)
    assert close(kernels.fp8_linear(x, w, None, bias), torch.nn.functional.linear(x, w, bias), 1e-4)
    count = kernels.counters(DEV)
    split = kernels.fp8_linear(x, w, None, None, count, (16, 32, 64, 4, 2, 3))
    assert close(split, x @ w.T, 1e-4) and not count.any()


@pytest.mark.parametrize(
    "blocks, wide",
    [
        ((32, 64, 4), False),
        ((8, 64, 4, 3), True),
        ((4, 128, 4, 2), False),
        ((8, 32, 4, 0, 2), True),
        ((8, 32, 4, 2, 4), False),
        ((4, 1024, 4), True),
    ],
)
def test_gemv_computes_one_row_with_the_dequantized_weights(blocks, wide, monkeypatch):
    """The one-row kernel (:func:`kernels.gemv`) against F.linear on the widened weights: FP8
    with scales and unscaled weights, a bias or none, N and K not multiples of the tile, K split
    or not (the counters left at zero), one tile or more of each program loaded before the
    wait for the kernel before (a K of 200 ends inside the last); FP8 weights read in x's
    layout (``GEMV_X_WIDE``) or not."""
    from voicert.engine.gpu.fp8 import Fp8Linear

    monkeypatch.setattr(kernels.matvec, "GEMV_X_WIDE", wide)

    g = torch.Generator().manual_seed(11)
    q = Fp8Linear.from_linear(torch.nn.Linear(200, 90, bias=True)).to(DEV)
    x = torch.randn(1, 200, generator=g).to(DEV)
    count = kernels.counters(DEV)
    want = torch.nn.functional.linear(x, q.dequantized(torch.float32), q.bias)
    got = kernels.gemv(x, q.weight, q.scale, q.bias, count, blocks)
    assert got.shape == (1, 90) and close(got, want, 1e-4) and not count.any()
    w = torch.randn(90, 200, generator=g).to(DEV)
    assert close(kernels.gemv(x, w, None, None, count, blocks), x @ w.T, 1e-4)
    assert not count.any()
    if DEV == "cuda":  # bf16 activations: fp32 sums, one rounding at the end
        want = torch.nn.functional.linear(x.bfloat16().float(), q.dequantized(torch.float32))
        got = kernels.gemv(x.bfloat16(), q.weight, q.scale, None, count, blocks)
        assert got.dtype == torch.bfloat16 and close(got, want, 2e-2)


@pytest.mark.parametrize("blocks", [None, (8, 64, 4), (4, 32, 4, 0, 2), (8, 32, 4, 1, 4)])
@pytest.mark.parametrize("fp8", [False, True])
def test_gemv_with_the_glu_gives_silu_mul_of_its_plain_result_bit_for_bit(blocks, fp8):
    """``gemv(..., glu=True)`` on an MLP's gate_up: each program pairs its gate rows with their
    up rows and writes SiLU(gate) * up, the bits of the plain launch followed by ``silu_mul``,
    with FP8 weights' scales and a bias or unscaled weights, outputs not a multiple of the
    tile's, one weight tile or more read before the wait; the counters are not touched."""
    from voicert.engine.gpu.fp8 import Fp8Linear

    g = torch.Generator().manual_seed(31)
    inter, k = 102, 200  # 51 programs of 2 outputs, 26 of 4 (the last one half full)
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    x = torch.randn(1, k, generator=g).to(DEV, dtype)
    if fp8:
        q = Fp8Linear.from_linear(torch.nn.Linear(k, 2 * inter, bias=True)).to(DEV)
        w, scale, bias = q.weight, q.scale, q.bias.to(dtype)
    else:
        w, scale, bias = torch.randn(2 * inter, k, generator=g).to(DEV, dtype), None, None
    count = kernels.counters(DEV)
    want = kernels.silu_mul(kernels.gemv(x, w, scale, bias, count, blocks))
    got = kernels.gemv(x, w, scale, bias, count, blocks, glu=True)
    assert got.shape == (1, inter) and got.dtype == dtype and not count.any()
    assert torch.equal(got, want)
    y = x.float() @ w.float().T * (1.0 if scale is None else scale)
    gate, up = (y if bias is None else y + bias.float()).chunk(2, dim=-1)
    assert close(got, torch.nn.functional.silu(gate) * up, 1e-4 if DEV == "cpu" else 5e-2)


def test_an_fp8_linear_with_the_glu_gives_silu_mul_of_its_plain_output():
    """``Fp8Linear(x, glu=True)``, the fused path's gate_up, equals ``silu_mul`` of its plain
    output bit for bit: at one row (on CUDA gemv's GLU) and at three, off CUDA too."""
    from voicert.engine.gpu.fp8 import Fp8Linear

    g = torch.Generator().manual_seed(32)
    q = Fp8Linear.from_linear(torch.nn.Linear(64, 2 * 48, bias=True)).to(DEV)
    for rows in (1, 3):
        x = torch.randn(rows, 64, generator=g).to(DEV)
        got = q(x, glu=True)
        assert got.shape == (rows, 48) and torch.equal(got, kernels.silu_mul(q(x)))


def test_gemv_tiles_eight_rows_for_wide_short_two_byte_weights_and_reads_long_ones_early(
    monkeypatch,
):
    """Unless told its tile, gemv gives a program ``GEMV_WIDE_ROWS`` outputs of 2-byte weights
    of at most ``GEMV_WIDE_K`` columns where that still makes ``FP8_PROGRAMS`` programs without
    splitting K, else ``GEMV_TILE``'s (FP8 weights, narrow or long ones); it reads four weight
    tiles before the PDL wait of FP8 weights and of long, wide 2-byte ones, and
    ``GEMV_PRE_SHORT`` / ``GEMV_PRE_WIDE`` of short 2-byte ones in ``GEMV_TILE``'s / wide
    tiles; the sums agree either way (to bf16's rounding: on a GPU the two tiles' sums across
    threads may run in another order)."""
    mv = kernels.matvec
    rows, k = mv.GEMV_WIDE_ROWS, mv.GEMV_WIDE_K
    wide = (rows, *mv.GEMV_TILE[1:])
    assert mv._default_tile(rows * mv.FP8_PROGRAMS, k, 2) == wide  # 1B's qkv, gate_up, head
    assert mv._default_tile(rows * mv.FP8_PROGRAMS - rows, k, 2) == mv.GEMV_TILE  # o and down
    assert mv._default_tile(rows * mv.FP8_PROGRAMS, k + 1, 2) == mv.GEMV_TILE  # every 8B Linear
    assert mv._default_tile(1 << 17, k, 1) == mv.GEMV_TILE  # FP8
    # weight tiles read before the PDL wait: four for FP8 and for 8B's long bf16 rows, two for
    # 1B's o (a whole row), else one
    long_n = mv.GEMV_PRE_LONG_N
    assert mv._default_pre(long_n, k + 1, 2) == mv.GEMV_PRE_LONG == 4  # 8B's bf16 Linears
    assert mv._default_pre(long_n - 1, 4 * k, 2) == 1  # 1B's down (2048 x 8192)
    assert mv._default_pre(4 * long_n, k, 2) == mv.GEMV_PRE_WIDE  # 1B's gate_up, LM head
    assert mv._default_pre(k, k, 2) == mv.GEMV_PRE_SHORT == 2  # 1B's o (2048 x 2048)
    monkeypatch.setattr(mv, "GEMV_PRE_WIDE", 2)
    assert mv._default_pre(4 * long_n, k, 2) == 2
    assert mv._default_pre(k, k, 2) == 2 and mv._default_pre(long_n - 1, 4 * k, 2) == 1
    assert mv._default_pre(long_n, k, 1) == mv.GEMV_PRE[1] == 4  # FP8
    monkeypatch.setattr(mv, "FP8_PROGRAMS", 4)  # (a small matrix takes the wide tile)
    g = torch.Generator().manual_seed(12)
    x = torch.randn(1, 72, generator=g).bfloat16().to(DEV)
    w = torch.randn(40, 72, generator=g).bfloat16().to(DEV)
    assert mv._default_tile(40, 72, 2) == wide
    count = kernels.counters(DEV)
    got = kernels.gemv(x, w, None, None, count)
    assert close(got, kernels.gemv(x, w, None, None, count, mv.GEMV_TILE), 1e-2)
    assert close(got, x.float() @ w.float().T, 2e-2) and not count.any()


def test_one_row_takes_gemv_unless_the_mma_kernels_tiles_are_named(monkeypatch):
    """``fp8_linear`` sends a one-row step to gemv, a row more to the MMA kernel, and one row
    with tiles named (the benchmarks' tables) or FP8 weights of more than ``GEMV_MAX_N`` outputs
    to the MMA kernel too. The model's Linears at one row leave the MMA kernel's measured tiles
    out."""
    from voicert.engine.gpu.fp8 import Fp8Linear

    calls = []
    real = kernels.gemv
    monkeypatch.setattr(
        kernels.fp8_matmul, "gemv", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    g = torch.Generator().manual_seed(12)
    w = torch.randn(48, 64, generator=g).to(DEV)
    one, two = torch.randn(1, 64, generator=g).to(DEV), torch.randn(2, 64, generator=g).to(DEV)
    assert close(kernels.fp8_linear(one, w, None, None), one @ w.T, 1e-4) and calls == [1]
    assert close(kernels.fp8_linear(two, w, None, None), two @ w.T, 1e-4) and calls == [1]
    tiles = kernels.fp8_linear(one, w, None, None, None, (16, 32, 64, 4, 2))
    assert close(tiles, one @ w.T, 1e-4) and calls == [1]
    # wider FP8 weights (a head): the MMA kernel
    monkeypatch.setattr(kernels.fp8_matmul, "GEMV_MAX_N", 32)
    q = Fp8Linear.from_linear(torch.nn.Linear(64, 48, bias=False)).to(DEV)
    want = torch.nn.functional.linear(one, q.dequantized(torch.float32))
    assert close(kernels.fp8_linear(one, q.weight, q.scale, None), want, 1e-4) and calls == [1]
    assert close(kernels.fp8_linear(one, w, None, None), one @ w.T, 1e-4) and calls == [1, 1]
    model = random_llama(TINY, torch.float32, DEV)
    model.triton_linear_rows = 16
    model.linear_tiles = {tuple(model.layers[0].attn.qkv.weight.shape): (16, 32, 64, 4, 2)}
    seen = []
    fp8_linear = kernels.fp8_linear
    monkeypatch.setattr(
        kernels,
        "fp8_linear",
        lambda x, w, s, b, c, t, p, **k: seen.append(t) or fp8_linear(x, w, s, b, c, t, p, **k),
    )
    model._linear(model.layers[0].attn.qkv, torch.randn(1, TINY.hidden_size).to(DEV))
    model._linear(model.layers[0].attn.qkv, torch.randn(3, TINY.hidden_size).to(DEV))
    assert seen == [None, (16, 32, 64, 4, 2)]


def test_a_one_row_step_reads_the_lm_head_through_gemv_with_the_same_logits(monkeypatch):
    """With the Triton Linears on (``triton_linear_rows``), a one-row step's unquantized LM head
    runs through gemv into the caller's buffer: the logits of F.linear and the same greedy
    token. Two rows, or the Linears on cuBLAS, keep the torch head."""
    calls = []
    real = kernels.gemv
    monkeypatch.setattr(kernels, "gemv", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = random_llama(TINY, torch.float32, DEV)
    model.use_kernels = True
    g = torch.Generator().manual_seed(13)
    hidden = torch.randn(1, 1, TINY.hidden_size, generator=g).to(DEV)
    want = torch.nn.functional.linear(hidden, model.lm_head.weight).detach()  # [1, 1, V]
    head_out = torch.empty_like(want)
    with torch.inference_mode():  # (as the engine runs)
        plain = model.greedy(hidden, head_out=head_out)
        assert calls == [] and close(head_out, want, 1e-4)
        model.triton_linear_rows = 1
        head_out.zero_()
        assert torch.equal(model.greedy(hidden, head_out=head_out), plain) and calls == [1]
        assert close(head_out, want, 1e-4)
        model.greedy(torch.randn(2, 1, TINY.hidden_size, generator=g).to(DEV))
        assert calls == [1]


def test_fp8_rows_quantizes_each_row_by_its_own_largest_magnitude():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 300, generator=g) * torch.tensor([[1e-3], [1.0], [30.0], [1.0], [0.2]])
    x[3] = 0  # a row of zeros: zeros, and a scale that divides without harm
    q, s = kernels.fp8_rows(x.to(DEV))
    want_s = x.abs().amax(1, keepdim=True).clamp(min=1e-12) / 448.0
    assert torch.allclose(s.cpu(), want_s, rtol=1e-6)
    want = (x / want_s).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert q.float().abs().amax(1).tolist()[:3] == [448.0] * 3
    if DEV == "cuda":  # Triton 3.6's interpreter rounds 124.0 to e4m3 as 64 (the carry into the
        assert torch.equal(q.cpu().float(), want.float())  # exponent is lost): GPU only
    else:
        close_enough = (q.float() - want.float()).abs() <= want.float().abs() / 8
        assert close_enough.float().mean() > 0.95


@pytest.mark.skipif(
    DEV != "cuda" or (DEV == "cuda" and torch.cuda.get_device_capability() < (8, 9)),
    reason="the FP8 tensor cores: a GPU of compute capability 8.9 or newer",
)
def test_many_bf16_rows_go_to_the_fp8_tensor_cores_within_fp8s_rounding():
    from voicert.engine.gpu.fp8 import Fp8Linear

    g = torch.Generator().manual_seed(8)
    lin = torch.nn.Linear(256, 96, bias=True)
    q = Fp8Linear.from_linear(lin).to(DEV)
    mm = kernels.fp8_matmul
    rows = max(mm.FP8_MMA_ROWS, mm.FP8_MM_ROWS) + 9  # (cuBLAS's _scaled_mm)
    x = torch.randn(rows, 256, generator=g).to(DEV).bfloat16()
    want = torch.nn.functional.linear(x.float(), q.dequantized(torch.float32), q.bias)
    got = kernels.fp8_linear(x, q.weight, q.scale, q.bias.bfloat16())
    assert got.dtype == torch.bfloat16
    assert ((got.float() - want).norm() / want.norm()).item() < 0.05  # e4m3 activations: ~2 %


@pytest.mark.parametrize(
    "rows, k, blocks",
    [
        (2, 256, None),
        (5, 200, (16, 64, 64, 4, 2, 2)),
        (20, 384, (32, 32, 128, 4, 2, 1)),
        (64, 256, None),
    ],
)
def test_fp8_mm_sums_the_fp8_rows_and_weights_it_was_given(rows, k, blocks):
    """:func:`kernels.fp8_mm`: the rows rounded by :func:`kernels.fp8_rows`, then the FP8 tensor
    cores with the weights first, against F.linear on both sides widened with their scales:
    rows padded to 16-64, N and K not multiples of the tile, a bias, K split (the counters left
    at zero) or not."""
    from voicert.engine.gpu.fp8 import Fp8Linear

    g = torch.Generator().manual_seed(rows)
    q = Fp8Linear.from_linear(torch.nn.Linear(k, 90, bias=True)).to(DEV)
    x = torch.randn(rows, k, generator=g).to(DEV)
    xq, xs = kernels.fp8_rows(x)
    want = torch.nn.functional.linear(xq.float() * xs, q.dequantized(torch.float32), q.bias)
    count = kernels.counters(DEV)
    got = kernels.fp8_mm(x, q.weight, q.scale, q.bias, count, blocks)
    # Hopper's FP8 MMA keeps fewer bits than fp32 within one instruction's K (DeepSeek-V3's
    # report, 3.3.2): up to 5.4e-4 here of sums up to 2.3 (H200); the interpreter's are fp32
    tol = 1e-3 if DEV == "cuda" else 1e-4
    err = ((got - want).abs().max().item(), want.abs().max().item())
    assert got.shape == (rows, 90) and close(got, want, tol) and not count.any(), err


@pytest.mark.parametrize(
    "rows, k, blocks",
    [
        (2, 256, None),
        (7, 320, (16, 64, 128, 4, 2, 2)),  # the last split's tile runs past K
        (20, 384, (32, 32, 128, 4, 2, 1)),
        (64, 512, None),
        (5, 200, (16, 64, 64, 4, 2, 2)),  # rows of 200 bytes: no descriptor, the threads' loads
    ],
)
def test_fp8_mm_reading_its_tiles_by_tma_gives_the_same_sums(monkeypatch, rows, k, blocks):
    """``FP8_MM_TMA``: fp8_mm's tiles read through tensor descriptors (zero past the edges of
    rows, outputs and K) give the sums of the threads' masked loads, bit for bit, with K split
    or not; rows that are not whole 16 bytes keep the threads' loads."""
    from voicert.engine.gpu.fp8 import Fp8Linear

    mm = kernels.fp8_matmul
    g = torch.Generator().manual_seed(100 + rows)
    q = Fp8Linear.from_linear(torch.nn.Linear(k, 90, bias=True)).to(DEV)
    x = torch.randn(rows, k, generator=g).to(DEV)
    count = kernels.counters(DEV)
    monkeypatch.setattr(mm, "FP8_MM_TMA", False)
    plain = kernels.fp8_mm(x, q.weight, q.scale, q.bias, count, blocks)
    made, real = [], mm._descriptor
    monkeypatch.setattr(mm, "FP8_MM_TMA", True)
    monkeypatch.setattr(mm, "_descriptor", lambda *a: made.append(a[1:]) or real(*a))
    by_tma = kernels.fp8_mm(x, q.weight, q.scale, q.bias, count, blocks)
    assert torch.equal(by_tma, plain) and not count.any()
    bm, bn, bk = (blocks or kernels.fp8_mm_blocks(rows, 90, k))[:3]
    assert made == ([] if k % 16 else [(bm, bk), (bn, bk)])


@pytest.mark.skipif(DEV != "cuda", reason="CUDA graphs: the GPU's")
def test_fp8_mm_by_tma_in_a_cuda_graph_reads_each_replays_inputs():
    """Served steps replay fp8_mm in CUDA graphs. Its tensor descriptors are built on the host
    at capture and hold the addresses of that capture's buffers (the rows rounded inside it,
    the weights), so each replay must read the rows copied in since, not the captured ones:
    every replay equals fp8_mm called eagerly on its rows, bit for bit."""
    from voicert.engine.gpu.fp8 import Fp8Linear

    assert kernels.fp8_matmul.FP8_MM_TMA and kernels.common.tma_supported(torch.device(DEV))
    g = torch.Generator().manual_seed(21)
    q = Fp8Linear.from_linear(torch.nn.Linear(512, 640, bias=True)).to(DEV)
    xs = [torch.randn(8, 512, generator=g).to(DEV, torch.bfloat16) for _ in range(3)]
    count = kernels.counters(DEV)
    static = xs[0].clone()
    kernels.fp8_mm(static, q.weight, q.scale, q.bias, count)  # (compiled before the capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.fp8_mm(static, q.weight, q.scale, q.bias, count)
    for x in xs[1:] + xs[:1]:
        static.copy_(x)
        graph.replay()
        want = kernels.fp8_mm(x, q.weight, q.scale, q.bias, count)
        assert torch.equal(out, want) and not count.any()


def test_fp8_mm_reads_by_tma_only_where_the_device_has_it(monkeypatch):
    """TMA is Hopper's: a GPU below compute capability 9 (Ada's FP8) keeps the threads' loads
    with ``FP8_MM_TMA`` on; Hopper and the interpreter's CPU tensors read by descriptors."""
    from voicert.engine.gpu.fp8 import Fp8Linear

    supported = kernels.common.tma_supported
    try:
        for capability, want in (((8, 9), False), ((9, 0), True)):
            supported.cache_clear()
            monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d, c=capability: c)
            assert supported(torch.device("cuda", 0)) is want
        assert supported(torch.device("cpu"))
    finally:
        supported.cache_clear()  # (no faked capability kept for later tests)
    mm, made = kernels.fp8_matmul, []
    real = mm._descriptor
    monkeypatch.setattr(mm, "tma_supported", lambda device: False)
    monkeypatch.setattr(mm, "_descriptor", lambda *a: made.append(a) or real(*a))
    q = Fp8Linear.from_linear(torch.nn.Linear(256, 40)).to(DEV)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(2)).to(DEV)
    kernels.fp8_mm(x, q.weight, q.scale, q.bias)
    assert mm.FP8_MM_TMA and made == []  # on, yet no descriptor where the device has no TMA


def test_fp8_mm_streams_wide_weights_unsplit_and_splits_k_for_narrow_ones():
    """fp8_mm's default tiles: 128 outputs a program and K whole where that makes a program for
    every SM (Llama-8B's gate_up, 28672 wide); else 64 outputs and K split toward
    ``FP8_PROGRAMS`` programs, half that above 32 rows."""
    assert kernels.fp8_mm_blocks(8, 28672, 4096) == (16, 128, 128, 4, 4, 1)
    assert kernels.fp8_mm_blocks(2, 6144, 4096) == (16, 64, 128, 4, 4, 3)  # 96 tiles
    assert kernels.fp8_mm_blocks(32, 4096, 14336) == (32, 64, 128, 4, 4, 5)  # 64 tiles
    assert kernels.fp8_mm_blocks(64, 4096, 14336) == (64, 64, 128, 4, 4, 3)
    assert kernels.fp8_mm_blocks(64, 4096, 1024)[-1] == 2  # (K // 512 at most)


def test_bf16_steps_of_a_few_rows_take_fp8_mm_up_to_fp8_mm_rows(monkeypatch):
    """With ``FP8_MM_ROWS`` set, bf16 steps of 2 to that many rows with FP8 weights launch
    :func:`kernels.fp8_mm` (the sums of the rows :func:`kernels.fp8_rows` rounds, to bf16's
    rounding); one row (even of weights too wide for gemv), more rows, fp32 rows (the
    exactness tests' dtype) and unscaled weights do not."""
    from voicert.engine.gpu.fp8 import Fp8Linear

    launched = []
    monkeypatch.setattr(kernels.fp8_matmul, "FP8_MM_ROWS", 8)
    monkeypatch.setattr(
        kernels.fp8_matmul, "_fp8_mm_kernel", _Spy(kernels.fp8_matmul._fp8_mm_kernel, launched)
    )
    g = torch.Generator().manual_seed(9)
    q = Fp8Linear.from_linear(torch.nn.Linear(128, 48, bias=False)).to(DEV)
    for rows in (1, 2, 8, 9):
        x = torch.randn(rows, 128, generator=g).to(DEV).bfloat16()
        got = kernels.fp8_linear(x, q.weight, q.scale, None).float()
        if 2 <= rows <= 8:  # what the FP8 tensor cores were given
            xq, xs = kernels.fp8_rows(x)
            x = xq.float() * xs
        elif DEV != "cuda":  # (the interpreter's widening kernel: fp32 only; the GPU checks it)
            continue
        want = torch.nn.functional.linear(x.float(), q.dequantized(torch.float32))
        assert close(got, want, 2e-2)
    assert len(launched) == 2
    x = torch.randn(2, 128, generator=g).to(DEV)
    want = torch.nn.functional.linear(x, q.dequantized(torch.float32))
    assert close(kernels.fp8_linear(x, q.weight, q.scale, None), want, 1e-4)
    w = torch.randn(48, 128, generator=g).to(DEV).bfloat16()
    got = kernels.fp8_linear(x.bfloat16(), w, None, None).float()
    if DEV == "cuda":  # (the interpreter's widening kernel: fp32 only)
        assert close(got, x.bfloat16().float() @ w.float().T, 5e-2)
    # one row of a wide FP8 head: not fp8_mm
    monkeypatch.setattr(kernels.fp8_matmul, "GEMV_MAX_N", 32)
    kernels.fp8_linear(x[:1].bfloat16(), q.weight, q.scale, None)
    assert len(launched) == 2


def test_fp8_layers_that_keep_x_never_round_rows_to_fp8(monkeypatch):
    """``llm.fp8_activations: model`` (an Fp8Linear's ``round_rows`` off): bf16 steps of several
    rows take the widening kernel, whatever their count, not fp8_mm or cuBLAS's _scaled_mm."""
    from voicert.engine.gpu.fp8 import Fp8Linear

    mm, widened = [], []
    monkeypatch.setattr(
        kernels.fp8_matmul, "_fp8_mm_kernel", _Spy(kernels.fp8_matmul._fp8_mm_kernel, mm)
    )
    monkeypatch.setattr(
        kernels.fp8_matmul,
        "_fp8_linear_kernel",
        _Spy(kernels.fp8_matmul._fp8_linear_kernel, widened),
    )
    monkeypatch.setattr(
        kernels.fp8_matmul, "fp8_scaled_mm", lambda *a: pytest.fail("rounded to FP8")
    )
    q = Fp8Linear.from_linear(torch.nn.Linear(128, 48, bias=False)).to(DEV)
    q.round_rows = False
    g = torch.Generator().manual_seed(10)
    for rows in (4, kernels.fp8_matmul.FP8_MM_ROWS + 3):
        x = torch.randn(rows, 128, generator=g).to(DEV).bfloat16()
        got = (
            q(x).float()
            if DEV == "cuda"
            else kernels.fp8_linear(x, q.weight, q.scale, None, round_rows=False).float()
        )
        if DEV == "cuda":  # (the interpreter's widening kernel: fp32 only)
            want = torch.nn.functional.linear(x.float(), q.dequantized(torch.float32))
            assert close(got, want, 2e-2)
    assert not mm and len(widened) == 2


@pytest.mark.skipif(
    DEV != "cuda" or not kernels.pdl_supported(DEV),
    reason="programmatic dependent launch: a GPU of compute capability 9.0 or newer",
)
@pytest.mark.parametrize(
    "fp8,linear",
    [(False, False), (False, True), (True, False)],
    ids=["bf16-cublas", "bf16-triton-linear", "fp8"],
)
def test_kernels_launched_with_pdl_give_the_bits_of_plain_launches(fp8, linear):
    """Programmatic dependent launch (``llm.pdl``) changes when a kernel may start, never what it
    computes: the fused forward in bf16 (decode rows with split keys, and a prefill row over
    query tiles; with FP8 Linears, both the widening kernel and the tensor-core path) gives the
    same bits and the same KV pool with and without it, eagerly and in every replay of a CUDA
    graph of it."""
    from voicert.bench.shapes import shape_config
    from voicert.engine.gpu.fp8 import quantize_fp8

    cfg = LlamaConfig.from_hf(dict(shape_config("llama-1b-random"), num_hidden_layers=3))
    model = random_llama(cfg, torch.bfloat16, DEV)
    if fp8:
        quantize_fp8(model)
    model.use_kernels = True
    model.triton_linear_rows = kernels.fp8_matmul.LINEAR_ROWS if linear else 0
    g = torch.Generator().manual_seed(5)
    bs, lengths = 16, [700, 33, 5, 260]
    tables, nxt = block_tables(lengths, bs, 48)
    runners = [ModelRunner(model, nxt, bs) for _ in range(2)]
    prefix = [torch.randint(0, 30000, (n,), generator=g).tolist() for n in lengths]
    for runner in runners:
        run_layers(model, runner, [Row(p, 0, t, len(p)) for p, t in zip(prefix, tables)], True)
    decode = [
        Row([int(torch.randint(0, 30000, (1,), generator=g))], n, t, 0)
        for n, t in zip(lengths, tables)
    ]
    prefill = [Row(torch.randint(0, 30000, (40,), generator=g).tolist(), lengths[0], tables[0], 0)]
    for rows in (decode, decode[:1], prefill):  # (one row: gemv)
        model.pdl = False
        want = run_layers(model, runners[0], rows, True)
        model.pdl = True
        got = run_layers(model, runners[1], rows, True)
        assert torch.equal(got, want)  # the pools past block 0 (padding's scratch) too:
        assert torch.equal(runners[1].k_pool[:, 1:], runners[0].k_pool[:, 1:])
        assert torch.equal(runners[1].v_pool[:, 1:], runners[0].v_pool[:, 1:])
        ids, inp = runners[1].prepare(rows)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode():
            model(ids, inp, runners[1].k_pool, runners[1].v_pool)  # (warm)
            with torch.cuda.graph(graph):
                out = model(ids, inp, runners[1].k_pool, runners[1].v_pool)
        for _ in range(20):  # the same slots rewritten with the same values each replay
            graph.replay()
            assert torch.equal(out, want)
        assert torch.equal(runners[1].v_pool[:, 1:], runners[0].v_pool[:, 1:])


def test_pdl_is_a_gpu_option_and_a_bad_value_names_the_key():
    from voicert.config import ConfigError, LlmConfig

    assert not kernels.pdl_supported("cpu")
    with pytest.raises(ConfigError, match="llm.pdl"):
        LlmConfig(pdl="yes")
    with pytest.raises(ConfigError, match="llm.pdl"):
        LlmConfig(pdl="on")  # (llm.device: cpu)
    assert LlmConfig(pdl="on", device="cuda").pdl == "on"


def test_linear_tiles_come_from_the_measured_table_for_a_listed_gpu_and_dtype_only():
    table = kernels.linear_tiles("NVIDIA H100 80GB HBM3", torch.bfloat16)
    assert table[(3072, 2048)] == (16, 64, 64, 4, 4)  # Llama-3.2-1B's qkv
    assert all(
        len(t) == 5 and t[0] == 16 and t[0] >= kernels.fp8_matmul.LINEAR_ROWS
        for t in table.values()
    )
    assert kernels.linear_tiles("NVIDIA H100 80GB HBM3", torch.float16) == {}
    assert kernels.linear_tiles("a GPU nobody measured", torch.bfloat16) == {}


def test_decode_linear_is_checked_and_names_the_key():
    from voicert.config import ConfigError, LlmConfig

    with pytest.raises(ConfigError, match="llm.decode_linear"):
        LlmConfig(decode_linear="cutlass")
    with pytest.raises(ConfigError, match="llm.decode_linear"):
        LlmConfig(decode_linear="triton")  # (llm.device: cpu)
    assert LlmConfig(decode_linear="triton", device="cuda").decode_linear == "triton"
    assert LlmConfig(decode_linear="cublas").decode_linear == "cublas"


def test_the_llm_sections_pdl_and_decode_linear_reach_the_engine_config():
    from voicert.config import LlmConfig
    from voicert.engine.settings import engine_config

    cfg = engine_config(LlmConfig(device="cuda", pdl="off", decode_linear="cublas"))
    assert (cfg.pdl, cfg.decode_linear, cfg.fused_kernels) == ("off", "cublas", True)
    assert engine_config(LlmConfig()).pdl == "auto"  # (CPU: no fused kernels to launch anyway)


@pytest.mark.skipif(DEV == "cuda", reason="on a GPU the tests above ran compiled")
def test_each_kernel_launched_here_compiles_for_hopper_as_served(tmp_path):
    """CI runs the kernels in the interpreter, which lets through what only the compiler
    refuses. So each kernel the tests above launched is compiled for sm_90 by Triton's own
    compiler (no GPU needed): one launch of each set of its flags (its boolean constants) and
    its warps and pipeline stages, with the GPU's constants, and each also with PDL on, as a
    Hopper serves it (scripts/compile_kernels.py; it compiles every distinct launch). Runs
    last, after them."""
    import json
    import subprocess
    import sys

    if not LAUNCHES:
        pytest.skip("no kernel was launched in this process before this test")
    flags = {}
    for launch in LAUNCHES:
        key = (launch["kernel"], *(v for v in launch["constants"].values() if isinstance(v, bool)))
        shape = [launch["options"].get(o) for o in ("num_warps", "num_stages")]
        flags.setdefault(json.dumps([str(k) for k in (*key, *shape)]), launch)
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(list(flags.values())))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")  # compiled here, not found in a cache
    script = _compile_kernels().__file__
    done = subprocess.run(
        [sys.executable, script, "--from", str(path), "--arch", "90"],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    kernels_seen = len({launch["kernel"] for launch in LAUNCHES})
    assert f"launches of {kernels_seen} kernels compiled" in done.stdout, done.stdout
