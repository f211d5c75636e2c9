"""What every kernel module here shares: programmatic dependent launch (:func:`_pdl_enter`,
:func:`pdl_supported`); split-K, where the programs of one output tile each sum a part of K and
the last to finish adds the parts (:func:`counters`, :func:`_split_k`, :func:`_split_rule`,
:func:`_split_k_finish`); and the dot product that keeps fp32 inputs in IEEE fp32.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

try:  # griddepcontrol, for programmatic dependent launch (Triton 3.6 has it)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_GDC = True
except ImportError:  # older Triton: the kernels run, launched plainly (pdl_supported is False)
    gdc_launch_dependents = gdc_wait = None
    HAS_GDC = False


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@triton.jit
def _pdl_enter(PDL: tl.constexpr):
    """Programmatic dependent launch (Hopper+): a kernel launched with ``launch_pdl`` may start
    while the kernel before it on the stream still runs. It waits here for that kernel to have
    finished (its stores visible) before touching memory another kernel writes or reads, then
    lets the next kernel start its own programs. Every program of every such kernel waits, so a
    kernel's finish still implies its predecessors' (the chain stays ordered)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@functools.cache
def tma_supported(device: torch.device) -> bool:
    """Whether a kernel on ``device`` may read its tiles by TMA (tensor descriptors): a CUDA GPU
    of compute capability 9.0 or newer (Hopper's tensor memory accelerator), or a CPU tensor
    under Triton's interpreter, which runs descriptor loads as plain masked ones."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] >= 9


def pdl_supported(device: torch.device | str) -> bool:
    """Whether kernels on ``device`` can be launched with programmatic dependent launch: a CUDA
    GPU of compute capability 9.0 or newer (``griddepcontrol``), not Triton's CPU interpreter."""
    import os

    dev = torch.device(device)
    return (
        HAS_GDC
        and dev.type == "cuda"
        and torch.cuda.get_device_capability(dev)[0] >= 9
        and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    )


def counters(device: torch.device | str, n: int = 4096) -> torch.Tensor:
    """Zeroed int32 counters for :func:`paged_attention` and :func:`argmax_rows` (each launch
    leaves them at zero again). One set per caller that launches on one stream at a time."""
    return torch.zeros(n, dtype=torch.int32, device=device)


@triton.jit
def _fp8_dot(x, w, acc, IEEE: tl.constexpr):
    """acc + x [BM, BK] @ w [BN, BK]^T, in IEEE fp32 for fp32 inputs."""
    if IEEE:
        return tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    return tl.dot(x, tl.trans(w), acc)


