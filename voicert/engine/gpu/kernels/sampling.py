"""What a step does with its logits on the GPU: the greedy token of each row (:func:`argmax_rows`,
many programs a row, the last to finish reducing) and speculation's bookkeeping for the next
step (:func:`feed_step`, :func:`accept_counts`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicert.engine.gpu.kernels.common import _pdl_enter, _pow2, _reset_counter, counters

# ----------------------------------------------------------------------------- greedy pick

_ARGMAX_BLOCK = 4096  # logits per program


@triton.jit
def _argmax_kernel(
    x_ptr,
    part_v_ptr,
    part_i_ptr,
    count_ptr,
    out_ptr,
    n_cols,
    inner,
    out_stride,
    BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    chunks = tl.num_programs(1)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    _pdl_enter(PDL)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=float("-inf"))
    x = x.to(tl.float32)
    best = tl.max(x, axis=0)
    at = tl.min(tl.where(x == best, cols, n_cols), axis=0)  # the first column holding the max
    tl.store(part_v_ptr + row * chunks + c, best)
    tl.store(part_i_ptr + row * chunks + c, at)
    tl.debug_barrier()
    if tl.atomic_add(count_ptr + row, 1, sem="acq_rel") == chunks - 1:
        k = tl.arange(0, CHUNKS)
        km = k < chunks
        v = tl.load(
            part_v_ptr + row * chunks + k, mask=km, other=float("-inf"), cache_modifier=".cg"
        )
        i = tl.load(part_i_ptr + row * chunks + k, mask=km, other=n_cols, cache_modifier=".cg")
        top = tl.max(v, axis=0)
        pick = tl.min(tl.where(v == top, i, n_cols), axis=0)  # ties: the lowest column
        tl.store(out_ptr + (row // inner) * out_stride + row % inner, pick.to(tl.int64))
        _reset_counter(count_ptr + row)


def argmax_rows(
    x: torch.Tensor,
    count: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """x [..., V] (contiguous) -> the index of each row's largest value, int64 [...] (ties: the
    first, as ``torch.argmax``). count: zeroed int32 counters, one per row (None: fresh ones).
    out: where to write, a [R // inner, inner] view with any row stride of a longer buffer.
    ``pdl``: as :func:`add_rms_norm`'s."""
    n = x.shape[-1]
    rows = x.numel() // n
    if out is None:
        out = torch.empty(x.shape[:-1], dtype=torch.long, device=x.device)
    out2 = out.view(-1, out.shape[-1]) if out.dim() > 0 else out.view(1, 1)
    assert out2.shape[0] * out2.shape[1] == rows and out2.stride(-1) == 1
    if count is None:
        count = counters(x.device, rows)
    assert count.numel() >= rows
    chunks = triton.cdiv(n, _ARGMAX_BLOCK)
    part_v = torch.empty(rows * chunks, dtype=torch.float32, device=x.device)
    part_i = torch.empty(rows * chunks, dtype=torch.int32, device=x.device)
    _argmax_kernel[(rows, chunks)](
        x,
        part_v,
        part_i,
        count,
        out2,
        n,
        out2.shape[1],
        out2.stride(0),
        BLOCK=_ARGMAX_BLOCK,
        CHUNKS=_pow2(chunks),
        PDL=pdl,
        num_warps=8,
        launch_pdl=pdl,
    )
    return out


# ----------------------------------------------------------------------------- step inputs


@triton.jit
def _feed_kernel(
    ids_ptr,
    pos_ptr,
    slot_ptr,
    src_ptr,
    table_ptr,
    out_ptr,
    acc_ptr,
    out_stride,
    n_out,
    max_blocks,
    W: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    j = tl.load(src_ptr + i * W)
    if j >= 0:
        n = tl.load(acc_ptr + j)  # drafts the previous step accepted in its row j
        t = tl.arange(0, BLOCK_W)
        tm = t < W
        tok = tl.load(out_ptr + t * out_stride + j * W + n, mask=tm & (t < n_out), other=0)
        tl.store(ids_ptr + i * W + t, tok, mask=tm)
        p = tl.load(pos_ptr + i * W + t, mask=tm, other=0) - (W - 1) + n
        tl.store(pos_ptr + i * W + t, p, mask=tm)
        page = tl.load(table_ptr + i * max_blocks + p // BS, mask=tm, other=0)
        tl.store(slot_ptr + i * W + t, page * BS + p % BS, mask=tm)


@triton.jit
def _accept_kernel(ids_ptr, out_ptr, acc_ptr, W: tl.constexpr, BLOCK_W: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    t = tl.arange(0, BLOCK_W)
    m = t < W - 1
    d = tl.load(ids_ptr + i * W + 1 + t, mask=m, other=0)
    g = tl.load(out_ptr + i * W + t, mask=m, other=0)
    first_miss = tl.min(tl.where(m & (d == g), W - 1, t), axis=0)
    tl.store(acc_ptr + i, first_miss.to(tl.int64))


def feed_step(
    ids: torch.Tensor,
    pos: torch.Tensor,
    slots: torch.Tensor,
    src: torch.Tensor,
    tables: torch.Tensor,
    out: torch.Tensor,
    acc: torch.Tensor,
    block_size: int,
) -> None:
    """A decode step's inputs taken from the previous step's results on the GPU, in place.

    ids/pos/slots/src [B, W] int64 (W = 1 + drafts per row); tables [B, MB]; out [1 + heads, N]
    (the previous step's greedy tokens, then each draft head's guesses, at every position of its
    [B', W] rows); acc [B'] (drafts its rows accepted, see :func:`accept_counts`). For each row i
    with src[i, 0] = j >= 0: n = acc[j]; the row feeds the greedy token after the last accepted
    position (out[0, j * W + n]) and the heads' guesses there (out[1 + h, j * W + n]); its staged
    positions, laid out for the most drafts the previous step could accept (n = W - 1), move to
    pos - (W - 1) + n, and its KV slots follow through its block table. Rows with src < 0 keep
    their staged inputs."""
    b, w = ids.shape
    _feed_kernel[(b,)](
        ids,
        pos,
        slots,
        src,
        tables,
        out,
        acc,
        out.stride(0),
        out.shape[0],
        tables.shape[1],
        W=w,
        BS=block_size,
        BLOCK_W=_pow2(w),
        num_warps=1,
    )


def accept_counts(ids: torch.Tensor, out: torch.Tensor, acc: torch.Tensor) -> None:
    """acc[i] = how many of row i's drafts (ids[i, 1:]) the step's greedy tokens (out [B * W],
    row-major) confirm before the first disagreement: what ``accept_greedy`` keeps, less the
    target's own token. ids [B, W] int64; acc [>= B] int64, written in place."""
    b, w = ids.shape
    _accept_kernel[(b,)](ids, out, acc, W=w, BLOCK_W=max(2, _pow2(w)), num_warps=1)
