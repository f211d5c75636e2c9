"""Layers shared by the decoder architectures: RMSNorm, rotary embeddings, paged attention (torch or
the fused Triton kernels), the gated MLP, the pre-norm block. An architecture file (llama.py) builds
its model from these and converts its checkpoint's weights; a new architecture reuses what fits and
adds only what differs (see registry.py).

Attention reads and writes a paged KV pool (see ``voicert.engine.core.kv_cache``): each forward writes the
new tokens' K/V into their slots, then attends over each sequence's blocks through its block table.
Shapes: B sequences, Q new tokens per sequence (right-padded), L = max_blocks * block_size.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from voicert.engine.gpu.formats import E4M3_MAX


class LayerShape(Protocol):
    """What the shared layers below read of an architecture's config (llama.py's
    ``LlamaConfig``, gemma.py's): their widths and switches, nothing of the architecture."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    attention_bias: bool
    qk_norm: bool


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda or x.dtype == torch.float32:  # one op (CUDA: one fused kernel) instead of
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # seven
        dtype = x.dtype  # HF's order for half types on the CPU: normalise in fp32, then cast
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


@torch.jit.script
def _few_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias), x [..., K], weight [N, K] -> [..., N]; on the CPU, up to 4
    rows (a decode step's) as weight @ x^T. MKL's sgemm takes a few rows as its narrow side much
    faster than as its wide one, and its sgemv is slower still: one row goes as two. SmolLM2-135M
    on 2 cores, a decode step of 1 / 2 / 4 rows 37 / 63 / 58 -> 18 / 19 / 21 ms; on one thread
    (the in-process server's steps ran at one thread's speed) 35 -> 30 ms at one row, but
    8 rows and more are slower this way there (docs/benchmarks.md section 44). Same values
    within float32 rounding. Scripted, so a trace keeps the choice."""
    rows = x.numel() // x.shape[-1]
    if x.is_cuda or rows > 4:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])  # [rows, K]
    if rows == 1:  # sgemv is 2.5x slower than this sgemm of two columns
        flat = flat.expand(2, flat.shape[1]).contiguous()
    out = torch.mm(weight, flat.t())[:, :rows].t().contiguous()  # [rows, N]
    if bias is not None:
        out = out + bias
    shape = x.shape[:-1]
    shape.append(weight.shape[0])
    return out.view(shape)


class NarrowLinear(nn.Linear):
    """An ``nn.Linear`` whose forward is :func:`_few_rows` (see :func:`narrow_linears`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _few_rows(x, self.weight, self.bias)


def narrow_linears(model: nn.Module) -> int:
    """Give every plain ``nn.Linear`` of ``model`` :class:`NarrowLinear`'s forward, in place
    (the same module, its weights, hooks and place kept; an INT8 or FP8 one is left as it is).
    The CPU model runner's, before it traces; returns how many."""
    plain = [m for m in model.modules() if type(m) is nn.Linear]
    for m in plain:
        m.__class__ = NarrowLinear
    return len(plain)


def lm_head_out(
    head: nn.Module, hidden: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The LM head's output [..., V] for hidden [..., H], in ``out`` if given (contiguous, the
    model's dtype): a plain Linear writes it directly; a quantized head (``llm.quant_head``)
    computes it, then it is copied in."""
    if out is None:
        return head(hidden)
    if isinstance(head, nn.Linear):
        return torch.matmul(hidden, head.weight.t(), out=out)
    return out.copy_(head(hidden))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """RoPE, HF's half-split convention, x * cos + rotate_half(x) * sin, in x's dtype, with the
    sign of rotate_half folded into ``sin_signed`` = [-sin, sin] (negation is exact, so the result
    is bit-identical). x: [B, Q, H, D]; cos/sin_signed: [B, Q, 1, D]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([x2, x1], dim=-1) * sin_signed


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sign-folded sin [B, Q, 1, D] of each position's angles (positions [B, Q],
    inv_freq [D/2] float32), in ``dtype`` as HF casts them: the inputs of :func:`rotate`."""
    freqs = positions.unsqueeze(-1).float() * inv_freq  # [B, Q, D/2]
    angles = torch.cat([freqs, freqs], dim=-1).unsqueeze(2)  # [B, Q, 1, D]
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    half = sin.shape[-1] // 2
    return cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)  # rotate_half's sign


@dataclass(slots=True)
class AttnInputs:
    """Per-forward attention metadata, built by the model runner.

    positions:     [B, Q] int64, absolute position of each new token (padding: 0)
    slots:         [B*Q] int64, flat KV-pool slot (block * block_size + offset) each new token writes;
                   padding tokens write the scratch slot 0
    block_tables:  [B, MB] int64, the blocks of each sequence (padded with 0)
    groups:        None, or rows that attend in groups of their own key span (:class:`KeyGroups`,
                   a CPU step's; an attention that takes no groups pads, with the same values)

    Query q of sequence b attends to key positions 0..positions[b, q] (causal over the cached
    prefix and the new tokens); the mask is derived from ``positions`` inside the forward, so a
    captured CUDA graph recomputes it from its static inputs.
    """

    positions: torch.Tensor
    slots: torch.Tensor
    block_tables: torch.Tensor
    groups: KeyGroups | None = None


@dataclass(slots=True)
class KeyGroups:
    """Rows that attend in groups of their own key span (the CPU path; see :func:`plan_groups`).
    A step that pads every row's keys to its longest row's costs each short row the long one's
    gather and scores: one 2,000-token history made four short replies' decode steps 2.4x slower.

    order:  [B] int64, the step's rows by group (each group's rows together)
    bounds: [G, 3] int64, per group: its first and end index into ``order``, and the key blocks
            its rows attend (its longest row's)

    Same values as the padded attention: a padded key is masked to exactly zero weight (on one
    thread the same bits; on more, CPU SDPA splits its work by the batch's shape, as any other
    batch would). Gemma's attention (soft-capped scores, two masks) takes no groups and pads."""

    order: torch.Tensor
    bounds: torch.Tensor


# a group's fixed cost (its dozen ops in each layer), in rows x key blocks: on 2 cores, SmolLM2-135M,
# ~0.4 ms a group a step against ~0.15 ms a row's 16-token block (docs/benchmarks.md section 44)
GROUP_COST_BLOCKS = 8


def plan_groups(blocks: list[int], fixed: int = GROUP_COST_BLOCKS) -> list[tuple[list[int], int]]:
    """Split rows that attend ``blocks[i]`` key blocks into groups, each padded to its own
    longest row, at the least cost: sum over groups of rows x longest + ``fixed`` a group
    (dynamic programming over the rows sorted by span; B is at most a step's rows). Returns
    (row indices, blocks) per group, longest first; one group means no split pays."""
    order = sorted(range(len(blocks)), key=lambda i: -blocks[i])
    n = len(order)
    best = [0] * (n + 1)  # best[k]: the least cost of the first k rows (longest first)
    cut = [0] * (n + 1)
    for k in range(1, n + 1):
        best[k], cut[k] = min((best[j] + (k - j) * blocks[order[j]] + fixed, j) for j in range(k))
    groups = []
    k = n
    while k:
        j = cut[k]
        groups.append((order[j:k], blocks[order[j]]))
        k = j
    return groups[::-1]


@torch.jit.script
def attend_groups(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    tables: torch.Tensor,
    mask: torch.Tensor,
    order: torch.Tensor,
    bounds: torch.Tensor,
) -> torch.Tensor:
    """Attention of each group of rows over its own span of keys (:class:`KeyGroups`): q [B, Q,
    H, D] (rotated), pools [NB, BS, KVH, D] in q's dtype, tables [B, MB], mask [B, 1, Q, MB * BS]
    -> [B, Q, H * D]. Scripted, so a traced forward keeps the loop over however many groups."""
    b, q_len, h, d = q.shape
    bs, kvh = k_pool.shape[1], k_pool.shape[2]
    out = torch.empty(b, q_len, h * d, dtype=q.dtype, device=q.device)
    groups: list[list[int]] = bounds.tolist()
    for g in groups:
        rows = order[g[0] : g[1]]
        n, span = g[1] - g[0], g[2] * bs
        table = tables.index_select(0, rows)[:, : g[2]].reshape(-1)  # [n * blocks]
        keys = k_pool.index_select(0, table).view(n, span, kvh, d).transpose(1, 2)
        vals = v_pool.index_select(0, table).view(n, span, kvh, d).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            q.index_select(0, rows).transpose(1, 2),
            keys,
            vals,
            attn_mask=mask.index_select(0, rows)[..., :span],
            enable_gqa=h != kvh,
        )  # [n, H, Q, D]
        out.index_copy_(0, rows, o.transpose(1, 2).reshape(n, q_len, h * d))
    return out


def causal_mask(positions: torch.Tensor, span: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive causal mask [B, 1, Q, L] over each row's gathered keys 0..L-1 (L = ``span``, the
    block table's width in tokens): query q of row b sees keys 0..positions[b, q]. In ``dtype``."""
    keys = torch.arange(span, device=positions.device)  # [L]
    allowed = (keys.view(1, 1, -1) <= positions.unsqueeze(-1)).unsqueeze(1)  # [B, 1, Q, L]
    zero = torch.zeros((), dtype=dtype, device=keys.device)
    return zero.masked_fill(~allowed, float("-inf"))


class SdpaRows:
    """Attention for query rows too many for the paged decode kernel (prefill steps): each row's
    blocks gathered, then SDPA under one causal mask built once per forward."""

    def __init__(self, inp: AttnInputs, block_size: int, dtype: torch.dtype) -> None:
        self.mask = causal_mask(inp.positions, inp.block_tables.shape[1] * block_size, dtype)

    def __call__(
        self,
        layer: Attention,
        q: torch.Tensor,
        inp: AttnInputs,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
    ) -> torch.Tensor:
        """q [B, Q, H, D] (rotated) -> [B, Q, H * D]."""
        return layer.attend(q, inp, self.mask, k_pool, v_pool)


# llm.kv_cache: the KV pool in the model's dtype, or in one byte a value:
# - fp8: e4m3, scale 1 (values clamped to +-448);
# - int8: each (token, KV head) row of D values scaled by its own largest magnitude / 127, the
#   scale (float32) packed after the row: a pool row is D + 4 bytes.
FP8_KV = torch.float8_e4m3fn
INT8_KV = torch.int8
KV_DTYPES = {"fp8": FP8_KV, "int8": INT8_KV}
INT8_SCALE_BYTES = 4


def pool_row(head_dim: int, kv_dtype: torch.dtype) -> int:
    """A pool row's length (elements) for one (token, KV head): D, or D + 4 for int8's scale."""
    return head_dim + INT8_SCALE_BYTES if kv_dtype == INT8_KV else head_dim


def int8_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] as int8 rows with their float32 scale packed after each: [..., D + 4]."""
    scale = (x.float().abs().amax(-1, keepdim=True) / 127).clamp(min=1e-12)  # [..., 1]
    q = torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8)
    return torch.cat([q, scale.view(torch.int8)], dim=-1)


def write_kv(pool: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """x [T, KVH, D] into pool [NB, BS, KVH, row] at slots [T]. An FP8 pool takes x rounded to
    e4m3, clamped to its range (bytes copied as uint8: index_copy_ does not take float8 on
    every device); an int8 pool, :func:`int8_rows`."""
    nb, bs, kvh, row = pool.shape
    if pool.dtype == FP8_KV:
        x = x.clamp(-E4M3_MAX, E4M3_MAX).to(FP8_KV).view(torch.uint8)
        pool = pool.view(torch.uint8)
    elif pool.dtype == INT8_KV:
        x = int8_rows(x)
    pool.view(nb * bs, kvh, row).index_copy_(0, slots, x.to(pool.dtype))


def read_blocks(pool: torch.Tensor, table: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The pool's blocks [len(table), BS, KVH, D] in ``dtype`` (a one-byte pool's widened)."""
    if pool.dtype == FP8_KV:
        return pool.view(torch.uint8).index_select(0, table).view(FP8_KV).to(dtype)
    if pool.dtype == INT8_KV:
        blocks = pool.index_select(0, table)  # [N, BS, KVH, D + 4]
        scale = blocks[..., -INT8_SCALE_BYTES:].contiguous().view(torch.float32)  # [N, BS, KVH, 1]
        return (blocks[..., :-INT8_SCALE_BYTES].float() * scale).to(dtype)
    return pool.index_select(0, table)


class Attention(nn.Module):
    """Fused q/k/v projection, optional per-head q/k norms (``norm``: the architecture's RMSNorm),
    RoPE, the paged KV write, then :meth:`attend` (an architecture may override it)."""

    def __init__(self, cfg: LayerShape, norm: type[nn.Module] = RMSNorm) -> None:
        super().__init__()
        self.h, self.kvh, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(
            cfg.hidden_size, (self.h + 2 * self.kvh) * self.d, bias=cfg.attention_bias
        )
        self.o = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.qk_norm = cfg.qk_norm  # Qwen3, Gemma 3: each head's q and k normalised before RoPE
        if self.qk_norm:
            self.q_norm = norm(self.d, cfg.rms_norm_eps)
            self.k_norm = norm(self.d, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        inp: AttnInputs,
        mask: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
    ) -> torch.Tensor:
        # x: [B, Q, hidden]; k_pool/v_pool: [NB, BS, KVH, D] (this layer's slice of the pool)
        b, q_len, _ = x.shape
        h, kvh, d = self.h, self.kvh, self.d
        qkv = self.qkv(x).view(b, q_len, h + 2 * kvh, d)  # [B, Q, H + 2 KVH, D]
        qk = qkv[:, :, : h + kvh]  # [B, Q, H + KVH, D]
        if self.qk_norm:
            qk = torch.cat([self.q_norm(qk[:, :, :h]), self.k_norm(qk[:, :, h:])], dim=2)
        qk = rotate(qk, cos, sin)  # q and k rotated together: [B, Q, H + KVH, D]
        q, k, v = qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kvh :]
        write_kv(k_pool, inp.slots, k.reshape(-1, kvh, d))
        write_kv(v_pool, inp.slots, v.reshape(-1, kvh, d))
        return self.o(self.attend(q, inp, mask, k_pool, v_pool))

    def attend_fused(
        self,
        qkv: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        inp: AttnInputs,
        wide: Callable | None,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        count: torch.Tensor,
        pdl: bool = False,
    ) -> torch.Tensor:
        """The attention between the two projections through the Triton kernels: qkv [B, Q,
        (H + 2 KVH) * D] -> [B, Q, H * D]. RoPE (from the model's cos/sin tables) and the KV write
        in one launch, then attention straight from the paged pool (``wide`` None: the caller
        found the query rows fit the decode kernel), or by ``wide`` (:class:`SdpaRows`, or
        engine/models/flash.py's ``FlashRows``), built once per forward. A decode step that
        ``kernels.attention.rope_in_attention`` takes does both in the attention's launch.
        ``pdl``: launch the kernels with programmatic dependent launch
        (engine/gpu/kernels/common.py)."""
        from voicert.engine.gpu import kernels

        b, q_len, _ = qkv.shape
        h, kvh, d = self.h, self.kvh, self.d
        norms = None
        if self.qk_norm:  # the kernel computes layers.RMSNorm (Qwen3's), not another norm
            if type(self.q_norm) is not RMSNorm:
                raise NotImplementedError(f"fused q/k norms of {type(self.q_norm).__name__}")
            norms = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
        att = kernels.attention
        if wide is None and att.rope_in_attention(b, q_len, h // kvh):  # one launch, not two
            roped = att.RopeInputs(*rope, inp.slots, norms)
            return kernels.paged_attention(
                qkv, k_pool, v_pool, inp.block_tables, inp.positions, h, kvh, count, pdl, roped
            )
        kernels.rope_kv_write(
            qkv.view(b * q_len, -1),
            inp.positions.view(-1),
            *rope,
            inp.slots,
            k_pool,
            v_pool,
            h,
            kvh,
            pdl,
            norms,
        )
        if wide is None:
            return kernels.paged_attention(
                qkv, k_pool, v_pool, inp.block_tables, inp.positions, h, kvh, count, pdl
            )
        q = qkv.view(b, q_len, h + 2 * kvh, d)[:, :, :h]  # rotated in place
        return wide(self, q, inp, k_pool, v_pool)

    def attend(
        self,
        q: torch.Tensor,
        inp: AttnInputs,
        mask: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
    ) -> torch.Tensor:
        """q [B, Q, H, D] over the pool's blocks of each sequence (gathered) -> [B, Q, H * D]."""
        b, q_len = q.shape[:2]
        h, kvh, d = self.h, self.kvh, self.d
        if inp.groups is not None:
            g = inp.groups
            return attend_groups(q, k_pool, v_pool, inp.block_tables, mask, g.order, g.bounds)
        keys, vals = self.gather(inp, k_pool, v_pool, q.dtype)
        if q.is_cuda and h != kvh:
            # fold the query heads of each KV head into the query axis: [B, KVH, Q*G, D]; the
            # masked kernels then read each K/V once instead of a repeated copy per query head
            g = h // kvh
            qf = q.reshape(b, q_len, kvh, g, d).permute(0, 2, 1, 3, 4).reshape(b, kvh, q_len * g, d)
            mf = mask.repeat_interleave(g, dim=2) if q_len > 1 else mask  # [B, 1, Q*G | 1, L]
            out = F.scaled_dot_product_attention(qf, keys, vals, attn_mask=mf)  # [B, KVH, Q*G, D]
            out = out.view(b, kvh, q_len, g, d).permute(0, 2, 1, 3, 4)  # [B, Q, KVH, G, D]
            return out.reshape(b, q_len, h * d)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, vals, attn_mask=mask, enable_gqa=h != kvh
        )  # [B, H, Q, D]
        return out.transpose(1, 2).reshape(b, q_len, h * d)

    def gather(
        self, inp: AttnInputs, k_pool: torch.Tensor, v_pool: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each sequence's keys and values from its blocks, in ``dtype``: two [B, KVH, L, D]."""
        b, mb = inp.block_tables.shape
        bs = k_pool.shape[1]
        table = inp.block_tables.view(-1)  # [B*MB]; index_select copies whole blocks
        keys = read_blocks(k_pool, table, dtype).view(b, mb * bs, self.kvh, self.d).transpose(1, 2)
        vals = read_blocks(v_pool, table, dtype).view(b, mb * bs, self.kvh, self.d).transpose(1, 2)
        return keys, vals


class MLP(nn.Module):
    def __init__(self, cfg: LayerShape) -> None:
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: LayerShape) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)


