"""The fast engine: continuous batching over a paged, prefix-cached KV pool, greedy decoding with
optional n-gram speculation, on its own thread. Same :class:`~voicert.engine.base.Engine` interface as
the simple engine. One step is three lines: schedule, run, postprocess.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import torch

from voicert.engine.base import (ChatMessage, EndedStream, EngineStats, FinishReason,
                                 GenerationRequest, RequestLedger, StepRecord, TokenEvent,
                                 final_event, refusal)
from voicert.engine.detok import IncrementalDetokenizer
from voicert.engine.draft import DraftModelProposer
from voicert.engine.heads import EMBEDDED_HEADS, DraftHeads, load_heads
from voicert.engine.kv_cache import BlockManager
from voicert.engine.models.llama import DTYPES, ROPE_TABLE_MAX, LlamaModel
from voicert.engine.models.registry import load_model
from voicert.engine.runner import ModelRunner, Pending
from voicert.engine.scheduler import Scheduler, SchedulerConfig, Step
from voicert.engine.sequence import Sequence
from voicert.engine.prompt import PromptBuilder, stop_token_ids
from voicert.engine.stream import TokenStream

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
    draft_model: str = ""  # HF dir / .gguf / embedded of a draft model with the same tokenizer;
    # empty: drafts come from n-gram prompt lookup (or draft heads)
    draft_heads: str = ""  # draft heads (a .safetensors file, or "embedded": the ones shipped for
    # the embedded SmolLM2); with spec_tokens > 0 they propose the drafts
    max_context_tokens: int = 2048
    int8: bool = False  # CPU only: dynamic INT8 Linear layers (faster; not bit-exact with fp32)
    cuda_graphs: bool = False  # GPU only: replay captured decode graphs over a batch-size ladder
    prefill_graph_rows: int = 16  # with cuda_graphs: most prompts one graphed prefill step packs
    # (1: graphs for one-prompt prefills only; several prompts then run one eager step)
    own_stream: bool = False  # GPU only: run the engine thread on its own high-priority stream
    fused_kernels: bool = False  # GPU only: the layers through voicert.engine.kernels (Triton)
    torchscript: bool = False  # CPU only: the forward as a frozen TorchScript trace (same bits)
    overlap: bool = True  # with CUDA graphs: decoding (plain, or with draft heads) launches the next
    # step before reading this one's tokens (fed on the GPU); the host's per-step work overlaps it
    models_cache: str = ""  # where a GGUF draft model is converted (the server's models.cache_dir)


@dataclass(frozen=True, slots=True)
class _Submit:
    request: GenerationRequest
    sink: Any  # a TokenStream, or anything with put_threadsafe(TokenEvent)


@dataclass(frozen=True, slots=True)
class _Cancel:
    request_id: str


@dataclass(frozen=True, slots=True)
class _Stop:
    pass


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """Requests waiting and running, published by the engine thread after each step (readers on
    other threads take this snapshot; they never look into the scheduler)."""

    waiting: int = 0
    running: int = 0
    prefix_hit_ratio: float = 0.0
    spec_acceptance_rate: float = 0.0
    spec_mean_accepted_length: float = 0.0
    kv_blocks_free: int = 0

    def extra(self) -> dict[str, float]:
        return {"prefix_hit_ratio": self.prefix_hit_ratio,
                "spec_acceptance_rate": self.spec_acceptance_rate,
                "spec_mean_accepted_length": self.spec_mean_accepted_length,
                "kv_blocks_free": float(self.kv_blocks_free)}


class LLMEngine:
    """The fast engine on its own thread. ``on_failure`` (set by a supervisor) is called once, on
    the engine thread, if that thread ever dies; every request open then has been failed."""

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
        if cfg.fused_kernels:
            self.model.use_kernels = self._kernels_usable()
        hf_cfg = AutoConfig.from_pretrained(model_dir) if model is None or tokenizer is None else None
        self.stop_ids = stop_token_ids(self.tokenizer, hf_cfg)
        self.prompts = PromptBuilder(self.tokenizer)  # used on the engine thread only
        num_blocks = cfg.num_blocks or self._pool_blocks()
        self.blocks = BlockManager(num_blocks, cfg.block_size)
        self.heads = self._heads()
        self.runner = ModelRunner(self.model, num_blocks, cfg.block_size, cuda_graphs=cfg.cuda_graphs,
                                  max_batch=cfg.max_batch, max_context=cfg.max_context_tokens,
                                  widths=(1, cfg.spec_tokens + 1) if cfg.spec_tokens else (1,),
                                  prefill_budget=cfg.prefill_token_budget,
                                  prefill_rows=cfg.prefill_graph_rows, heads=self.heads,
                                  torchscript=cfg.torchscript)
        self.drafter = self._drafter(draft, num_blocks)
        pg = self.runner.prefill_graphs  # pack prefill steps into the captured shapes
        pg = pg if pg is not None and len(pg.batches) > 1 else None
        self.scheduler = Scheduler(self.blocks, SchedulerConfig(
            cfg.max_batch, cfg.prefill_token_budget, cfg.spec_tokens,
            external_drafts=self.drafter is not None, head_drafts=self.heads is not None,
            prefill_batches=tuple(pg.batches) if pg else (),
            prefill_widths=tuple(pg.widths) if pg else ()), self.stop_ids)
        log.info("engine: %s on %s/%s, %d KV blocks of %d, loaded in %.1f s", model_dir, cfg.device,
                 cfg.dtype, num_blocks, cfg.block_size, time.perf_counter() - t0)
        self._inbox: queue.SimpleQueue[_Submit | _Cancel | _Stop] = queue.SimpleQueue()
        self.load = EngineLoad(kv_blocks_free=self.blocks.available)
        self.failure: str | None = None  # why the engine thread died, if it did
        self.on_failure: Callable[[str], None] | None = None
        self._ahead: tuple[Step, Pending] | None = None  # a decode step launched ahead
        self.ahead_steps = 0  # decode steps launched before the previous step's tokens were read
        self.ledger = RequestLedger()
        self.step_records: collections.deque[StepRecord] = collections.deque(maxlen=8192)
        self._thread = threading.Thread(target=self._loop, name="voicert-engine", daemon=True)
        self._thread.start()

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
        path = EMBEDDED_HEADS if self.cfg.draft_heads == "embedded" else self.cfg.draft_heads
        mcfg = self.model.cfg
        heads = load_heads(path, mcfg.hidden_size, mcfg.vocab_size, DTYPES[self.cfg.dtype],
                           self.cfg.device)
        if self.cfg.spec_tokens > heads.num_heads:
            raise ValueError(f"spec_tokens ({self.cfg.spec_tokens}) is more than the "
                             f"{heads.num_heads} draft heads in {path}")
        return heads

    def _pool_blocks(self) -> int:
        per_block = ModelRunner.kv_bytes_per_block(self.model, self.cfg.block_size,
                                                   DTYPES[self.cfg.dtype])
        if self.cfg.kv_memory_gb > 0:
            budget = self.cfg.kv_memory_gb * (1 << 30)
        elif self.cfg.device.startswith("cuda"):
            free, _ = torch.cuda.mem_get_info()
            budget = free * self.cfg.gpu_memory_fraction
        else:
            budget = 1 << 30
        return max(int(budget // per_block), 2)

    # ------------------------------------------------------------ the Engine interface (event loop)

    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        request.submit_ns = time.perf_counter_ns()
        refused = refusal(request)
        if refused is not None:
            return refused
        if self.failure is not None:
            return EndedStream(final_event(FinishReason.ERROR, f"engine failed: {self.failure}"))
        stream = TokenStream(asyncio.get_running_loop())
        self.admit(request, stream)
        return stream

    def admit(self, request: GenerationRequest, sink, count: bool = True) -> None:
        """Queue a checked request whose events go to ``sink`` (anything with
        ``put_threadsafe(TokenEvent)``; the engine process's per-request sinks). Any thread."""
        self.ledger.opened(request.request_id, count=count)
        self._inbox.put(_Submit(request, sink))

    def cancel(self, request_id: str) -> None:
        self._inbox.put(_Cancel(request_id))

    @property
    def alive(self) -> bool:
        return self.failure is None and self._thread.is_alive()

    def stats(self) -> EngineStats:
        """Counters and the load the engine thread last published (never blocks, never reads the
        scheduler from this thread)."""
        s = self.ledger.snapshot()
        s.extra = self.load.extra()
        return s

    def _publish_load(self) -> None:
        """Engine thread: snapshot the figures other threads may read."""
        sched, spec = self.scheduler, self.scheduler.spec
        self.load = EngineLoad(len(sched.waiting), len(sched.running), self.blocks.stats.hit_ratio,
                               spec.acceptance_rate, spec.mean_accepted_length,
                               self.blocks.available)

    def drain_steps(self) -> list[StepRecord]:
        """The engine steps since the last call (for metrics; the most recent 8192 at most)."""
        out = []
        while self.step_records:
            out.append(self.step_records.popleft())
        return out

    def live_requests(self) -> set[str]:
        return self.ledger.live()

    def close(self) -> None:
        self._inbox.put(_Stop())
        self._thread.join(timeout=10)

    def warmup(self) -> None:
        """Run a short request through the whole path once (blocking)."""
        done = threading.Event()

        class _Sink:
            def put_threadsafe(self, ev: TokenEvent) -> None:
                if ev.finish_reason is not None:
                    done.set()

        req = GenerationRequest("warmup", [ChatMessage("user", "Hello")], 4)
        req.submit_ns = time.perf_counter_ns()
        self.admit(req, _Sink(), count=False)
        done.wait(120)

    # ------------------------------------------------------------ the engine thread

    def _use_own_stream(self) -> None:
        """Put this (engine) thread on a non-blocking CUDA stream of the highest priority. Other GPU
        users in the process (CTranslate2's Whisper) run on blocking streams, which serialise with
        the legacy default stream: off it, the engine's kernels overlap theirs and go first."""
        torch.cuda.synchronize()  # weights and captured graphs were made on other streams
        # a priority below the range maps to the highest one the device has
        self._stream = torch.cuda.Stream(device=self.cfg.device, priority=-100)
        torch.cuda.set_stream(self._stream)

    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # a bug, not a request: fail everything open, tell the supervisor
            log.exception("engine thread died")
            self._die(f"{type(exc).__name__}: {exc}")

    def _serve(self) -> None:
        if self.cfg.own_stream and str(self.cfg.device).startswith("cuda"):
            self._use_own_stream()
        sched = self.scheduler
        while True:
            block = not sched.has_work() and self._ahead is None
            if not self._drain_inbox(block):
                return
            if block and self.cfg.batch_window_ms > 0:  # idle engine: gather a batch
                deadline = time.perf_counter() + self.cfg.batch_window_ms / 1000
                while (left := deadline - time.perf_counter()) > 0:
                    if not self._drain_inbox(True, timeout=left):
                        return
            try:
                self._step()
            except Exception as exc:  # fail the requests in flight, keep serving
                log.exception("engine step failed")
                self._ahead = None
                self._fail_all(f"engine step failed: {exc}")
            self._publish_load()

    def _die(self, why: str) -> None:
        """The engine thread is ending abnormally: every open request ends with an error."""
        self.failure = why
        error = f"engine failed: {why}"
        if self.on_failure is not None:
            self.on_failure(why)  # first, so that whoever hears of a failed request sees it down
        self._fail_all(error)
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Submit):
                self._refuse(item, error)

    def _fail_all(self, error: str) -> None:
        """End every sequence the scheduler holds with ``error`` and free its state."""
        sched = self.scheduler
        for seq in list(sched.running) + list(sched.waiting):
            try:
                sched.cancel(seq.id)
            except Exception:  # the scheduler may be what broke; the requests still end
                log.exception("engine: cancelling %s", seq.id)
            self._end(seq, FinishReason.ERROR, error)

    def _drain_inbox(self, block: bool, timeout: float | None = None) -> bool:
        """Apply queued submits and cancels; False when asked to stop."""
        try:
            item = self._inbox.get(block=block, timeout=timeout)
        except queue.Empty:
            return True
        while True:
            if isinstance(item, _Stop):
                return False
            if isinstance(item, _Submit):
                try:
                    self._admit(item.request, item.sink)
                except Exception as exc:  # this request is unservable; the others go on
                    log.warning("engine: request %s refused: %s", item.request.request_id, exc)
                    self._refuse(item, f"request refused: {type(exc).__name__}: {exc}")
            else:
                seq = self.scheduler.cancel(item.request_id)
                if seq is not None:
                    self._end(seq, FinishReason.CANCELLED)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _refuse(self, item: _Submit, error: str) -> None:
        """End a request that never reached the scheduler."""
        self.ledger.closed(item.request.request_id, FinishReason.ERROR, 0)
        item.sink.put_threadsafe(final_event(FinishReason.ERROR, error))

    def _admit(self, request: GenerationRequest, stream) -> None:
        budget = self.cfg.max_context_tokens - request.max_new_tokens
        prompt = (list(request.prompt_ids) if request.prompt_ids is not None
                  else self.prompts.build(request.messages, budget))
        seq = Sequence(request, prompt, stream=stream, arrival_ns=time.perf_counter_ns(),
                       detok=IncrementalDetokenizer(self.tokenizer))
        self.scheduler.add(seq)

    def _step(self) -> None:
        """One engine step: launch the next step (or take the one launched ahead), launch the one
        after it too when the scheduler allows (plain decoding or draft-head speculation: its
        inputs are fed on the GPU from this step's results), then read this step's tokens and
        hand them out while the GPU runs the next."""
        now = time.perf_counter_ns()
        if self._ahead is not None:
            (step, pending), self._ahead = self._ahead, None
            self.scheduler.bind_ahead(step)
        else:
            step, failed = self.scheduler.schedule()
            for seq in failed:
                self._end(seq, "error", "prompt does not fit in the KV pool")
            if step is None:
                return
            for chunk in step.chunks:
                if not chunk.seq.prefill_start_ns:
                    chunk.seq.prefill_start_ns = now
            if self.drafter is not None and step.kind == "decode":
                self.drafter.propose(step.seqs, self.cfg.spec_tokens)
            pending = self.runner.launch(step)
        if self.cfg.overlap and self.runner.graphs is not None and self._inbox.empty():
            nxt = self.scheduler.plan_ahead(step)
            if nxt is not None:
                ahead = self.runner.launch_ahead(nxt, pending)
                self._ahead = (nxt, ahead) if ahead is not None else None
                self.ahead_steps += ahead is not None
        result = pending.result()
        emitted = self.scheduler.postprocess(step, result.tokens, result.drafts)
        sampled_ns = time.perf_counter_ns()
        self.step_records.append(StepRecord(step.kind, len(step.chunks) + len(step.seqs),
                                            (sampled_ns - now) / 1e9))
        outbox: list = []  # this step's events, handed over in one wake-up per event loop
        for seq, tokens in emitted:
            first = seq.num_generated - len(tokens)
            for j, tok in enumerate(tokens):
                outbox.append((seq.stream, TokenEvent(first + j, tok, seq.detok.push(tok),
                                                      sampled_ns, seq.prefill_start_ns,
                                                      len(seq.prompt))))
            if seq.finish_reason is not None:
                self._end(seq, seq.finish_reason, outbox=outbox)
        TokenStream.post_all(outbox)

    def _end(self, seq: Sequence, reason: str, error: str | None = None,
             outbox: list | None = None) -> None:
        """Free the engine-side state of a finished sequence and announce its end (in ``outbox``
        when given, else at once)."""
        if self.drafter is not None:
            self.drafter.release(seq.id)
        self.ledger.closed(seq.id, reason, seq.num_generated)
        final = TokenEvent(seq.num_generated, -1, "", time.perf_counter_ns(),
                           seq.prefill_start_ns or 0, len(seq.prompt), finish_reason=reason,
                           error=error)
        if outbox is not None:
            outbox.append((seq.stream, final))
        else:
            seq.stream.put_threadsafe(final)
