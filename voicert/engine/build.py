"""Building an engine core from the ``llm`` settings: the one place that decides how a model is
loaded, quantized and run (kernels, attention, launch mode, KV dtype and pool size, draft heads
or a draft model), so that :class:`~voicert.engine.core.engine_core.EngineCore` only steps.

The settings it builds from are ``engine/settings.py``'s :class:`EngineConfig`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import cast

import torch

from voicert.config import ConfigError
from voicert.engine.core.draft import DraftModelProposer
from voicert.engine.core.engine_core import CoreParts, EngineCore
from voicert.engine.core.guided import Guides
from voicert.engine.core.heads import EMBEDDED_HEADS, DraftHeads, load_heads
from voicert.engine.core.kv_cache import BlockManager
from voicert.engine.core.prompt import PromptBuilder, stop_token_ids
from voicert.engine.core.runner import ModelRunner
from voicert.engine.core.scheduler import Scheduler, SchedulerConfig
from voicert.engine.core.spec_policy import SpecMode, SpecPolicy
from voicert.engine.core.turn_head import EMBEDDED_TURN_HEAD, TurnHead, load_turn_head
from voicert.engine.models.base import Model
from voicert.engine.models.layers import KV_DTYPES
from voicert.engine.models.llama import DTYPES, ROPE_TABLE_MAX
from voicert.engine.models.registry import load_model
from voicert.engine.settings import EngineConfig

log = logging.getLogger(__name__)


def build_core(
    model_dir: str,
    cfg: EngineConfig,
    model: Model | None = None,
    tokenizer=None,
    draft: Model | None = None,
) -> EngineCore:
    """An engine core for the checkpoint in ``model_dir`` (or the given ``model`` and
    ``tokenizer``; ``draft``: a draft model for speculation), built as ``cfg`` says. Raises
    ValueError (or ConfigError, naming the key) for settings this machine or model cannot run."""
    from transformers import AutoConfig, AutoTokenizer

    cfg = cfg.on_device()
    t0 = time.perf_counter()
    hf_cfg = AutoConfig.from_pretrained(model_dir) if model is None or tokenizer is None else None
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_dir)
    model = _quantized(
        model or load_model(model_dir, DTYPES[cfg.dtype], cfg.device), tokenizer, cfg, model_dir
    )
    if cfg.fused_kernels:
        _choose_kernels(model, cfg)
    stop_ids = stop_token_ids(tokenizer, hf_cfg)
    prompts = PromptBuilder(tokenizer)
    num_blocks = cfg.num_blocks or pool_blocks(model, cfg)
    heads = _heads(model, cfg)
    runner = ModelRunner(
        model,
        num_blocks,
        cfg.block_size,
        cuda_graphs=cfg.cuda_graphs,
        max_batch=cfg.max_batch,
        max_context=cfg.max_context_tokens,
        widths=(1, cfg.spec_tokens + 1) if cfg.spec_tokens else (1,),
        prefill_budget=cfg.prefill_token_budget,
        prefill_rows=cfg.prefill_graph_rows,
        heads=heads,
        torchscript=cfg.torchscript,
        kv_dtype=kv_dtype(cfg),
    )
    drafter = _drafter(model, draft, num_blocks, cfg)
    blocks = BlockManager(num_blocks, cfg.block_size)
    parts = CoreParts(
        model,
        tokenizer,
        prompts,
        Guides(tokenizer, model.cfg.vocab_size, prompts.call_format),
        blocks,
        runner,
        _scheduler(blocks, runner, stop_ids, cfg, drafter is not None, heads is not None),
        stop_ids,
        heads,
        drafter,
        _turn_head(model, cfg),
    )
    log.info(
        "engine: %s on %s/%s, %d KV blocks of %d, built in %.1f s",
        model_dir,
        cfg.device,
        cfg.dtype,
        num_blocks,
        cfg.block_size,
        time.perf_counter() - t0,
    )
    return EngineCore(cfg, parts)


def _scheduler(
    blocks: BlockManager,
    runner: ModelRunner,
    stop_ids: set[int],
    cfg: EngineConfig,
    external_drafts: bool,
    head_drafts: bool,
) -> Scheduler:
    pg = runner.prefill_graphs  # pack prefill steps into the captured shapes
    pg = pg if pg is not None and len(pg.batches) > 1 else None
    return Scheduler(
        blocks,
        SchedulerConfig(
            cfg.max_batch,
            cfg.prefill_token_budget,
            cfg.spec_tokens,
            external_drafts=external_drafts,
            head_drafts=head_drafts,
            prefill_batches=tuple(pg.batches) if pg else (),
            prefill_widths=tuple(pg.widths) if pg else (),
            long_prompt_skips=cfg.long_prompt_skips,
            long_prompt_chunk=cfg.long_prompt_chunk,
        ),
        stop_ids,
        SpecPolicy(cfg.spec_tokens, SpecMode(cfg.spec_policy)),
    )


def _quantized(model: Model, tokenizer, cfg: EngineConfig, model_dir: str = "") -> Model:
    """The model (from ``model_dir``) with its layer weights as ``llm.int8`` / ``llm.fp8`` /
    ``llm.int4`` say (in place for FP8 and INT4)."""
    if cfg.int8:
        if cfg.device != "cpu":
            raise ValueError("int8 dynamic quantization is a CPU option")
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
        if cfg.spec_tokens > 0:  # one activation scale per tensor: rows change each other
            log.warning(
                "int8 with speculation: a verify step quantizes its rows together, so "
                "the output is not token-identical to int8 greedy decoding"
            )
    if cfg.fp8 or cfg.int4:
        _quantize_weights(model, tokenizer, cfg, model_dir)
    return model


def _quantize_weights(model: Model, tokenizer, cfg: EngineConfig, model_dir: str = "") -> None:
    """Layer weights to FP8 (engine/gpu/fp8.py) or INT4 (engine/gpu/int4.py) in place: for INT4
    from a GGUF file (``llm.int4_gguf``), its 4-bit layers first as the file holds them
    (engine/gpu/gguf.py), the rest rounded. Refuses INT8 with either, and for FP8 GPUs whose
    Triton cannot widen it (compute capability below 8.9)."""
    from voicert.engine.core.calibration import calibration_forward
    from voicert.engine.gpu.fp8 import quantize_fp8
    from voicert.engine.gpu.int4 import quantize_int4
    from voicert.engine.loader import gguf_source

    if cfg.int8:
        raise ValueError("fp8 / int4 and int8 are two quantizations: choose one")
    dev = str(cfg.device)
    if cfg.fp8 and not _fp8_capable(dev):
        raise ValueError("fp8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper)")
    t0 = time.perf_counter()
    module = cast(torch.nn.Module, model)  # every architecture is an nn.Module
    calibrate = (
        calibration_forward(model, tokenizer, cfg.block_size) if cfg.rounding == "gptq" else None
    )
    source = gguf_source(model_dir) if cfg.int4 and cfg.int4_gguf and model_dir else None
    if source is not None:
        done = _from_gguf(module, source, calibrate, cfg)
    elif cfg.int4:
        n = quantize_int4(module, calibrate, group=cfg.int4_group, head=cfg.quant_head)
        done = [f"{n} INT4 (groups of {cfg.int4_group})"]
    else:
        done = [f"{quantize_fp8(module, calibrate, head=cfg.quant_head)} FP8"]
    done += _activations(module, cfg)
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()  # GPTQ's work memory, before the KV pool is sized
    head = ""
    if cfg.quant_head:  # (quantize_head leaves a head no INT4 group fits as it was)
        kept = isinstance(module.lm_head, torch.nn.Linear)
        head = (
            "; the LM head kept: no group fits its width" if kept else "; the LM head's to nearest"
        )
    log.info(
        "engine: Linear layers: %s (rounded: %s%s, %.1f s)",
        "; ".join(done),
        cfg.rounding,
        head,
        time.perf_counter() - t0,
    )


def _activations(module: torch.nn.Module, cfg: EngineConfig) -> list[str]:
    """``llm.int4_activations`` and ``llm.fp8_activations`` on the quantized layers; what was
    changed from the layers' defaults, for the start-up line. Warns where speculation then is
    not token-identical to greedy decoding."""
    from voicert.engine.gpu import fp8, int4

    done = []
    if cfg.int4_activations == "int8":
        n = int4.set_activations(module, True)
        done.append(f"{n} of them rounding a one-row x to int8 (W4A8)")
    if cfg.fp8_activations == "model" and (n := fp8.set_activations(module, False)):
        done.append(f"{n} FP8 keeping x in the model's dtype (W8A16)")
    kinds = _rounding_by_rows(module)
    if kinds and cfg.spec_tokens > 0:
        log.warning(
            "%s with speculation: a verify step's rows and a one-stream step's row are rounded "
            "differently (kernels.fp8_mm, int4_gemv_a8), so replies are not token-identical "
            "to greedy decoding in bf16 / fp16",
            " and ".join(f"{n} {kind}" for kind, n in kinds.items()),
        )
    return done


def _rounding_by_rows(module: torch.nn.Module) -> dict[str, int]:
    """The quantized layers of ``module`` whose x is rounded by how many rows share a step, by
    kind: FP8 layers rounding several rows to FP8 and INT4 layers rounding one row to int8 (both
    GPU options). A bf16 / fp16 reply then depends on which rows share its steps."""
    from voicert.engine.gpu.fp8 import Fp8Linear
    from voicert.engine.gpu.int4 import Int4Linear

    fp8 = sum(isinstance(m, Fp8Linear) and m.round_rows for m in module.modules())
    a8 = sum(isinstance(m, Int4Linear) and m.a8 for m in module.modules())
    kinds = {"FP8 layers (W8A8)": fp8, "INT4 layers (W4A8)": a8}
    return {kind: n for kind, n in kinds.items() if n}


def _fp8_capable(dev: str) -> bool:
    """Whether FP8 weights can run on ``dev``: the CPU (widened), or a GPU of compute
    capability 8.9 or newer."""
    return not dev.startswith("cuda") or torch.cuda.get_device_capability(dev) >= (8, 9)


def _from_gguf(module: torch.nn.Module, source: Path, calibrate, cfg: EngineConfig) -> list[str]:
    """``llm.int4`` on a checkpoint converted from the GGUF file ``source``: its 4-bit layers as
    the file holds them, the rest FP8 where it runs (engine/gpu/gguf.py); what was done."""
    from voicert.engine.gpu import gguf

    fp8_rest = _fp8_capable(str(cfg.device))
    try:
        return gguf.quantize_from_gguf(
            module, gguf.GgufFile(source), calibrate, fp8_rest, cfg.int4_group, cfg.quant_head
        )
    except ValueError as e:
        raise ConfigError(f"llm.int4_gguf: {e} (set it to false to round every layer)") from None


def _choose_kernels(model: Model, cfg: EngineConfig) -> None:
    """The Model's kernel settings (models/base.py), chosen once before the first step."""
    model.use_kernels = _kernels_usable(model, cfg)
    model.prefill_attention = _prefill_attention(model, cfg)
    model.pdl = _pdl(model, cfg)
    model.triton_linear_rows, model.linear_tiles = _decode_linears(model, cfg)


