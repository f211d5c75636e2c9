"""FlashAttention-4 for prefill steps: ``llm.prefill_attention: flash`` (or ``auto``).

With the fused kernels on, a decode or verify step attends through our paged Triton kernel, and a
prefill step (too many query rows for it) gathers each row's blocks and runs SDPA under a causal
mask. FlashAttention-4 (the optional ``flash-attn-4`` package: CuTe DSL kernels for Hopper and
newer, bf16 / fp16) reads the paged pool in place through the block tables instead: no gathered
copy of every row's keys and values per layer. ``python -m voicert.bench.attention`` times the
three side by side (docs/benchmarks.md section 23).

A prefill step's rows are right-padded to the step's width: a row's real tokens have consecutive
positions from ``positions[b, 0]``; padding has position 0. So for each row the keys it sees end at
its last real position, and FlashAttention's bottom-right causal alignment over ``seqused_q``
real queries places each one at its own position. Padding rows' outputs are zeroed: FlashAttention
leaves them unwritten, and they flow on into the padding tokens' (scratch) KV writes.
"""

from __future__ import annotations

import torch

from voicert.engine.models.layers import AttnInputs


def unavailable(
    device: torch.device | str, dtype: torch.dtype, kv_dtype: torch.dtype | None = None
) -> str | None:
    """Why FlashAttention-4 cannot run prefill attention here, or None when it can
    (``kv_dtype``: the KV pool's, which it reads in place; None: ``dtype``)."""
    device = torch.device(device)
    if device.type != "cuda":
        return "it runs on CUDA GPUs only"
    if torch.cuda.get_device_capability(device) < (9, 0):
        return "it needs compute capability 9.0 (Hopper) or newer"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"it runs bf16 and fp16, not {str(dtype).removeprefix('torch.')}"
    if kv_dtype not in (None, dtype):
        return (
            f"it reads the KV cache in place, and this cache holds "
            f"{str(kv_dtype).removeprefix('torch.')} (llm.kv_cache)"
        )
    try:
        from flash_attn.cute import flash_attn_varlen_func  # noqa: F401
    except Exception as exc:  # ImportError, or its CuTe DSL / CUDA libraries failing to load
        return f"the flash-attn-4 package does not import here ({type(exc).__name__}: {exc})"
    return None


class FlashRows:
    """Prefill attention by FlashAttention-4 straight from the paged pool; its per-row inputs are
    built once per forward (inside a captured graph, from the graph's static inputs)."""

    def __init__(self, inp: AttnInputs) -> None:
        pos = inp.positions  # [B, Q] int64
        last = pos.max(dim=1).values  # [B] each row's last real position
        self.used_k = (last + 1).to(torch.int32)  # [B] keys each row sees
        self.used_q = (last - pos[:, 0] + 1).to(torch.int32)  # [B] real query tokens
        width = torch.arange(pos.shape[1], device=pos.device)
        self.real = (width < self.used_q.unsqueeze(1)).view(*pos.shape, 1, 1)  # [B, Q, 1, 1]
        self.table = inp.block_tables.to(torch.int32)  # [B, MB]

    def __call__(
        self, layer, q: torch.Tensor, inp: AttnInputs, k_pool: torch.Tensor, v_pool: torch.Tensor
    ) -> torch.Tensor:
        """q [B, Q, H, D] (rotated) over k_pool / v_pool [NB, BS, KVH, D] -> [B, Q, H * D]."""
        from flash_attn.cute import flash_attn_varlen_func

        b, q_len, h, d = q.shape
        out = flash_attn_varlen_func(
            q.contiguous(),
            k_pool,
            v_pool,
            seqused_q=self.used_q,
            seqused_k=self.used_k,
            page_table=self.table,
            max_seqlen_q=q_len,
            causal=True,
        )
        out = out[0] if isinstance(out, tuple) else out  # [B, Q, H, D]
        return torch.where(self.real, out, 0.0).view(b, q_len, h * d)