def load_hf(
    model_dir: str | Path,
    dtype: torch.dtype,
    device: str | torch.device,
    from_hf: Callable[[dict], object],
    model_cls: Callable[[object], nn.Module],
    hf_to_ours: Callable[[dict, object], dict],
    rope_buffers: Callable[[object], dict[str, torch.Tensor]],
) -> nn.Module:
    """An architecture's model from an HF checkpoint dir (config.json + *.safetensors): its
    config by ``from_hf``, built on the meta device, the weights renamed by ``hf_to_ours`` and
    assigned, the head tied when the config says so, and the RoPE buffers (``rope_buffers``:
    name -> float32 tensor) set, kept in float32 on ``device`` while the rest takes ``dtype``.
    An AWQ checkpoint's layers (engine/gpu/awq.py) become :class:`Int4Linear` as they are, their
    scales kept in float16."""
    from safetensors.torch import load_file

    from voicert.engine.gpu import awq

    model_dir = Path(model_dir)
    hf_config = json.loads((model_dir / "config.json").read_text())
    cfg = from_hf(hf_config)
    try:
        group = awq.awq_group(hf_config)
    except ValueError as e:
        raise ValueError(f"{model_dir}: {e}") from None
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if group is not None:
        state = awq.awq_records(state)
    ours = hf_to_ours(state, cfg)
    records = {n: ours.pop(n) for n in [n for n, t in ours.items() if t.dtype == torch.uint8]}
    with torch.device("meta"):
        model = model_cls(cfg)
    model.load_state_dict(ours, assign=True, strict=False)
    for name, record in records.items():  # AWQ layers: Int4Linear from their row records
        path, _, attr = name.removesuffix(".weight").rpartition(".")
        parent = model.get_submodule(path)
        lin = getattr(parent, attr)
        bias = None if lin.bias is None or lin.bias.is_meta else lin.bias.detach()
        setattr(parent, attr, awq.from_record(record, lin.in_features, bias))
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    ropes = rope_buffers(cfg)
    for name, t in ropes.items():  # the buffers were built on the meta device
        setattr(model, name, t)
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"{model_dir}: weights missing for {missing[:3]}")
    model = model.to(device=device, dtype=dtype).eval()
    for name, t in ropes.items():  # RoPE angles stay in float32
        setattr(model, name, t.to(device))
    return model