def _kernels_usable(model: Model, cfg: EngineConfig) -> bool:
    """Whether the Triton kernels can run this model here (CUDA of compute capability 8.0 or
    newer, Triton importable, a power-of-two head dim); otherwise the torch path runs, and
    the reason is logged."""
    if not str(cfg.device).startswith("cuda"):
        raise ValueError("fused_kernels is a GPU option")
    if torch.cuda.get_device_capability(cfg.device) < (8, 0):
        log.warning("fused kernels off: they need compute capability 8.0 or newer")
        return False
    d = model.cfg.head_dim
    table = min(model.cfg.max_position, ROPE_TABLE_MAX)
    if cfg.max_context_tokens > table:
        log.warning(
            "fused kernels off: max_context_tokens %d is past their RoPE table (%d)",
            cfg.max_context_tokens,
            table,
        )
        return False
    if d & (d - 1) or d < 16:
        log.warning("fused kernels off: head_dim %d is not a power of two >= 16", d)
        return False
    try:
        import voicert.engine.gpu.kernels  # noqa: F401
    except ImportError as exc:
        log.warning("fused kernels off: %s", exc)
        return False
    return True


def _prefill_attention(model: Model, cfg: EngineConfig) -> str:
    """How the fused path's prefill steps attend: ``paged`` (our Triton kernel, over tiles of
    query tokens), ``flash`` (engine/models/flash.py) or ``sdpa``. ``flash`` where it cannot run is
    an error naming the key; ``auto`` takes flash where it runs, else paged, said once."""
    from voicert.engine.models import flash

    choice = cfg.prefill_attention
    if not model.use_kernels:
        return "sdpa"  # the torch path gathers blocks for SDPA whatever was asked
    if choice in ("sdpa", "paged"):
        return choice
    why = flash.unavailable(cfg.device, _weight_dtype(model), kv_dtype(cfg))
    if why is None:
        return "flash"
    if choice == "flash":
        raise ValueError(f"llm.prefill_attention flash: {why}")
    log.info("prefill attention by the paged Triton kernel: FlashAttention-4 not used (%s)", why)
    return "paged"


