"""The fast engine in a process of its own (``llm.process: true``).

In one process the engine thread shares the GIL with the event loop (every audio frame of every
session), the VAD threads and the ASR worker; under load it gets too little host time to launch its
kernels (docs/benchmarks.md section 8). Here the :class:`LLMEngine` runs in a child process (spawned:
CUDA cannot be forked) and this proxy implements the same :class:`Engine` interface in the server:

- requests go down one pipe (pickled :class:`GenerationRequest`, or a cancel); the child's
  receiving thread applies the chat template and tokenises, so the engine thread only steps;
- each engine step's token events come back up another pipe as one message, read by one thread
  here and handed to asyncio with one loop wake-up (as in-process).

Timestamps stay comparable: ``time.perf_counter_ns`` is the system-wide monotonic clock on Linux.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import queue
import signal
import threading
import time
from typing import AsyncIterator

from voicert.engine.base import (EngineStats, GenerationRequest, RequestLedger, StepRecord,
                                 TokenEvent)
from voicert.engine.stream import TokenStream
from voicert.telemetry.gcwatch import GcPause

log = logging.getLogger(__name__)


class _Channel:
    """Child side: sends messages up the event pipe from several threads (engine, main)."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, msg) -> None:
        with self.lock:
            self.conn.send(msg)

    def deliver(self, batch: list[tuple["_Sink", TokenEvent]]) -> None:
        """One engine step's events, as one message."""
        self.send(("events", [(sink.request_id, ev) for sink, ev in batch]))


class _Sink:
    """Child side: stands in for a request's TokenStream; the engine's step hands it events."""

    __slots__ = ("request_id", "batch_key")

    def __init__(self, request_id: str, channel: _Channel) -> None:
        self.request_id = request_id
        self.batch_key = channel  # TokenStream.post_all groups a step's events by this

    def put_threadsafe(self, event: TokenEvent) -> None:
        self.batch_key.deliver([(self, event)])


