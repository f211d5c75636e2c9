"""Gemma 2 and Gemma 3 (text) in plain torch over the paged KV pool: embeddings scaled by
sqrt(hidden), RMSNorm on ``1 + weight``, a norm after each sublayer as well as before, GeGLU (tanh
GELU), attention scaled by ``query_pre_attn_scalar``, some layers attending over a sliding window.
Gemma 2 soft-caps the attention and output logits (tanh); Gemma 3 instead normalises each head's
q and k, and gives its sliding layers a RoPE of their own (a lower base, no scaling). The same interface as :class:`LlamaModel`
(``models/base.py``'s Model), so the scheduler, runner, prefix cache and the
served CPU trace take it unchanged. It always runs these eager layers (``use_kernels`` is not
read: the fused GPU kernels know no soft-capping)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from voicert.engine.models.layers import Attention, AttnInputs, lm_head_out, load_hf, rope_cos_sin

MODEL_TYPES = ("gemma2", "gemma3_text")


@dataclass(frozen=True, slots=True)
class GemmaConfig:
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
    query_pre_attn_scalar: float
    attn_softcap: float | None  # attention logits -> tanh(x / c) * c; None: none
    final_softcap: float | None  # output logits likewise
    sliding_window: int  # keys a sliding layer sees: the query's own and the window - 1 before it
    sliding: tuple[bool, ...]  # per layer: sliding-window attention (else the whole context)
    tie_word_embeddings: bool = True
    attention_bias: bool = False  # (the shared Attention's q/k/v projection: no biases in Gemma)
    qk_norm: bool = False  # Gemma 3: each head's q and k normalised (1 + weight) before RoPE
    local_rope_theta: float | None = None  # Gemma 3: the sliding layers' RoPE base
    rope_factor: float = 1.0  # Gemma 3 (4B+): linear RoPE scaling of the full-attention layers

    @classmethod
    def from_hf(cls, cfg: dict) -> GemmaConfig:
        kind = cfg.get("model_type")
        if kind not in MODEL_TYPES:
            raise ValueError(f"model_type {kind!r} is not a Gemma model this engine runs")
        act = cfg.get("hidden_activation") or cfg.get("hidden_act", "gelu_pytorch_tanh")
        if act != "gelu_pytorch_tanh":
            raise ValueError(f"hidden_activation {act!r} is not supported (gelu_pytorch_tanh)")
        full, local, factor = _rope(cfg)
        layers = cfg["num_hidden_layers"]
        types = cfg.get("layer_types") or [
            "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)
        ]
        heads = cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=full,
            max_position=cfg.get("max_position_embeddings", 8192),
            query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", 256)),
            attn_softcap=cfg.get("attn_logit_softcapping"),
            final_softcap=cfg.get("final_logit_softcapping"),
            sliding_window=cfg.get("sliding_window") or 4096,
            sliding=tuple(t == "sliding_attention" for t in types),
            tie_word_embeddings=cfg.get("tie_word_embeddings", True),
            qk_norm=kind == "gemma3_text",
            local_rope_theta=local,
            rope_factor=factor,
        )


def _rope(cfg: dict) -> tuple[float, float | None, float]:
    """(full layers' RoPE base, sliding layers' base or None, full layers' linear factor) from
    either spelling: transformers 5's ``rope_parameters`` (one dict, or one per layer type) or
    4's ``rope_theta`` / ``rope_local_base_freq`` / ``rope_scaling``."""
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params:
        full_p, local_p = params["full_attention"], params.get("sliding_attention") or {}
    else:
        full_p = params or {
            "rope_theta": cfg.get("rope_theta", 10000.0),
            **(cfg.get("rope_scaling") or {}),
        }
        local_p = (
            {"rope_theta": cfg["rope_local_base_freq"]} if cfg.get("rope_local_base_freq") else {}
        )
    for p in (full_p, local_p):
        kind = p.get("rope_type", p.get("type", "default"))
        if kind not in ("default", "linear"):
            raise ValueError(f"rope scaling {kind!r} is not supported (default, linear)")
    if local_p.get("rope_type", "default") != "default":
        raise ValueError("rope scaling on the sliding layers is not supported")
    factor = (
        float(full_p.get("factor", 1.0))
        if full_p.get("rope_type", full_p.get("type")) == "linear"
        else 1.0
    )
    local = float(local_p["rope_theta"]) if "rope_theta" in local_p else None
    return float(full_p.get("rope_theta", 10000.0)), local, factor


class GemmaNorm(nn.Module):
    """RMSNorm on ``1 + weight``, computed in float32 and cast back after the scale (HF's order)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


def softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if cap is None else torch.tanh(x / cap) * cap


class GemmaAttention(Attention):
    """The shared projection, q/k norms (Gemma's), RoPE and KV write; attention of its own:
    scores scaled by ``query_pre_attn_scalar`` and soft-capped before the mask and softmax."""

    def __init__(self, cfg: GemmaConfig) -> None:
        super().__init__(cfg, norm=GemmaNorm)
        self.scale = cfg.query_pre_attn_scalar**-0.5
        self.cap = cfg.attn_softcap

    def attend(
        self,
        q: torch.Tensor,
        inp: AttnInputs,
        mask: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
    ) -> torch.Tensor:
        """q [B, Q, H, D]; mask [B, 1, Q, L] additive -> [B, Q, H * D]."""
        b, q_len = q.shape[:2]
        keys, vals = self.gather(inp, k_pool, v_pool, q.dtype)  # [B, KVH, L, D]
        g = self.h // self.kvh
        keys, vals = (
            keys.repeat_interleave(g, dim=1),
            vals.repeat_interleave(g, dim=1),
        )  # [B, H, L, D]
        scores = torch.matmul(q.transpose(1, 2), keys.transpose(2, 3)) * self.scale  # [B, H, Q, L]
        weights = F.softmax(softcap(scores, self.cap) + mask, dim=-1, dtype=torch.float32)
        out = torch.matmul(weights.to(q.dtype), vals)  # [B, H, Q, D]
        return out.transpose(1, 2).reshape(b, q_len, self.h * self.d)


class GemmaMLP(nn.Module):
    def __init__(self, cfg: GemmaConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.gelu(gate, approximate="tanh") * up)


class GemmaBlock(nn.Module):
    def __init__(self, cfg: GemmaConfig) -> None:
        super().__init__()
        eps = cfg.rms_norm_eps
        self.attn_norm, self.attn_post_norm = (
            GemmaNorm(cfg.hidden_size, eps),
            GemmaNorm(cfg.hidden_size, eps),
        )
        self.mlp_norm, self.mlp_post_norm = (
            GemmaNorm(cfg.hidden_size, eps),
            GemmaNorm(cfg.hidden_size, eps),
        )
        self.attn = GemmaAttention(cfg)
        self.mlp = GemmaMLP(cfg)


class GemmaModel(nn.Module):
    def __init__(self, cfg: GemmaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GemmaBlock(cfg) for _ in range(cfg.num_layers))
        self.norm = GemmaNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.register_buffer("inv_freq", inv_freq(cfg), persistent=False)
        self.register_buffer("inv_freq_local", inv_freq(cfg, local=True), persistent=False)
        # the kernel settings of the Model interface (models/base.py): set by the engine on CUDA,
        # never read here (these layers stay eager)
        self.use_kernels = False
        self.prefill_attention = "sdpa"
        self.pdl = False
        self.triton_linear_rows = 0
        self.linear_tiles: dict[tuple[int, int], tuple] = {}

    def forward(
        self, input_ids: torch.Tensor, inp: AttnInputs, k_pool: torch.Tensor, v_pool: torch.Tensor
    ) -> torch.Tensor:
        """input_ids: [B, Q]; k_pool/v_pool: [layers, NB, BS, KVH, D]. Returns hidden [B, Q, hidden]."""
        dtype = self.embed.weight.dtype
        rope = rope_cos_sin(inp.positions, self.inv_freq, dtype)
        rope_local = (
            rope_cos_sin(inp.positions, self.inv_freq_local, dtype)
            if self.cfg.local_rope_theta is not None
            else rope
        )
        full, window = self._masks(inp, k_pool.shape[2], dtype)
        h = self.embed(input_ids) * torch.tensor(self.cfg.hidden_size**0.5, dtype=dtype)
        for i, layer in enumerate(self.layers):
            sliding = self.cfg.sliding[i]
            cos, sin = rope_local if sliding else rope
            a = layer.attn(
                layer.attn_norm(h), cos, sin, inp, window if sliding else full, k_pool[i], v_pool[i]
            )
            h = h + layer.attn_post_norm(a)
            h = h + layer.mlp_post_norm(layer.mlp(layer.mlp_norm(h)))
        return self.norm(h)

    def _masks(
        self, inp: AttnInputs, block_size: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Additive masks [B, 1, Q, L] over each row's gathered keys: causal, and causal within
        the sliding window (a key at most ``sliding_window - 1`` positions before the query)."""
        span = inp.block_tables.shape[1] * block_size
        keys = torch.arange(span, device=inp.positions.device).view(1, 1, -1)  # [1, 1, L]
        pos = inp.positions.unsqueeze(-1)  # [B, Q, 1]
        causal = keys <= pos
        near = causal & (pos - keys < self.cfg.sliding_window)
        zero = torch.zeros((), dtype=dtype, device=keys.device)
        return (
            zero.masked_fill(~causal.unsqueeze(1), float("-inf")),
            zero.masked_fill(~near.unsqueeze(1), float("-inf")),
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] -> soft-capped logits [..., vocab] in float32."""
        return softcap(self.lm_head(hidden).float(), self.cfg.final_softcap)

    def greedy(
        self,
        hidden: torch.Tensor,
        out: torch.Tensor | None = None,
        head_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The argmax of :meth:`logits` per row (after the soft cap, as transformers picks: a cap
        can make two logits equal, and then the lower id wins). ``out``/``head_out`` as
        :meth:`LlamaModel.greedy`."""
        head = lm_head_out(self.lm_head, hidden, head_out)  # [..., V]
        best = softcap(head.float(), self.cfg.final_softcap).argmax(-1)
        return best if out is None else out.copy_(best)


def inv_freq(cfg: GemmaConfig, local: bool = False) -> torch.Tensor:
    """[D/2] RoPE inverse frequencies (float32): the full layers' (linearly scaled), or with
    ``local`` the sliding layers' (Gemma 3; else the same)."""
    d = cfg.head_dim
    theta = cfg.local_rope_theta if local and cfg.local_rope_theta is not None else cfg.rope_theta
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    return (inv if local else inv / cfg.rope_factor).float()


def _hf_to_ours(state: dict[str, torch.Tensor], cfg: GemmaConfig) -> dict[str, torch.Tensor]:
    out = {
        "embed.weight": state["model.embed_tokens.weight"],
        "norm.weight": state["model.norm.weight"],
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out[f"layers.{i}.attn.qkv.weight"] = torch.cat(
            [state[a + "q_proj.weight"], state[a + "k_proj.weight"], state[a + "v_proj.weight"]]
        )
        out[f"layers.{i}.attn.o.weight"] = state[a + "o_proj.weight"]
        if cfg.qk_norm:
            out[f"layers.{i}.attn.q_norm.weight"] = state[a + "q_norm.weight"]
            out[f"layers.{i}.attn.k_norm.weight"] = state[a + "k_norm.weight"]
        out[f"layers.{i}.mlp.gate_up.weight"] = torch.cat(
            [state[p + "mlp.gate_proj.weight"], state[p + "mlp.up_proj.weight"]]
        )
        out[f"layers.{i}.mlp.down.weight"] = state[p + "mlp.down_proj.weight"]
        for ours, theirs in (
            ("attn_norm", "input_layernorm"),
            ("attn_post_norm", "post_attention_layernorm"),
            ("mlp_norm", "pre_feedforward_layernorm"),
            ("mlp_post_norm", "post_feedforward_layernorm"),
        ):
            out[f"layers.{i}.{ours}.weight"] = state[p + theirs + ".weight"]
    return out


def load_gemma(
    model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> GemmaModel:
    """Build the model from an HF checkpoint dir (config.json + *.safetensors)."""
    return load_hf(
        model_dir,
        dtype,
        device,
        GemmaConfig.from_hf,
        GemmaModel,
        _hf_to_ours,
        lambda cfg: {"inv_freq": inv_freq(cfg), "inv_freq_local": inv_freq(cfg, local=True)},
    )