def _pdl(model: Model, cfg: EngineConfig) -> bool:
    """Whether the fused kernels launch with programmatic dependent launch: ``auto`` where
    the GPU has it (compute capability 9.0 or newer), ``on`` there or an error naming the
    key, ``off`` never."""
    from voicert.engine.gpu import kernels

    if not model.use_kernels or cfg.pdl == "off":
        return False
    if kernels.pdl_supported(cfg.device):
        return True
    if cfg.pdl == "on":
        raise ValueError(
            f"llm.pdl on: {cfg.device} is not a GPU of compute capability 9.0 or newer (Hopper)"
        )
    return False


def _decode_linears(model: Model, cfg: EngineConfig) -> tuple[int, dict]:
    """(rows, tiles): steps of up to ``rows`` rows run the layers' bf16/fp16 Linears through
    the Triton kernel with ``tiles`` per weight shape (see ``kernels.linear_tiles``); 0 rows:
    cuBLAS always. ``triton``: up to ``kernels.fp8_matmul.LINEAR_ROWS`` rows. ``auto``, from
    the H100's step times (docs/benchmarks.md section 31): only where PDL is on (launched
    plainly the kernel loses to cuBLAS) and for bf16/fp16 models; up to 16 rows for layers 4096
    or more wide (Llama-3.1-8B: 1-3 % faster steps at 1-16 rows), else one-row steps only
    (Llama-3.2-1B: 2 % faster at one row, 3-6 % slower at 4-16)."""
    from voicert.engine.gpu import kernels

    choice, dtype = cfg.decode_linear, _weight_dtype(model)
    if not model.use_kernels or choice == "cublas":
        return 0, {}
    rows = kernels.fp8_matmul.LINEAR_ROWS
    if choice == "auto":
        if not (model.pdl and dtype in (torch.bfloat16, torch.float16)):
            return 0, {}
        rows = kernels.fp8_matmul.LINEAR_ROWS if model.cfg.hidden_size >= 4096 else 1
    gpu = torch.cuda.get_device_name(cfg.device)
    return rows, kernels.linear_tiles(gpu, dtype)