def _child(model_dir: str, cfg, threads: int, gc_freeze: bool, requests, events) -> None:
    """The engine process: load, warm up, then serve requests until told to stop (or the server
    goes away: the pipe closes)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server shuts us down in order
    channel = _Channel(events)
    try:
        import torch

        if threads > 0:
            torch.set_num_threads(threads)
        from voicert.engine.llm_engine import LLMEngine
        from voicert.engine.prompt import build_prompt

        from voicert.telemetry.gcwatch import GcWatch, settle

        engine = LLMEngine(model_dir, cfg)
        engine.warmup()
        if gc_freeze:
            settle()
        gc_watch = GcWatch().install()
    except Exception as exc:  # reported to the server, which fails its start with it
        channel.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    channel.send(("ready", None))
    while True:
        try:
            msg = requests.recv()
        except (EOFError, OSError):
            break
        kind = msg[0]
        if kind == "submit":
            request: GenerationRequest = msg[1]
            if request.prompt_ids is None:  # chat template + tokenise here, not between steps
                budget = cfg.max_context_tokens - request.max_new_tokens
                request.prompt_ids = build_prompt(engine.tokenizer, request.messages, budget)
            engine.ledger.opened(request.request_id)
            engine._inbox.put(("submit", request, _Sink(request.request_id, channel)))
        elif kind == "cancel":
            engine.cancel(msg[1])
        elif kind == "stats":
            channel.send(("stats", engine.stats(), engine.drain_steps(), gc_watch.drain(),
                          len(engine.scheduler.waiting), len(engine.scheduler.running)))
        elif kind == "stop":
            break
    engine.close()


class EngineProcess:
    """The :class:`Engine` interface, served by an :class:`LLMEngine` in a child process.
    The constructor blocks until the child has loaded and warmed up the model."""

    def __init__(self, model_dir: str, cfg, threads: int = 0, start_timeout_s: float = 600,
                 gc_freeze: bool = True) -> None:
        ctx = mp.get_context("spawn")
        self._req_r, self._req_w = ctx.Pipe(duplex=False)
        self._ev_r, self._ev_w = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child, name="voicert-engine",
                                 args=(model_dir, cfg, threads, gc_freeze, self._req_r, self._ev_w), daemon=True)
        self._proc.start()
        self._req_r.close()
        self._ev_w.close()
        if not self._ev_r.poll(start_timeout_s):
            self._proc.kill()
            raise RuntimeError(f"engine process did not start within {start_timeout_s:.0f} s")
        kind, info = self._ev_r.recv()
        if kind != "ready":
            self._proc.join(5)
            raise RuntimeError(f"engine process failed to start: {info}")
        self._send_lock = threading.Lock()
        self._streams: dict[str, TokenStream] = {}
        self.ledger = RequestLedger()  # this side's view: what is open in the engine
        self._stats: queue.SimpleQueue = queue.SimpleQueue()
        self._steps: list[StepRecord] = []
        self._gc: list[GcPause] = []
        self.queue_depth = self.running = 0
        self._reader = threading.Thread(target=self._read, name="voicert-engine-events",
                                        daemon=True)
        self._reader.start()
        log.info("engine process %d ready", self._proc.pid)

    def _send(self, msg) -> None:
        with self._send_lock:
            self._req_w.send(msg)

    def _read(self) -> None:
        while True:
            try:
                msg = self._ev_r.recv()
            except (EOFError, OSError):
                break
            if msg[0] == "events":
                out = []
                for rid, ev in msg[1]:
                    stream = self._streams.get(rid)
                    if ev.finish_reason is not None:
                        self._streams.pop(rid, None)
                        self.ledger.closed(rid, ev.finish_reason, ev.index)
                    if stream is not None:
                        out.append((stream, ev))
                TokenStream.post_all(out)
            elif msg[0] == "stats":
                self._stats.put(msg[1:])
        self._fail_open_streams()

    def _fail_open_streams(self) -> None:
        """The engine process is gone: end every open request with an error."""
        if self._streams:
            log.error("engine process exited with %d request(s) open", len(self._streams))
        now = time.perf_counter_ns()
        out = [(stream, TokenEvent(0, -1, "", now, 0, 0, finish_reason="error",
                                   error="engine process exited"))
               for stream in self._streams.values()]
        for rid in list(self._streams):
            self.ledger.closed(rid, "error", 0)
        self._streams.clear()
        TokenStream.post_all(out)

    # ------------------------------------------------------------ the Engine interface

    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        stream = TokenStream(asyncio.get_running_loop())
        request.submit_ns = time.perf_counter_ns()
        self._streams[request.request_id] = stream
        self.ledger.opened(request.request_id)
        self._send(("submit", request))
        return stream

    def cancel(self, request_id: str) -> None:
        if self._proc.is_alive():
            self._send(("cancel", request_id))

    def stats(self) -> EngineStats:
        """The engine's counters, fetched from the child (blocks for its reply, < 1 s)."""
        if not self._proc.is_alive():
            return self.ledger.snapshot()
        self._send(("stats",))
        try:
            stats, steps, pauses, self.queue_depth, self.running = self._stats.get(timeout=1.0)
        except queue.Empty:
            return self.ledger.snapshot()
        self._steps += steps
        self._gc += pauses
        return stats

    def drain_steps(self) -> list[StepRecord]:
        steps, self._steps = self._steps, []
        return steps

    def drain_gc(self) -> list[GcPause]:
        """The engine process's garbage-collector pauses (fetched with :meth:`stats`)."""
        pauses, self._gc = self._gc, []
        return pauses

    def live_requests(self) -> set[str]:
        return self.ledger.live()

    def warmup(self) -> None:
        """The child warmed up before it said it was ready."""

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._send(("stop",))
            except OSError:
                pass
            self._proc.join(15)
        if self._proc.is_alive():
            self._proc.kill()
        self._req_w.close()
