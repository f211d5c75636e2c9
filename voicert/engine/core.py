"""The engine core: continuous batching over a paged, prefix-cached KV pool, greedy decoding with
optional speculation. Synchronous and single-threaded: no threads, no asyncio, no streams.

The caller (an :class:`~voicert.engine.llm_engine.EngineThread`, in the server process or in the
engine process) owns the only thread that touches it: it ``add``s and ``abort``s requests and calls
``step`` while ``has_work``. Every call returns the :class:`~voicert.engine.base.TokenOut` records it
produced (token ids and timestamps, keyed by request id); turning ids into text is the client's job
(:class:`~voicert.engine.detok.IncrementalDetokenizer`). One step is three lines: schedule, run,
postprocess.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from voicert.core.chat import ChatMessage
from voicert.core.llm import EngineLoad, FinishReason, GenerationRequest, StepRecord
from voicert.engine.base import TokenOut
from voicert.engine.draft import DraftModelProposer
from voicert.engine.guided import GuideError, Guides, masked_argmax
from voicert.engine.heads import EMBEDDED_HEADS, DraftHeads, load_heads
from voicert.engine.kv_cache import BlockManager
from voicert.engine.models.layers import KV_DTYPES
from voicert.engine.models.llama import DTYPES, ROPE_TABLE_MAX, LlamaModel
from voicert.engine.models.registry import load_model
from voicert.engine.prompt import PromptBuilder, stop_token_ids
from voicert.engine.runner import ModelRunner, Pending
from voicert.engine.scheduler import Scheduler, SchedulerConfig, Step
from voicert.engine.sequence import Sequence
from voicert.engine.spec_policy import SpecMode, SpecPolicy
from voicert.engine.tools import offered

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EngineConfig:
    device: str = "cpu"
    dtype: str = "float32"
    block_size: int = 16
    num_blocks: int = 0  # 0: sized from kv_memory_gb
    kv_memory_gb: float = 0.0  # KV pool size; 0: 1 GB on the CPU, gpu_memory_fraction of free GPU memory
    gpu_memory_fraction: float = 0.85  # of free GPU memory, after weights, for the KV pool
    max_batch: int = 64
    prefill_token_budget: int = 512
    batch_window_ms: float = 0.0  # an idle engine waits this long for more arrivals
    spec_tokens: int = 0  # drafts per decode step; 0 disables speculation
    spec_policy: str = "adaptive"  # adaptive: per step, where measured faster (spec_policy.py);
    # always: every decode step that can
    draft_model: str = ""  # HF dir / .gguf / embedded of a draft model with the same tokenizer;
    # empty: drafts come from n-gram prompt lookup (or draft heads)
    draft_heads: str = ""  # draft heads (a .safetensors file, or "embedded": the ones shipped for
    # the embedded SmolLM2; "auto": those where they fit the model, else n-gram drafts); with
    # spec_tokens > 0 they propose the drafts
    max_context_tokens: int = 2048
    int8: bool = False  # CPU only: dynamic INT8 Linear layers (faster; not bit-exact with fp32)
    fp8: bool = False  # FP8 (e4m3) layer weights, per-channel scales (engine/fp8.py): half the
    # weight bytes of bf16; GPUs of compute capability 8.9 or newer (on the CPU: a slow reference)
    fp8_rounding: str = "gptq"  # gptq (error feedback against calibration text) | nearest
    kv_cache: str = "model"  # the KV cache's values: model (the model's dtype) | fp8 (e4m3,
    # scale 1, clamped to +-448; compute capability 8.9 or newer) | int8 (a scale per token and
    # KV head): one byte a value (on the CPU: a slow reference); models/layers.py
    cuda_graphs: bool = False  # GPU only: replay captured decode graphs over a batch-size ladder
    prefill_graph_rows: int = 16  # with cuda_graphs: most prompts one graphed prefill step packs
    # (1: graphs for one-prompt prefills only; several prompts then run one eager step)
    own_stream: bool = False  # GPU only: run the engine thread on its own high-priority stream
    fused_kernels: bool = False  # GPU only: the layers through voicert.engine.kernels (Triton)
    prefill_attention: str = "auto"  # with fused_kernels: paged | flash | sdpa | auto
    # (flash where engine/flash.py can run it, else paged)
    pdl: str = "auto"  # with fused_kernels: programmatic dependent launch: on | off | auto (where
    # the GPU has it: compute capability 9.0 or newer)
    decode_linear: str = "auto"  # with fused_kernels: small steps' bf16/fp16 Linears by cublas |
    # triton (kernels.fp8_linear unscaled) | auto (triton where PDL is on)
    torchscript: bool = False  # CPU only: the forward as a frozen TorchScript trace (same bits)
    overlap: bool = True  # with CUDA graphs: decoding (plain, or with draft heads) launches the next
    # step before reading this one's tokens (fed on the GPU); the host's per-step work overlaps it
    models_cache: str = ""  # where a GGUF draft model is converted (the server's models.cache_dir)


class EngineCore:
    """Model, KV pool, scheduler and runner behind three calls. Contract: one thread only; ``add``
    a checked request (:func:`~voicert.engine.base.request_problem`), ``abort`` any id at any time,
    ``step`` while ``has_work()``. A request's records end with one whose ``finish_reason`` is set;
    after that the core holds nothing of it. ``add`` raises for a request it cannot serve (the
    prompt cannot be templated): the caller fails that request alone."""

    def __init__(self, model_dir: str, cfg: EngineConfig, model: LlamaModel | None = None,
                 tokenizer=None, draft: LlamaModel | None = None) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self.cfg = cfg
        t0 = time.perf_counter()
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_dir)
        self.model = model or load_model(model_dir, DTYPES[cfg.dtype], cfg.device)
        if cfg.int8:
            if cfg.device != "cpu":
                raise ValueError("int8 dynamic quantization is a CPU option")
            self.model = torch.ao.quantization.quantize_dynamic(self.model, {torch.nn.Linear},
                                                                dtype=torch.qint8)
            if cfg.spec_tokens > 0:  # one activation scale per tensor: rows change each other
                log.warning("int8 with speculation: a verify step quantizes its rows together, so "
                            "the output is not token-identical to int8 greedy decoding")
        if cfg.fp8:
            self._quantize_fp8()
        if cfg.fused_kernels:
            self.model.use_kernels = self._kernels_usable()
            self.model.prefill_attention = self._prefill_attention()
            self.model.pdl = self._pdl()
            self.model.triton_linear_rows, self.model.linear_tiles = self._decode_linears()
        hf_cfg = AutoConfig.from_pretrained(model_dir) if model is None or tokenizer is None else None
        self.stop_ids = stop_token_ids(self.tokenizer, hf_cfg)
        self.prompts = PromptBuilder(self.tokenizer)
        self.guides = Guides(self.tokenizer, self.model.cfg.vocab_size, self.prompts.call_format)
        num_blocks = cfg.num_blocks or self._pool_blocks()
        self.blocks = BlockManager(num_blocks, cfg.block_size)
        self.heads = self._heads()
        self.runner = ModelRunner(self.model, num_blocks, cfg.block_size, cuda_graphs=cfg.cuda_graphs,
                                  max_batch=cfg.max_batch, max_context=cfg.max_context_tokens,
                                  widths=(1, cfg.spec_tokens + 1) if cfg.spec_tokens else (1,),
                                  prefill_budget=cfg.prefill_token_budget,
                                  prefill_rows=cfg.prefill_graph_rows, heads=self.heads,
                                  torchscript=cfg.torchscript, kv_dtype=self._kv_dtype())
        self.drafter = self._drafter(draft, num_blocks)
        pg = self.runner.prefill_graphs  # pack prefill steps into the captured shapes
        pg = pg if pg is not None and len(pg.batches) > 1 else None
        self.scheduler = Scheduler(self.blocks, SchedulerConfig(
            cfg.max_batch, cfg.prefill_token_budget, cfg.spec_tokens,
            external_drafts=self.drafter is not None, head_drafts=self.heads is not None,
            prefill_batches=tuple(pg.batches) if pg else (),
            prefill_widths=tuple(pg.widths) if pg else ()), self.stop_ids,
            SpecPolicy(cfg.spec_tokens, SpecMode(cfg.spec_policy)))
        log.info("engine: %s on %s/%s, %d KV blocks of %d, loaded in %.1f s", model_dir, cfg.device,
                 cfg.dtype, num_blocks, cfg.block_size, time.perf_counter() - t0)
        self._ahead: tuple[Step, Pending] | None = None  # a decode step launched ahead
        self._read_ns = 0  # when the last step's tokens were read
        self.ahead_steps = 0  # decode steps launched before the previous step's tokens were read
        self.step_records: collections.deque[StepRecord] = collections.deque(maxlen=8192)
        self.guided_steps = 0  # steps with a grammar-guided row, and the host time their masks took
        self.guide_ns = 0

    def _quantize_fp8(self) -> None:
        """Layer weights to FP8 in place (engine/fp8.py); refuses INT8 with it, and GPUs whose
        Triton cannot widen FP8 (compute capability below 8.9)."""
        from voicert.engine.fp8 import calibration_forward, quantize_fp8

        if self.cfg.int8:
            raise ValueError("fp8 and int8 are two quantizations: choose one")
        dev = str(self.cfg.device)
        if dev.startswith("cuda") and torch.cuda.get_device_capability(dev) < (8, 9):
            raise ValueError("fp8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper)")
        rounding = self.cfg.fp8_rounding
        t0 = time.perf_counter()
        calibrate = (calibration_forward(self.model, self.tokenizer, self.cfg.block_size)
                     if rounding == "gptq" else None)
        n = quantize_fp8(self.model, calibrate)
        if dev.startswith("cuda"):
            torch.cuda.empty_cache()  # GPTQ's work memory, before the KV pool is sized
        log.info("engine: %d Linear layers hold FP8 weights (rounded: %s, %.1f s)", n, rounding,
                 time.perf_counter() - t0)

    def _kernels_usable(self) -> bool:
        """Whether the Triton kernels can run this model here (CUDA of compute capability 8.0 or
        newer, Triton importable, a power-of-two head dim); otherwise the torch path runs, and
        the reason is logged."""
        if not str(self.cfg.device).startswith("cuda"):
            raise ValueError("fused_kernels is a GPU option")
        if torch.cuda.get_device_capability(self.cfg.device) < (8, 0):
            log.warning("fused kernels off: they need compute capability 8.0 or newer")
            return False
        d = self.model.cfg.head_dim
        table = min(self.model.cfg.max_position, ROPE_TABLE_MAX)
        if self.cfg.max_context_tokens > table:
            log.warning("fused kernels off: max_context_tokens %d is past their RoPE table (%d)",
                        self.cfg.max_context_tokens, table)
            return False
        if d & (d - 1) or d < 16:
            log.warning("fused kernels off: head_dim %d is not a power of two >= 16", d)
            return False
        try:
            import voicert.engine.kernels  # noqa: F401
        except ImportError as exc:
            log.warning("fused kernels off: %s", exc)
            return False
        return True

    def _prefill_attention(self) -> str:
        """How the fused path's prefill steps attend: ``paged`` (our Triton kernel, over tiles of
        query tokens), ``flash`` (engine/flash.py) or ``sdpa``. ``flash`` where it cannot run is
        an error naming the key; ``auto`` takes flash where it runs, else paged, said once."""
        from voicert.engine import flash

        choice = self.cfg.prefill_attention
        if not self.model.use_kernels:
            return "sdpa"  # the torch path gathers blocks for SDPA whatever was asked
        if choice in ("sdpa", "paged"):
            return choice
        why = flash.unavailable(self.cfg.device, self.model.embed.weight.dtype, self._kv_dtype())
        if why is None:
            return "flash"
        if choice == "flash":
            raise ValueError(f"llm.prefill_attention flash: {why}")
        log.info("prefill attention by the paged Triton kernel: FlashAttention-4 not used (%s)",
                 why)
        return "paged"

    def _pdl(self) -> bool:
        """Whether the fused kernels launch with programmatic dependent launch: ``auto`` where
        the GPU has it (compute capability 9.0 or newer), ``on`` there or an error naming the
        key, ``off`` never."""
        from voicert.engine import kernels

        if not self.model.use_kernels or self.cfg.pdl == "off":
            return False
        if kernels.pdl_supported(self.cfg.device):
            return True
        if self.cfg.pdl == "on":
            raise ValueError(f"llm.pdl on: {self.cfg.device} is not a GPU of compute capability "
                             "9.0 or newer (Hopper)")
        return False

    def _decode_linears(self) -> tuple[int, dict]:
        """(rows, tiles): steps of up to ``rows`` rows run the layers' bf16/fp16 Linears through
        the Triton kernel with ``tiles`` per weight shape (see ``kernels.linear_tiles``); 0 rows:
        cuBLAS always. ``triton``: up to ``kernels.LINEAR_ROWS`` rows. ``auto``, from the H100's
        step times (docs/benchmarks.md section 31): only where PDL is on (launched plainly the
        kernel loses to cuBLAS) and for bf16/fp16 models; up to 16 rows for layers 4096 or more
        wide (Llama-3.1-8B: 1-3 % faster steps at 1-16 rows), else one-row steps only
        (Llama-3.2-1B: 2 % faster at one row, 3-6 % slower at 4-16)."""
        from voicert.engine import kernels

        choice, dtype = self.cfg.decode_linear, self.model.embed.weight.dtype
        if not self.model.use_kernels or choice == "cublas":
            return 0, {}
        rows = kernels.LINEAR_ROWS
        if choice == "auto":
            if not (self.model.pdl and dtype in (torch.bfloat16, torch.float16)):
                return 0, {}
            rows = kernels.LINEAR_ROWS if self.model.cfg.hidden_size >= 4096 else 1
        gpu = torch.cuda.get_device_name(self.cfg.device)
        return rows, kernels.linear_tiles(gpu, dtype)

    def _drafter(self, draft: LlamaModel | None, num_blocks: int) -> DraftModelProposer | None:
        """The draft model, when speculation uses one (loaded by config or handed in)."""
        if self.cfg.spec_tokens <= 0 or (draft is None and not self.cfg.draft_model):
            return None
        if draft is None:
            from voicert.config import ModelsConfig, cache_dir
            from voicert.engine.loader import resolve_llm

            cache = (Path(self.cfg.models_cache) if self.cfg.models_cache
                     else cache_dir(ModelsConfig()))  # the user's cache dir, as the server's default
            path = resolve_llm(self.cfg.draft_model, cache)
            draft = load_model(path, DTYPES[self.cfg.dtype], self.cfg.device)
        if draft.cfg.vocab_size != self.model.cfg.vocab_size:
            raise ValueError(f"draft vocabulary ({draft.cfg.vocab_size}) differs from the target's "
                             f"({self.model.cfg.vocab_size}): it must share the tokenizer")
        return DraftModelProposer(draft, max(num_blocks // 2, 2), self.cfg.block_size,
                                  torchscript=self.cfg.torchscript)

    def _heads(self) -> DraftHeads | None:
        """The draft heads, when speculation uses them (``draft_heads`` and ``spec_tokens`` set)."""
        if self.cfg.spec_tokens <= 0 or not self.cfg.draft_heads:
            return None
        if self.cfg.draft_model:
            raise ValueError("draft_model and draft_heads are alternatives: set one")
        auto = self.cfg.draft_heads == "auto"
        embedded = auto or self.cfg.draft_heads == "embedded"
        path = EMBEDDED_HEADS if embedded else self.cfg.draft_heads
        mcfg = self.model.cfg
        try:
            heads = load_heads(path, mcfg.hidden_size, mcfg.vocab_size, DTYPES[self.cfg.dtype],
                               self.cfg.device)
        except ValueError as exc:
            if not auto:
                raise
            log.info("engine: the embedded draft heads do not fit this model (%s); drafts come "
                     "from n-gram prompt lookup", exc)
            return None
        if self.cfg.spec_tokens > heads.num_heads:
            raise ValueError(f"spec_tokens ({self.cfg.spec_tokens}) is more than the "
                             f"{heads.num_heads} draft heads in {path}")
        return heads

    def _kv_dtype(self) -> torch.dtype:
        return KV_DTYPES.get(self.cfg.kv_cache, DTYPES[self.cfg.dtype])

    def _pool_blocks(self) -> int:
        per_block = ModelRunner.kv_bytes_per_block(self.model, self.cfg.block_size,
                                                   self._kv_dtype())
        if self.cfg.kv_memory_gb > 0:
            budget = self.cfg.kv_memory_gb * (1 << 30)
        elif self.cfg.device.startswith("cuda"):
            free, _ = torch.cuda.mem_get_info()
            budget = free * self.cfg.gpu_memory_fraction
        else:
            budget = 1 << 30
        return max(int(budget // per_block), 2)

    # ------------------------------------------------------------ the three calls

    def add(self, request: GenerationRequest) -> None:
        """Queue a checked request (its prompt templated here unless ``prompt_ids`` is given)."""
        budget = self.cfg.max_context_tokens - request.max_new_tokens
        guide = self.guides.for_request(request)  # raises GuideError for an unusable schema
        tools = offered(request.tools, request.tool_choice)
        prompt = (list(request.prompt_ids) if request.prompt_ids is not None
                  else self.prompts.build(request.messages, budget, tools))
        self.scheduler.add(Sequence(request, prompt, arrival_ns=time.perf_counter_ns(),
                                    guide=guide))

    def abort(self, request_id: str) -> list[TokenOut]:
        """Stop a request and free its state; its final record (``cancelled``), or nothing when the
        core does not hold it (finished, never added)."""
        seq = self.scheduler.cancel(request_id)
        return [] if seq is None else [self._end(seq, FinishReason.CANCELLED)]

    def warmup(self) -> None:
        """Run a short request through the whole path once (blocking; before a thread owns the
        core). Its steps are not counted."""
        self.add(GenerationRequest("warmup", [ChatMessage("user", "Hello")], 4))
        while self.has_work():
            self.step()
        self.drain_steps()

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self._ahead is not None

    def step(self, run_ahead: bool = True) -> list[TokenOut]:
        """One engine step: launch the next step (or take the one launched ahead), launch the one
        after it too when allowed (``run_ahead``: the caller has no arrivals waiting) and the
        scheduler can plan it (plain decoding or draft-head speculation: its inputs are fed on the
        GPU from this step's results), then read this step's tokens while the GPU runs the next.
        Returns the step's records: tokens in order, each finished request's final one."""
        now = time.perf_counter_ns()
        out: list[TokenOut] = []
        began = now  # when this step's work began: here, or for a step launched ahead, when the
        # step before it was read (the GPU ran it meanwhile)
        if self._ahead is not None:
            (step, pending), self._ahead = self._ahead, None
            self.scheduler.bind_ahead(step)
            began = self._read_ns
        else:
            step, failed = self.scheduler.schedule()
            for seq in failed:
                out.append(self._end(seq, FinishReason.ERROR, "prompt does not fit in the KV pool"))
            if step is None:
                return out
            for chunk in step.chunks:
                if not chunk.seq.prefill_start_ns:
                    chunk.seq.prefill_start_ns = now
            if self.drafter is not None and step.kind == "decode":
                self.drafter.propose(step.seqs, step.drafts)
                for seq in step.seqs:
                    if seq.guide is not None:
                        seq.draft = []  # picked under a mask, one token a step
            pending = self.runner.launch(step)
        if run_ahead and self.cfg.overlap and self.runner.graphs is not None:
            nxt = self.scheduler.plan_ahead(step)
            if nxt is not None:
                ahead = self.runner.launch_ahead(nxt, pending)
                self._ahead = (nxt, ahead) if ahead is not None else None
                self.ahead_steps += ahead is not None
        result = pending.result()
        if step.guided:
            t0 = time.perf_counter_ns()
            self._guide_picks(step, pending, result.tokens)
        emitted = self.scheduler.postprocess(step, result.tokens, result.drafts)
        if step.guided:
            self._guide_advance(emitted)
            self.guide_ns += time.perf_counter_ns() - t0
            self.guided_steps += 1
        sampled_ns = time.perf_counter_ns()
        self.scheduler.observe(step, (sampled_ns - began) / 1e9)  # a step's share of the pipeline
        self._read_ns = sampled_ns
        kind = "verify" if step.kind == "decode" and step.drafts else step.kind
        self.step_records.append(StepRecord(kind, len(step.chunks) + len(step.seqs),
                                            (sampled_ns - now) / 1e9))
        for seq, tokens in emitted:
            first = seq.num_generated - len(tokens)
            n_prompt = len(seq.prompt)
            out.extend(TokenOut(seq.id, first + j, tok, sampled_ns, seq.prefill_start_ns, n_prompt)
                       for j, tok in enumerate(tokens))
            if seq.finish_reason is not None:
                out.append(self._end(seq, seq.finish_reason))
        return out

    def _guide_picks(self, step: Step, pending: Pending, tokens: list[list[int]]) -> None:
        """Replace each guided row's greedy token that its grammar refuses by the best one it
        allows (in place; guided rows carry no drafts, so one token per row)."""
        seqs = ([c.seq for c in step.chunks] if step.kind == "prefill" else step.seqs)
        refused = [i for i, seq in enumerate(seqs)
                   if seq.guide is not None and tokens[i] and not seq.guide.allows(tokens[i][0])]
        if refused:  # their logits, their masks: one batch
            best = masked_argmax([seqs[i].guide for i in refused], pending.logits_rows(refused),
                                 self.guides.executor)
            for i, tok in zip(refused, best):
                tokens[i][0] = tok

    def _guide_advance(self, emitted: list[tuple[Sequence, list[int]]]) -> None:
        """Move each guided sequence's grammar past its new token; one whose grammar allows
        nothing more is finished (``stop``) now rather than after one more step."""
        for seq, toks in emitted:
            if seq.guide is None or seq.finish_reason is not None:
                continue
            try:
                for tok in toks:
                    seq.guide.advance(tok)
            except GuideError:  # cannot happen for a token pick() chose; fail the one request
                log.exception("engine: grammar of %s", seq.id)
                self.scheduler.finish(seq, FinishReason.ERROR)
                continue
            if seq.guide.finished:
                self.scheduler.finish(seq, FinishReason.STOP)

    def fail_all(self, error: str) -> list[TokenOut]:
        """End every request the core holds with ``error`` and free its state (after a failed
        step, or when the owning thread is dying)."""
        self._ahead = None
        out = []
        sched = self.scheduler
        for seq in list(sched.running) + list(sched.waiting):
            try:
                sched.cancel(seq.id)
            except Exception:  # the scheduler may be what broke; the requests still end
                log.exception("engine: cancelling %s", seq.id)
            out.append(self._end(seq, FinishReason.ERROR, error))
        return out

    def load(self) -> EngineLoad:
        """A snapshot of the figures other threads may read (take it on the core's thread)."""
        sched, spec = self.scheduler, self.scheduler.spec
        return EngineLoad(len(sched.waiting), len(sched.running), self.blocks.stats.hit_ratio,
                          spec.acceptance_rate, spec.mean_accepted_length, self.blocks.available)

    def drain_steps(self) -> list[StepRecord]:
        """The steps since the last call (for metrics; the most recent 8192 at most)."""
        out = []
        while self.step_records:
            out.append(self.step_records.popleft())
        return out

    def _end(self, seq: Sequence, reason: str, error: str | None = None) -> TokenOut:
        """Free the engine-side state of a finished sequence; its final record."""
        if self.drafter is not None:
            self.drafter.release(seq.id)
        return TokenOut(seq.id, seq.num_generated, -1, time.perf_counter_ns(),
                        seq.prefill_start_ns or 0, len(seq.prompt), reason, error)
