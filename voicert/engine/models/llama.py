"""The Llama family in plain torch: Llama 2/3.x, SmolLM2, Mistral, Qwen2/2.5 (one block, small switches).

Built from the shared layers (layers.py: paged attention over the KV pool, RMSNorm, RoPE, gated MLP);
this file holds the family's config, the model, and the conversion of its HF checkpoints. One code
path serves prefill, chunked prefill on top of a cached prefix, batched decode and speculative
verification. Shapes: B sequences, Q new tokens per sequence (right-padded), L = max_blocks * block_size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from voicert.engine.gpu.fp8 import Fp8Linear
from voicert.engine.gpu.int4 import Int4Linear, a8_rounds
from voicert.engine.models.flash import FlashRows
from voicert.engine.models.layers import (
    AttnInputs,
    Block,
    RMSNorm,
    SdpaRows,
    causal_mask,
    lm_head_out,
    load_hf,
    rope_cos_sin,
)

ROPE_TABLE_MAX = 1 << 17  # positions the fused kernels' RoPE tables hold at most
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3")  # the HF model_types this file runs


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # Qwen2: q/k/v have biases
    rope_scaling: dict | None = None  # llama3-style frequency scaling
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's q and k (head_dim) before RoPE

    @classmethod
    def from_hf(cls, cfg: dict) -> LlamaConfig:
        """From an HF ``config.json`` dict (transformers 4.x and 5.x spellings)."""
        kind = cfg.get("model_type", "llama")
        if kind not in MODEL_TYPES:
            raise ValueError(f"model_type {kind!r} is not a Llama-family model this engine runs")
        rope = cfg.get("rope_parameters") or {}
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type") == "llama3" else None)
        if scaling is not None and scaling.get("rope_type", scaling.get("type")) not in (
            "llama3",
            "default",
        ):
            raise ValueError(f"rope scaling {scaling} is not supported")
        partial = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
        if partial != 1.0:  # (Phi-4-mini: RoPE on part of each head)
            raise ValueError(f"partial_rotary_factor {partial} is not supported (only 1.0)")
        heads = cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            max_position=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", kind == "qwen2"),
            rope_scaling=scaling
            if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3"
            else None,
            qk_norm=kind == "qwen3",
        )


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """[D/2] inverse frequencies, with llama3 long-context scaling when configured."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    s = cfg.rope_scaling
    if not s:
        return inv.float()
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / lo, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / hi) & (wavelen <= old / lo)
    return torch.where(medium, smoothed, scaled).float()


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        # run the layers through voicert.engine.gpu.kernels (Triton; the engine sets it on CUDA)
        self.use_kernels = False
        # with the kernels, a prefill step's attention: paged (the Triton kernel decode steps use,
        # over tiles of query tokens) | flash (engine/models/flash.py) | sdpa (blocks gathered,
        # then SDPA)
        self.prefill_attention = "paged"
        # with the kernels: launch them with programmatic dependent launch (Hopper+; the engine
        # decides, llm.pdl): each may start while the one before it finishes
        self.pdl = False
        # with the kernels: a step of at most this many rows runs the layers' bf16/fp16 Linears
        # through kernels.fp8_linear's kernel (unscaled) instead of cuBLAS (0: never; the engine
        # decides, llm.decode_linear), with these tiles per weight shape (N, K) (kernels.linear_tiles)
        self.triton_linear_rows = 0
        self.linear_tiles: dict[tuple[int, int], tuple] = {}
        self._rope_tables: tuple[torch.Tensor, torch.Tensor] | None = None
        self._counters: torch.Tensor | None = None

    def forward(
        self, input_ids: torch.Tensor, inp: AttnInputs, k_pool: torch.Tensor, v_pool: torch.Tensor
    ) -> torch.Tensor:
        """input_ids: [B, Q]; k_pool/v_pool: [layers, NB, BS, KVH, D]. Returns hidden [B, Q, hidden]."""
        if self.use_kernels:
            return self._forward_fused(input_ids, inp, k_pool, v_pool)
        cos, sin = self._rope(inp.positions)
        mask = self._mask(inp, k_pool.shape[2])
        h = self.embed(input_ids)
        for i, layer in enumerate(self.layers):
            h = h + layer.attn(layer.attn_norm(h), cos, sin, inp, mask, k_pool[i], v_pool[i])
            h = h + layer.mlp(layer.mlp_norm(h))
        return self.norm(h)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin [B, Q, 1, D] of each position's angles, in the model's dtype."""
        return rope_cos_sin(positions, self.inv_freq, self.embed.weight.dtype)

    def _mask(self, inp: AttnInputs, block_size: int) -> torch.Tensor:
        """Additive causal mask [B, 1, Q, L] over each row's gathered keys (L = MB * BS), in the
        model's dtype, built once per forward instead of in every layer."""
        return causal_mask(
            inp.positions, inp.block_tables.shape[1] * block_size, self.embed.weight.dtype
        )

    def rope_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [P, D/2] of every position's angles in the model's dtype, for the fused
        kernels (P = max_position, at most ROPE_TABLE_MAX): built once, with the same torch ops as
        :meth:`_rope`, so the kernels rotate by the same numbers without per-step trig kernels."""
        dev, dtype = self.inv_freq.device, self.embed.weight.dtype
        t = self._rope_tables
        if t is None or t[0].device != dev or t[0].dtype != dtype:
            n = min(self.cfg.max_position, ROPE_TABLE_MAX)
            freqs = torch.arange(n, device=dev).float().unsqueeze(-1) * self.inv_freq  # [P, D/2]
            self._rope_tables = (
                freqs.cos().to(dtype).contiguous(),
                freqs.sin().to(dtype).contiguous(),
            )
        return self._rope_tables

    def kernel_counters(self) -> torch.Tensor:
        """The zeroed int32 counters the fused kernels' last-program merges use (one set per
        model: one engine thread launches its steps on one stream)."""
        from voicert.engine.gpu import kernels

        dev = self.inv_freq.device
        if self._counters is None or self._counters.device != dev:
            self._counters = kernels.counters(dev)
        return self._counters

    def _forward_fused(
        self, input_ids: torch.Tensor, inp: AttnInputs, k_pool: torch.Tensor, v_pool: torch.Tensor
    ) -> torch.Tensor:
        """The layer stack through the Triton kernels: each residual add rides in the next
        RMSNorm's launch (``residual`` holds h; ``out`` is the sublayer output not yet added).
        A step launches no per-step setup kernels: RoPE reads the tables, and the paged attention
        reads positions and block tables as they are. Only a prefill step whose attention is
        FlashAttention's or SDPA's (``prefill_attention``) builds their inputs (row lengths, or
        a mask) once per forward."""
        from voicert.engine.gpu import kernels

        cfg = self.cfg
        rope, count = self.rope_tables(), self.kernel_counters()
        wide = None  # a prefill step's attention by FlashAttention or SDPA, built per forward
        group = cfg.num_heads // cfg.num_kv_heads
        if (
            self.prefill_attention != "paged"
            and input_ids.shape[1] * group > kernels.attention.MAX_ATTN_ROWS
        ):
            wide = (
                FlashRows(inp)
                if self.prefill_attention == "flash"
                else SdpaRows(inp, k_pool.shape[2], self.embed.weight.dtype)
            )
        eps, pdl, lin = cfg.rms_norm_eps, self.pdl, self._linear
        out, residual = self.embed(input_ids), None
        rows = input_ids.numel()
        for i, layer in enumerate(self.layers):
            pq, gq = self._planes(layer.attn.qkv, rows)
            x, residual = kernels.add_rms_norm(
                out, residual, layer.attn_norm.weight, eps, pdl, pq, gq
            )
            qkv = lin(layer.attn.qkv, x, pq)
            a = layer.attn.attend_fused(qkv, rope, inp, wide, k_pool[i], v_pool[i], count, pdl)
            pg, gg = self._planes(layer.mlp.gate_up, rows)
            x, residual = kernels.add_rms_norm(
                lin(layer.attn.o, a), residual, layer.mlp_norm.weight, eps, pdl, pg, gg
            )
            pd, gd = self._planes(layer.mlp.down, rows)
            act = self._mlp_act(layer.mlp.gate_up, x, pg, pd, gd)
            out = lin(layer.mlp.down, act, pd)
        return kernels.add_rms_norm(out, residual, self.norm.weight, eps, pdl)[0]

    def _mlp_act(
        self,
        gate_up: nn.Module,
        x: torch.Tensor,
        planes: torch.Tensor | None,
        down_planes: torch.Tensor | None,
        group: int,
    ) -> torch.Tensor:
        """SiLU(gate) * up of the MLP's ``gate_up`` Linear on x [..., hidden] -> [..., I]: by
        :meth:`_linear`'s ``glu`` (in gate_up's own launch where it can) when the down Linear
        takes no planes of x; else gate_up (given its x's ``planes``) then silu_mul, laying out
        ``down_planes`` of ``group``."""
        from voicert.engine.gpu import kernels

        if down_planes is None:
            return self._linear(gate_up, x, planes, glu=True)
        return kernels.silu_mul(self._linear(gate_up, x, planes), self.pdl, down_planes, group)

    def _planes(self, lin: nn.Module, rows: int) -> tuple[torch.Tensor | None, int]:
        """Where a one-row step's INT4 Linear takes the CUDA-core kernel and
        ``kernels.int4_matmul.INT4_PLANES_FUSED`` is set: a buffer for the kernel that writes its
        x to lay x out in too (``kernels.int4_planes``' values, or ``int4_a8_planes``' for a
        layer that rounds x to int8; one launch less), and the group. Else (None, 0)."""
        from voicert.engine.gpu import kernels

        if not (
            kernels.int4_matmul.INT4_PLANES_FUSED and rows == 1 and isinstance(lin, Int4Linear)
        ):
            return None, 0
        k, dev = lin.in_features, lin.weight.device
        if lin.a8 and a8_rounds(1, self.embed.weight.dtype):
            return torch.empty(4, k // 8, dtype=torch.int32, device=dev), lin.group
        if kernels.int4_path(1, lin.out_features, k, lin.group) is not kernels.Int4Path.GEMV:
            return None, 0
        return torch.empty(10, k // 8, dtype=torch.float32, device=dev), lin.group

    def _linear(
        self,
        lin: nn.Module,
        x: torch.Tensor,
        planes: torch.Tensor | None = None,
        glu: bool = False,
    ) -> torch.Tensor:
        """One of the layers' Linears on the fused path: an FP8 or INT4 one (engine/gpu/fp8.py,
        int4.py) is told whether to launch with PDL (an INT4 one given x's ``planes`` if the
        kernel that wrote x laid it out: :meth:`_planes`); a plain ``nn.Linear`` runs through
        cuBLAS, or for a step of at most ``triton_linear_rows`` rows through the FP8 kernel's
        unscaled form. ``glu``: ``lin`` is an MLP's gate_up and the result is SiLU(gate) * up
        [..., I]: in the FP8 kernel's launch where it runs one row by gemv
        (``kernels.fp8_linear``'s ``glu``), else by silu_mul after."""
        from voicert.engine.gpu import kernels

        if isinstance(lin, Int4Linear):
            y = lin(x, pdl=self.pdl, planes=planes)
            return kernels.silu_mul(y, self.pdl) if glu else y
        assert planes is None
        if isinstance(lin, Fp8Linear):
            return lin(x, pdl=self.pdl, glu=glu)
        rows = x.numel() // x.shape[-1]
        if rows > self.triton_linear_rows:
            return kernels.silu_mul(lin(x), self.pdl) if glu else lin(x)
        return kernels.fp8_linear(
            x,
            lin.weight,
            None,
            lin.bias,
            self.kernel_counters(),
            # the tiles are the MMA kernel's, measured at 1-16 rows; one row takes gemv
            None
            if rows <= kernels.fp8_matmul.GEMV_ROWS
            else self.linear_tiles.get(tuple(lin.weight.shape)),
            self.pdl,
            glu=glu,
        )

    def greedy(
        self,
        hidden: torch.Tensor,
        out: torch.Tensor | None = None,
        head_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """hidden [..., hidden] -> the greedy token of each row, int64 [...] (the argmax of
        :meth:`logits`; ties: the lowest id). With the fused kernels one launch picks from the
        LM head's output in place (no float32 copy of the logits); ``out``, if given, receives
        the tokens (a [rows, inner] view, see ``kernels.argmax_rows``). ``head_out``, if given,
        receives the LM head's output (contiguous, [..., vocab] in the model's dtype) so a caller
        can pick again from it under a mask (engine/core/guided.py); the same values either way."""
        head = self._head(hidden, head_out)  # [..., V]
        count = self.kernel_counters() if self.use_kernels else None
        if count is not None and hidden.numel() // hidden.shape[-1] <= count.numel():
            from voicert.engine.gpu import kernels

            return kernels.argmax_rows(head, count, out, self.pdl)
        best = head.float().argmax(-1)  # (more rows than counters: the torch path)
        return best if out is None else out.copy_(best)

    def _head(self, hidden: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        """The LM head's output [..., V] (in ``out`` if given): a one-row step whose Linears
        take the Triton kernels (``triton_linear_rows``) reads an unquantized head through
        ``kernels.gemv`` too (1.13x cuBLAS at Llama-1B's head, docs/benchmarks.md section 59);
        else :func:`lm_head_out`."""
        rows = hidden.numel() // hidden.shape[-1]
        if rows > 1 or not self.triton_linear_rows or not isinstance(self.lm_head, nn.Linear):
            return lm_head_out(self.lm_head, hidden, out)
        from voicert.engine.gpu import kernels

        w = self.lm_head.weight  # [V, H]
        flat = out.view(1, -1) if out is not None else None
        got = kernels.gemv(
            hidden.reshape(1, -1), w, None, None, self.kernel_counters(), pdl=self.pdl, out=flat
        )
        return got.view(*hidden.shape[:-1], w.shape[0])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] -> logits [..., vocab] in float32."""
        return self.lm_head(hidden).float()


def _hf_to_ours(state: dict[str, torch.Tensor], cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    """Rename HF Llama weights and fuse q/k/v and gate/up."""
    out = {
        "embed.weight": state["model.embed_tokens.weight"],
        "norm.weight": state["model.norm.weight"],
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out[f"layers.{i}.attn.qkv.weight"] = state.get(a + "qkv_proj.weight")  # Phi-3: fused
        if out[f"layers.{i}.attn.qkv.weight"] is None:
            out[f"layers.{i}.attn.qkv.weight"] = torch.cat(
                [state[a + "q_proj.weight"], state[a + "k_proj.weight"], state[a + "v_proj.weight"]]
            )
        if cfg.attention_bias:
            out[f"layers.{i}.attn.qkv.bias"] = torch.cat(
                [state[a + "q_proj.bias"], state[a + "k_proj.bias"], state[a + "v_proj.bias"]]
            )
        out[f"layers.{i}.attn.o.weight"] = state[a + "o_proj.weight"]
        if cfg.qk_norm:
            out[f"layers.{i}.attn.q_norm.weight"] = state[a + "q_norm.weight"]
            out[f"layers.{i}.attn.k_norm.weight"] = state[a + "k_norm.weight"]
        gate_up = state.get(p + "mlp.gate_up_proj.weight")  # Phi-3: fused, gate rows first
        out[f"layers.{i}.mlp.gate_up.weight"] = (
            gate_up
            if gate_up is not None
            else torch.cat([state[p + "mlp.gate_proj.weight"], state[p + "mlp.up_proj.weight"]])
        )
        out[f"layers.{i}.mlp.down.weight"] = state[p + "mlp.down_proj.weight"]
        out[f"layers.{i}.attn_norm.weight"] = state[p + "input_layernorm.weight"]
        out[f"layers.{i}.mlp_norm.weight"] = state[p + "post_attention_layernorm.weight"]
    return out


def load_llama(
    model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LlamaModel:
    """Build the model from an HF checkpoint dir (config.json + *.safetensors)."""
    return load_hf(
        model_dir,
        dtype,
        device,
        LlamaConfig.from_hf,
        LlamaModel,
        _hf_to_ours,
        lambda cfg: {"inv_freq": rope_inv_freq(cfg)},
    )


def random_llama(
    cfg: LlamaConfig, dtype: torch.dtype, device: str | torch.device, seed: int = 0
) -> LlamaModel:
    """Random weights of a real architecture, for timing only (label results 'random weights')."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaModel(cfg)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    for n, p in model.named_parameters():
        if n.endswith("norm.weight"):
            torch.nn.init.ones_(p)
    model = model.to(dtype=dtype).eval()
    model.inv_freq = rope_inv_freq(cfg).to(device)  # RoPE angles stay in float32
    return model
