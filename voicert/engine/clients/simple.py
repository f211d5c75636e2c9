"""A simple, correct engine: a transformers causal LM, greedy decoding, one request at a time on its
own thread. It is the baseline the fast engine replaces behind the same :class:`Engine` interface."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import torch

from voicert.config import LlmConfig
from voicert.core.chat import ChatMessage
from voicert.core.llm import (
    EngineBase,
    EngineStats,
    GenerationRequest,
    TokenEvent,
    refusal,
    unscored,
)
from voicert.engine.base import RequestLedger
from voicert.engine.clients.detok import IncrementalDetokenizer
from voicert.engine.clients.stream import TokenStream
from voicert.engine.core.guided import Guides
from voicert.engine.core.prompt import PromptBuilder, build_prompt, stop_token_ids
from voicert.engine.core.tools import offered
from voicert.engine.models.llama import DTYPES

log = logging.getLogger(__name__)


class SimpleEngine(EngineBase):
    """transformers model + greedy decoding on one worker thread, requests served FIFO."""

    def __init__(self, model_dir: str, cfg: LlmConfig) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        t0 = time.perf_counter()
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[cfg.dtype])
        self.model = model.to(self.device).eval()
        self.stop_ids = stop_token_ids(self.tokenizer, self.model.config)
        self.prompts = PromptBuilder(self.tokenizer)  # used on the engine thread only
        self.guides = Guides(self.tokenizer, self.model.config.vocab_size, self.prompts.call_format)
        log.info("llm loaded from %s in %.1f s", model_dir, time.perf_counter() - t0)
        self._inbox: queue.Queue[tuple[GenerationRequest, TokenStream] | None] = queue.Queue()
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()  # guards _cancelled
        self.ledger = RequestLedger()
        self._thread = threading.Thread(target=self._run, name="voicert-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the Engine interface (event loop)

    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        request.submit_ns = time.perf_counter_ns()
        refused = refusal(request) or unscored(request)
        if refused is not None:
            return refused
        stream = TokenStream(asyncio.get_running_loop())
        self.ledger.opened(request.request_id)
        self._inbox.put((request, stream))
        return stream

    def cancel(self, request_id: str) -> None:
        if self.ledger.holds(request_id):
            with self._lock:
                self._cancelled.add(request_id)

    def stats(self) -> EngineStats:
        return self.ledger.snapshot()

    @property
    def last_failure(self) -> str | None:
        return None if self._thread.is_alive() else "engine thread exited"

    def live_requests(self) -> set[str]:
        """Ids of requests queued or running (tests use it to check that cancel frees state)."""
        return self.ledger.live()

    def close(self) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=5)

    def warmup(self) -> None:
        """Two greedy steps on a short prompt, on the calling thread, before serving; and guided
        decoding's tokenizer made."""
        self.guides.warm()
        ids = build_prompt(self.tokenizer, [ChatMessage("user", "Hello")], 64)
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([ids], device=self.device), use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            self.model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)

    # ------------------------------------------------------------ the engine thread

    def _is_cancelled(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._cancelled

    def _finish(self, request_id: str, reason: str, tokens: int) -> None:
        with self._lock:
            self._cancelled.discard(request_id)
        self.ledger.closed(request_id, reason, tokens)

    def _run(self) -> None:
        while (item := self._inbox.get()) is not None:
            request, stream = item
            try:
                with torch.inference_mode():
                    self._serve(request, stream)
            except Exception as exc:  # a failed request must not take the engine down
                log.exception("engine: request %s failed", request.request_id)
                self._finish(request.request_id, "error", 0)
                stream.put_threadsafe(
                    TokenEvent(
                        0,
                        -1,
                        "",
                        time.perf_counter_ns(),
                        0,
                        0,
                        finish_reason="error",
                        error=str(exc),
                    )
                )

    def _serve(self, request: GenerationRequest, stream: TokenStream) -> None:
        start_ns = time.perf_counter_ns()
        rid = request.request_id
        if self._is_cancelled(rid):
            self._finish(rid, "cancelled", 0)
            stream.put_threadsafe(TokenEvent(0, -1, "", start_ns, start_ns, 0, "cancelled"))
            return
        budget = self.cfg.max_context_tokens - request.max_new_tokens
        guide = self.guides.for_request(request)  # the same masks as the fast engine's
        prompt = self.prompts.build(
            request.messages, budget, offered(request.tools, request.tool_choice)
        )
        n_prompt = len(prompt)
        detok = IncrementalDetokenizer(self.tokenizer)
        input_ids = torch.tensor([prompt], device=self.device)  # [1, S]
        past = None
        reason = "length"
        index = 0
        while index < request.max_new_tokens:
            if self._is_cancelled(rid):
                reason = "cancelled"
                break
            out = self.model(input_ids=input_ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = int(out.logits[0, -1].argmax())  # greedy; logits: [1, S, V]
            if guide is not None:
                token = guide.pick(token, out.logits[0, -1])
            sampled = time.perf_counter_ns()
            if token in self.stop_ids:
                reason = "stop"
                break
            if guide is not None:
                guide.advance(token)
            stream.put_threadsafe(
                TokenEvent(index, token, detok.push(token), sampled, start_ns, n_prompt)
            )
            index += 1
            if guide is not None and guide.finished:
                reason = "stop"
                break
            input_ids = torch.tensor([[token]], device=self.device)  # [1, 1]
        del past  # free the KV cache before announcing the end
        self._finish(rid, reason, index)
        stream.put_threadsafe(
            TokenEvent(
                index, -1, "", time.perf_counter_ns(), start_ns, n_prompt, finish_reason=reason
            )
        )