def _weight_dtype(model: Model) -> torch.dtype:
    return model.embed.weight.dtype  # type: ignore[attr-defined]  # every architecture embeds


def _drafter(
    model: Model, draft: Model | None, num_blocks: int, cfg: EngineConfig
) -> DraftModelProposer | None:
    """The draft model, when speculation uses one (loaded by config or handed in)."""
    if cfg.spec_tokens <= 0 or (draft is None and not cfg.draft_model):
        return None
    if draft is None:
        from voicert.config import ModelsConfig, cache_dir
        from voicert.engine.loader import resolve_llm

        cache = (
            Path(cfg.models_cache) if cfg.models_cache else cache_dir(ModelsConfig())
        )  # the user's cache dir, as the server's default
        path = resolve_llm(cfg.draft_model, cache)
        draft = load_model(path, DTYPES[cfg.dtype], cfg.device)
    if draft.cfg.vocab_size != model.cfg.vocab_size:
        raise ValueError(
            f"draft vocabulary ({draft.cfg.vocab_size}) differs from the target's "
            f"({model.cfg.vocab_size}): it must share the tokenizer"
        )
    return DraftModelProposer(
        draft, max(num_blocks // 2, 2), cfg.block_size, torchscript=cfg.torchscript
    )


def _heads(model: Model, cfg: EngineConfig) -> DraftHeads | None:
    """The draft heads, when speculation uses them (``draft_heads`` and ``spec_tokens`` set)."""
    if cfg.spec_tokens <= 0 or not cfg.draft_heads:
        return None
    if cfg.draft_model:
        raise ValueError("draft_model and draft_heads are alternatives: set one")
    auto = cfg.draft_heads == "auto"
    embedded = auto or cfg.draft_heads == "embedded"
    path = EMBEDDED_HEADS if embedded else cfg.draft_heads
    mcfg = model.cfg
    try:
        heads = load_heads(path, mcfg.hidden_size, mcfg.vocab_size, DTYPES[cfg.dtype], cfg.device)
    except ValueError as exc:
        if not auto:
            raise
        log.info(
            "engine: the embedded draft heads do not fit this model (%s); drafts come "
            "from n-gram prompt lookup",
            exc,
        )
        return None
    if cfg.spec_tokens > heads.num_heads:
        raise ValueError(
            f"spec_tokens ({cfg.spec_tokens}) is more than the "
            f"{heads.num_heads} draft heads in {path}"
        )
    return heads


def _turn_head(model: Model, cfg: EngineConfig) -> TurnHead | None:
    """The end-of-turn head ``turn_head`` names (auto: the embedded one where it fits)."""
    if cfg.turn_head == "none":
        return None
    auto = cfg.turn_head == "auto"
    path = EMBEDDED_TURN_HEAD if auto else Path(cfg.turn_head)
    if not path.is_file():
        if auto:
            log.info("engine: no end-of-turn head shipped (%s); zero-shot scores only", path)
            return None
        raise ConfigError(f"config llm.turn_head: no such file: {path}")
    try:
        return load_turn_head(path, cast(torch.Tensor, model.norm.weight))
    except ValueError as exc:
        if not auto:
            raise ConfigError(f"config llm.turn_head: {exc}") from exc
        log.info("engine: no end-of-turn head for this model (%s); zero-shot scores only", exc)
        return None


def kv_dtype(cfg: EngineConfig) -> torch.dtype:
    """The KV cache's element type (``llm.kv_cache``: the model's dtype, or one byte)."""
    return KV_DTYPES.get(cfg.kv_cache, DTYPES[cfg.dtype])


def pool_blocks(model: Model, cfg: EngineConfig) -> int:
    """KV blocks the pool gets: ``kv_memory_gb``, else a share of free GPU memory, else 1 GB."""
    per_block = ModelRunner.kv_bytes_per_block(model, cfg.block_size, kv_dtype(cfg))
    if cfg.kv_memory_gb > 0:
        budget = cfg.kv_memory_gb * (1 << 30)
    elif cfg.device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        budget = free * cfg.gpu_memory_fraction
    else:
        budget = 1 << 30
    return max(int(budget // per_block), 2)