@triton.jit
def _fp8_epilogue(
    acc,
    s_ptr,
    b_ptr,
    out_ptr,
    at,
    rn,
    nm,
    out_mask,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    acc = _scale_bias(acc, s_ptr, b_ptr, rn, nm, HAS_SCALE, HAS_BIAS)
    tl.store(out_ptr + at, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _scale_bias(acc, s_ptr, b_ptr, rn, nm, HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Sums acc [..., BN] (fp32) of output columns ``rn`` [BN] (mask ``nm``) times their weights'
    scales, plus their bias: how every Linear kernel's epilogue finishes them."""
    if HAS_SCALE:
        acc = acc * tl.load(s_ptr + rn, mask=nm, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=nm, other=0.0).to(tl.float32)
    return acc


@triton.jit
def _rotate(x1, x2, c, sn, dtype: tl.constexpr):
    """HF's half-split RoPE of the halves x1, x2 (float32) by cos c and sin sn, in ``dtype``:
    (x1 c - x2 s, x2 c + x1 s), each an explicit FMA over one rounded product, so that every
    kernel that rotates (RoPE + KV write, attention with ROPE) gets the same bits."""
    return tl.fma(x1, c, x2 * -sn).to(dtype), tl.fma(x2, c, x1 * sn).to(dtype)


@triton.jit
def _to_pool(x, pool_ptr, KV_FP8: tl.constexpr):
    """x in the pool's dtype: an FP8 pool's values clamped to e4m3's range (scale 1), as
    layers.write_kv does."""
    if KV_FP8:
        x = tl.clamp(x.to(tl.float32), -448.0, 448.0)  # +-E4M3_MAX (a literal in a kernel)
    return x.to(pool_ptr.dtype.element_ty)


@triton.jit
def _reset_counter(count_ptr):
    """A last-program counter set back to zero for the next launch, by the last program: a plain
    store. Every other program of this launch has bumped it already, and the next launch's
    programs bump it only after their PDL wait, once this kernel has finished and its stores are
    visible. (An acquire-release exchange here put a full memory barrier and a round trip to L2
    after the program's result stores, at the end of the step's critical path.)"""
    tl.store(count_ptr, 0)


@triton.jit
def _split_k_finish(
    acc,
    rm,
    rn,
    mm,
    nm,
    M,
    N,
    s_ptr,
    b_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    SPLIT: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """A program's output tile acc [BM, BN] (fp32; rows rm, columns rn, their masks mm, nm) to
    out [M, N] through :func:`_fp8_epilogue`. ``SPLIT`` > 1 (K split over the grid's third
    axis): each split stores its partial sums in part [SPLIT, M, N] and the last of the tile's
    programs to finish (``count_ptr``'s counter, one per tile, left at zero again) adds them up
    and writes the tile."""
    out_mask = mm[:, None] & nm[None, :]
    at = rm[:, None].to(tl.int64) * N + rn[None, :]  # [BM, BN] offsets into [M, N]
    if SPLIT > 1:
        tl.store(part_ptr + tl.program_id(2) * M * N + at, acc, mask=out_mask)
        tl.debug_barrier()
        tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel") == SPLIT - 1:
            total = tl.zeros(acc.shape, dtype=tl.float32)
            for sp in tl.static_range(SPLIT):
                total += tl.load(
                    part_ptr + sp * M * N + at, mask=out_mask, other=0.0, cache_modifier=".cg"
                )
            _fp8_epilogue(total, s_ptr, b_ptr, out_ptr, at, rn, nm, out_mask, HAS_SCALE, HAS_BIAS)
            _reset_counter(count_ptr + tile)
    else:
        _fp8_epilogue(acc, s_ptr, b_ptr, out_ptr, at, rn, nm, out_mask, HAS_SCALE, HAS_BIAS)


def _split_k(
    out: torch.Tensor, k: int, split: int, step: int, tiles: int, count: torch.Tensor | None
) -> tuple[int, int, torch.Tensor, torch.Tensor | None]:
    """For a kernel whose programs each sum a part of K into ``out`` [M, N] (finished by
    :func:`_split_k_finish`): (columns a part, parts, where the parts' sums go, counters).
    ``split`` parts are asked for, each a whole number of ``step`` columns, so fewer may come;
    with more than one, the partial sums go to a new float32 [parts, M, N] and ``count`` (one
    zeroed counter per output tile, ``tiles`` of them; None: fresh ones) orders the finish."""
    per = triton.cdiv(triton.cdiv(k, split), step) * step
    split = triton.cdiv(k, per)
    if split == 1:
        return per, 1, out, count
    part = torch.empty(split, *out.shape, dtype=torch.float32, device=out.device)
    if count is None:
        count = counters(out.device, tiles)
    assert count.numel() >= tiles
    return per, split, part, count


FP8_PROGRAMS = 264  # aim for at least this many programs (two per SM of an H100's 132)
FP8_MIN_SPLIT_K = 512  # a split of K streams at least this many columns


def _split_rule(
    tiles: int, k: int, least: int = FP8_MIN_SPLIT_K, programs: int = FP8_PROGRAMS
) -> int:
    """How many parts to split K into for ``tiles`` output tiles: until there are ``programs``
    programs, at most 16 parts, each at least ``least`` columns."""
    return max(1, min(16, triton.cdiv(programs, tiles), k // least))
