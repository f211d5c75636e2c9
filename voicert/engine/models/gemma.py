"""Gemma 2 and Gemma 3 (text) in plain torch over the paged KV pool: embeddings scaled by
sqrt(hidden), RMSNorm on ``1 + weight``, a norm after each sublayer as well as before, GeGLU (tanh
GELU), attention scaled by ``query_pre_attn_scalar``, some layers attending over a sliding window.
Gemma 2 soft-caps the attention and output logits (tanh); Gemma 3 instead normalises each head's
q and k, and gives its sliding layers a RoPE of their own (a lower base, no scaling). The same interface as :class:`LlamaModel`
(``forward`` / ``greedy`` / ``logits`` / ``cfg``), so the scheduler, runner, prefix cache and the
served CPU trace take it unchanged. It always runs these eager layers (``use_kernels`` is not
read: the fused GPU kernels know no soft-capping)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from voicert.engine.models.layers import AttnInputs, rotate

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
    qk_norm: bool = False  # Gemma 3: each head's q and k normalised (1 + weight) before RoPE
    local_rope_theta: float | None = None  # Gemma 3: the sliding layers' RoPE base
    rope_factor: float = 1.0  # Gemma 3 (4B+): linear RoPE scaling of the full-attention layers

    @classmethod
    def from_hf(cls, cfg: dict) -> "GemmaConfig":
        kind = cfg.get("model_type")
        if kind not in MODEL_TYPES:
            raise ValueError(f"model_type {kind!r} is not a Gemma model this engine runs")
        act = cfg.get("hidden_activation") or cfg.get("hidden_act", "gelu_pytorch_tanh")
        if act != "gelu_pytorch_tanh":
            raise ValueError(f"hidden_activation {act!r} is not supported (gelu_pytorch_tanh)")
        full, local, factor = _rope(cfg)
        layers = cfg["num_hidden_layers"]
        types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                           for i in range(layers)]
        heads = cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"], num_layers=layers, num_heads=heads,
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
            qk_norm=kind == "gemma3_text", local_rope_theta=local, rope_factor=factor)


def _rope(cfg: dict) -> tuple[float, float | None, float]:
    """(full layers' RoPE base, sliding layers' base or None, full layers' linear factor) from
    either spelling: transformers 5's ``rope_parameters`` (one dict, or one per layer type) or
    4's ``rope_theta`` / ``rope_local_base_freq`` / ``rope_scaling``."""
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params:
        full_p, local_p = params["full_attention"], params.get("sliding_attention") or {}
    else:
        full_p = params or {"rope_theta": cfg.get("rope_theta", 10000.0),
                            **(cfg.get("rope_scaling") or {})}
        local_p = ({"rope_theta": cfg["rope_local_base_freq"]}
                   if cfg.get("rope_local_base_freq") else {})
    for p in (full_p, local_p):
        kind = p.get("rope_type", p.get("type", "default"))
        if kind not in ("default", "linear"):
            raise ValueError(f"rope scaling {kind!r} is not supported (default, linear)")
    if local_p.get("rope_type", "default") != "default":
        raise ValueError("rope scaling on the sliding layers is not supported")
    factor = float(full_p.get("factor", 1.0)) if full_p.get("rope_type", full_p.get("type")) \
        == "linear" else 1.0
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


class GemmaAttention(nn.Module):
    def __init__(self, cfg: GemmaConfig) -> None:
        super().__init__()
        self.h, self.kvh, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kvh) * self.d, bias=False)
        self.o = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.scale = cfg.query_pre_attn_scalar ** -0.5
        self.cap = cfg.attn_softcap
        self.qk_norm = cfg.qk_norm
        if self.qk_norm:
            self.q_norm = GemmaNorm(self.d, cfg.rms_norm_eps)
            self.k_norm = GemmaNorm(self.d, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inp: AttnInputs,
                mask: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
        # x: [B, Q, hidden]; mask: [B, 1, Q, L] additive; k_pool/v_pool: [NB, BS, KVH, D]
        b, q_len, _ = x.shape
        h, kvh, d = self.h, self.kvh, self.d
        qkv = self.qkv(x).view(b, q_len, h + 2 * kvh, d)  # [B, Q, H + 2 KVH, D]
        qk = qkv[:, :, : h + kvh]  # [B, Q, H + KVH, D]
        if self.qk_norm:
            qk = torch.cat([self.q_norm(qk[:, :, :h]), self.k_norm(qk[:, :, h:])], dim=2)
        qk = rotate(qk, cos, sin)
        q, k, v = qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kvh:]
        nb, bs = k_pool.shape[:2]
        k_pool.view(nb * bs, kvh, d).index_copy_(0, inp.slots, k.reshape(-1, kvh, d))
        v_pool.view(nb * bs, kvh, d).index_copy_(0, inp.slots, v.reshape(-1, kvh, d))
        mb = inp.block_tables.shape[1]
        table = inp.block_tables.view(-1)
        keys = k_pool.index_select(0, table).view(b, mb * bs, kvh, d).transpose(1, 2)  # [B, KVH, L, D]
        vals = v_pool.index_select(0, table).view(b, mb * bs, kvh, d).transpose(1, 2)
        g = h // kvh
        keys, vals = keys.repeat_interleave(g, dim=1), vals.repeat_interleave(g, dim=1)  # [B, H, L, D]
        scores = torch.matmul(q.transpose(1, 2), keys.transpose(2, 3)) * self.scale  # [B, H, Q, L]
        weights = F.softmax(softcap(scores, self.cap) + mask, dim=-1, dtype=torch.float32)
        out = torch.matmul(weights.to(q.dtype), vals)  # [B, H, Q, D]
        return self.o(out.transpose(1, 2).reshape(b, q_len, h * d))


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
        self.attn_norm, self.attn_post_norm = GemmaNorm(cfg.hidden_size, eps), GemmaNorm(cfg.hidden_size, eps)
        self.mlp_norm, self.mlp_post_norm = GemmaNorm(cfg.hidden_size, eps), GemmaNorm(cfg.hidden_size, eps)
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
        self.use_kernels = False  # (set by the engine on CUDA; these layers stay eager)

    def forward(self, input_ids: torch.Tensor, inp: AttnInputs, k_pool: torch.Tensor,
                v_pool: torch.Tensor) -> torch.Tensor:
        """input_ids: [B, Q]; k_pool/v_pool: [layers, NB, BS, KVH, D]. Returns hidden [B, Q, hidden]."""
        dtype = self.embed.weight.dtype
        rope = self._rope(inp.positions, self.inv_freq, dtype)
        rope_local = (self._rope(inp.positions, self.inv_freq_local, dtype)
                      if self.cfg.local_rope_theta is not None else rope)
        full, window = self._masks(inp, k_pool.shape[2], dtype)
        h = self.embed(input_ids) * torch.tensor(self.cfg.hidden_size ** 0.5, dtype=dtype)
        for i, layer in enumerate(self.layers):
            sliding = self.cfg.sliding[i]
            cos, sin = rope_local if sliding else rope
            a = layer.attn(layer.attn_norm(h), cos, sin, inp, window if sliding else full,
                           k_pool[i], v_pool[i])
            h = h + layer.attn_post_norm(a)
            h = h + layer.mlp_post_norm(layer.mlp(layer.mlp_norm(h)))
        return self.norm(h)

    @staticmethod
    def _rope(positions: torch.Tensor, inv: torch.Tensor,
              dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin [B, Q, 1, D] of each position's angles, in ``dtype``."""
        freqs = positions.unsqueeze(-1).float() * inv  # [B, Q, D/2]
        angles = torch.cat([freqs, freqs], dim=-1).unsqueeze(2)  # [B, Q, 1, D]
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        half = sin.shape[-1] // 2
        return cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)  # rotate_half's sign

    def _masks(self, inp: AttnInputs, block_size: int,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Additive masks [B, 1, Q, L] over each row's gathered keys: causal, and causal within
        the sliding window (a key at most ``sliding_window - 1`` positions before the query)."""
        span = inp.block_tables.shape[1] * block_size
        keys = torch.arange(span, device=inp.positions.device).view(1, 1, -1)  # [1, 1, L]
        pos = inp.positions.unsqueeze(-1)  # [B, Q, 1]
        causal = keys <= pos
        near = causal & (pos - keys < self.cfg.sliding_window)
        zero = torch.zeros((), dtype=dtype, device=keys.device)
        return (zero.masked_fill(~causal.unsqueeze(1), float("-inf")),
                zero.masked_fill(~near.unsqueeze(1), float("-inf")))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] -> soft-capped logits [..., vocab] in float32."""
        return softcap(self.lm_head(hidden).float(), self.cfg.final_softcap)

    def greedy(self, hidden: torch.Tensor, out: torch.Tensor | None = None,
               head_out: torch.Tensor | None = None) -> torch.Tensor:
        """The argmax of :meth:`logits` per row (after the soft cap, as transformers picks: a cap
        can make two logits equal, and then the lower id wins). ``out``/``head_out`` as
        :meth:`LlamaModel.greedy`."""
        head = (self.lm_head(hidden) if head_out is None
                else torch.matmul(hidden, self.lm_head.weight.t(), out=head_out))  # [..., V]
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
    out = {"embed.weight": state["model.embed_tokens.weight"], "norm.weight": state["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out[f"layers.{i}.attn.qkv.weight"] = torch.cat(
            [state[a + "q_proj.weight"], state[a + "k_proj.weight"], state[a + "v_proj.weight"]])
        out[f"layers.{i}.attn.o.weight"] = state[a + "o_proj.weight"]
        if cfg.qk_norm:
            out[f"layers.{i}.attn.q_norm.weight"] = state[a + "q_norm.weight"]
            out[f"layers.{i}.attn.k_norm.weight"] = state[a + "k_norm.weight"]
        out[f"layers.{i}.mlp.gate_up.weight"] = torch.cat(
            [state[p + "mlp.gate_proj.weight"], state[p + "mlp.up_proj.weight"]])
        out[f"layers.{i}.mlp.down.weight"] = state[p + "mlp.down_proj.weight"]
        for ours, theirs in (("attn_norm", "input_layernorm"),
                             ("attn_post_norm", "post_attention_layernorm"),
                             ("mlp_norm", "pre_feedforward_layernorm"),
                             ("mlp_post_norm", "post_feedforward_layernorm")):
            out[f"layers.{i}.{ours}.weight"] = state[p + theirs + ".weight"]
    return out


def load_gemma(model_dir: str | Path, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu") -> GemmaModel:
    """Build the model from an HF checkpoint dir (config.json + *.safetensors)."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    cfg = GemmaConfig.from_hf(json.loads((model_dir / "config.json").read_text()))
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    with torch.device("meta"):
        model = GemmaModel(cfg)
    model.load_state_dict(_hf_to_ours(state, cfg), assign=True, strict=False)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model.inv_freq = inv_freq(cfg)  # the buffers were built on the meta device
    model.inv_freq_local = inv_freq(cfg, local=True)
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"{model_dir}: weights missing for {missing[:3]}")
    model = model.to(device=device, dtype=dtype).eval()
    model.inv_freq = inv_freq(cfg).to(device)  # RoPE angles stay in float32
    model.inv_freq_local = inv_freq(cfg, local=True).to(device)
    return model
