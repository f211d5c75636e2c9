"""The fast engine in a process of its own (``llm.process: true``).

In one process the engine thread shares the GIL with the event loop (every audio frame of every
session), the VAD threads and the ASR worker; under load it gets too little host time to launch its
kernels (docs/benchmarks.md section 8). Here the :class:`EngineCore` runs on an
:class:`EngineThread` in a child process (spawned: CUDA cannot be forked) and this client implements
the same :class:`Engine` interface in the server:

- requests go down one pipe as typed messages (``voicert.engine.ipc``, msgspec); the child's
  receiving thread applies the chat template and tokenises, so the engine thread only steps;
- each engine step's records (token ids) come back up another pipe as one message, read by one
  thread here and handed to asyncio with one loop wake-up (as in-process), where each stream
  detokenises them; the child pushes its figures twice a second, so reading them never waits on it.

Timestamps stay comparable: ``time.perf_counter_ns`` is the system-wide monotonic clock on Linux.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from voicert.core.llm import (
    EndedStream,
    EngineBase,
    EngineLoad,
    EngineStats,
    FinishReason,
    GenerationRequest,
    StepRecord,
    TokenEvent,
    final_event,
    refusal,
)
from voicert.engine import ipc
from voicert.engine.base import RequestLedger, TokenOut, final_out
from voicert.engine.clients.detok import IncrementalDetokenizer
from voicert.engine.clients.stream import TokenStream
from voicert.hosting import child_context

if TYPE_CHECKING:
    from voicert.engine.clients.llm_engine import EngineThread
from voicert.core.llm import GcPause

log = logging.getLogger(__name__)
STATS_INTERVAL_S = 0.5
EXIT_ENGINE_DIED = 70  # the child's exit status when its engine thread died


class _Channel:
    """Child side: sends messages up the event pipe from several threads (engine, main, stats)."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.codec = ipc.Codec()

    def send(self, msg) -> None:
        with self.lock:  # the encoder too is used under the lock: one thread at a time
            self.conn.send_bytes(self.codec.encode(msg))


def _push_stats(engine: EngineThread, gc_watch, channel: _Channel, stop: threading.Event) -> None:
    """Child: send the engine's figures every STATS_INTERVAL_S until ``stop``."""
    while not stop.wait(STATS_INTERVAL_S):
        try:
            channel.send(ipc.Stats(engine.load, engine.core.drain_steps(), gc_watch.drain()))
        except OSError:
            return


def start_engine(model_dir: str, cfg, threads: int, gc_freeze: bool, deliver):
    """Child: an :class:`EngineThread` whose core was loaded and warmed up on that thread (the
    one thread that runs its torch work), and a watch on this process's collector. ``deliver``
    gets the core's records once it serves (it may read ``engine.core`` then)."""
    from voicert.engine.build import build_core
    from voicert.engine.clients.llm_engine import EngineThread
    from voicert.telemetry.gcwatch import GcWatch, settle

    def build():
        import torch

        if threads > 0:
            torch.set_num_threads(threads)
        core = build_core(model_dir, cfg)
        core.warmup()
        return core

    engine = EngineThread(build, deliver)
    if gc_freeze:
        settle()
    return engine, GcWatch().install()


def _child(
    model_dir: str, cfg, threads: int, gc_freeze: bool, requests, events, gpu: str | None = None
) -> None:
    """The engine process: load, warm up, then serve requests until told to stop (or the server
    goes away: the pipe closes). If the engine thread dies, the process says why and exits.
    ``gpu``: the one GPU this process sees (CUDA_VISIBLE_DEVICES, set before CUDA starts)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server shuts us down in order
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    channel = _Channel(events)

    def deliver(outs: list[TokenOut]) -> None:  # engine thread: one step's records, one message
        channel.send(ipc.Events(outs, engine.core.drain_steps()))

    def on_failure(why: str) -> None:  # engine thread: its open requests are failed next
        try:
            channel.send(ipc.Failed(why))
        finally:
            os._exit(EXIT_ENGINE_DIED)

    try:
        engine, gc_watch = start_engine(model_dir, cfg, threads, gc_freeze, deliver)
        from voicert.engine.core.prompt import PromptBuilder

        core = engine.core
        prompts = PromptBuilder(core.tokenizer)  # this (receiving) thread's
    except Exception as exc:  # reported to the server, which fails its start with it
        channel.send(ipc.StartFailed(f"{type(exc).__name__}: {exc}"))
        return
    engine.on_failure = on_failure
    channel.send(ipc.Ready(os.getpid()))
    stop = threading.Event()
    threading.Thread(
        target=_push_stats,
        args=(engine, gc_watch, channel, stop),
        name="voicert-engine-stats",
        daemon=True,
    ).start()
    decoder = ipc.Codec().to_engine
    while True:
        try:
            msg = decoder.decode(requests.recv_bytes())
        except (EOFError, OSError):
            break
        if isinstance(msg, ipc.Submit):
            _submit(engine, prompts, cfg, msg.request, channel.send)
        elif isinstance(msg, ipc.Cancel):
            engine.abort(msg.request_id)
        elif isinstance(msg, ipc.Stop):
            break
    stop.set()
    engine.stop()


def _submit(
    engine: EngineThread,
    prompts,
    cfg,
    request: GenerationRequest,
    send: Callable[[ipc.FromEngine], None],
) -> bool:
    """Child: template and tokenise here (not between engine steps), then hand the request over.
    A request that cannot be templated fails alone (its final record goes out through ``send``;
    False)."""
    if request.prompt_ids is None:
        try:
            budget = cfg.max_context_tokens - request.max_new_tokens
            request.prompt_ids = prompts.build(request.messages, budget)
        except Exception as exc:
            log.warning("engine: request %s refused: %s", request.request_id, exc)
            send(
                ipc.Events(
                    [
                        final_out(
                            request.request_id,
                            FinishReason.ERROR,
                            f"request refused: {type(exc).__name__}: {exc}",
                        )
                    ]
                )
            )
            return False
    engine.add(request)
    return True


class EngineLink(EngineBase):
    """The :class:`Engine` interface over a connection to an engine core that runs elsewhere: in
    a child process of this one (:class:`EngineProcess`) or in an engine host that several server
    processes share (``voicert.engine.clients.host``). Requests go out on ``send_conn``; one reader thread
    takes the engine's messages from ``recv_conn`` (the same object for a duplex socket).

    If the far side goes away (killed, crashed, its engine thread failed), every open request ends
    with an error at once, later submits end the same way, ``last_failure`` is set and
    ``on_failure`` (set by a supervisor) is called once, from the reader thread."""

    def __init__(self, send_conn, recv_conn, model_dir: str, pid: int, tokenizer=None) -> None:
        """``tokenizer``: the model's (loaded from ``model_dir`` when None), for detokenising
        on this side."""
        self._req_w = send_conn
        self._ev_r = recv_conn
        self._codec = ipc.Codec()  # the submitting (event-loop) side's; the reader has its own
        self._pid = pid
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._tokenizer = tokenizer
        self._lock = threading.Lock()  # guards _streams, failure, and the request connection
        self._streams: dict[str, TokenStream] = {}
        self._failure: str | None = None
        self.ledger = RequestLedger()  # this side's view: what is open in the engine
        self._stats: ipc.Stats | None = None
        self._steps: collections.deque[StepRecord] = collections.deque(maxlen=8192)
        self._gc: collections.deque[GcPause] = collections.deque(maxlen=4096)
        self._closing = False
        self._reader = threading.Thread(
            target=self._read, name="voicert-engine-events", daemon=True
        )
        self._reader.start()

    @property
    def last_failure(self) -> str | None:
        return self._failure

    @property
    def pid(self) -> int:
        return self._pid

    def load(self) -> EngineLoad:
        """The figures the child last pushed (all zero before the first push)."""
        return self._stats.load if self._stats is not None else EngineLoad()

    def _read(self) -> None:
        decoder = ipc.Codec().from_engine
        why = "engine process exited"
        while True:
            try:
                msg = decoder.decode(self._ev_r.recv_bytes())
            except (EOFError, OSError):
                break
            if isinstance(msg, ipc.Events):
                self._steps.extend(msg.steps)
                self._deliver(msg.items)
            elif isinstance(msg, ipc.Stats):
                self._stats = msg
                self._steps.extend(msg.steps)
                self._gc.extend(msg.gc)
            elif isinstance(msg, ipc.Failed):
                why = f"engine failed: {msg.error}"
        if self._closing:
            why = "engine closed"
        else:
            why = self._gone(why)
            log.error("engine process %d is gone: %s", self.pid, why)
        if not self._closing and self.on_failure is not None:
            self.on_failure(why)  # first, so that whoever hears of a failed request sees it down
        self._fail_open_streams(why)

    def _gone(self, why: str) -> str:
        """The far side stopped talking; ``why`` with what more is known."""
        return why

    def _deliver(self, items: list[TokenOut]) -> None:
        out = []
        with self._lock:
            for rec in items:
                stream = self._streams.get(rec.request_id)
                if rec.finish_reason is not None and stream is not None:
                    self._streams.pop(rec.request_id, None)
                    self.ledger.closed(rec.request_id, rec.finish_reason, rec.index)
                if stream is not None:
                    out.append((stream, rec))
        TokenStream.post_all(out)

    def _fail_open_streams(self, why: str) -> None:
        """The engine process is gone: end every open request with an error; refuse later ones."""
        with self._lock:
            self._failure = why
            streams, self._streams = self._streams, {}
            for rid in streams:
                self.ledger.closed(rid, FinishReason.ERROR, 0)
        if streams:
            log.error("engine process: %d request(s) failed with it", len(streams))
        TokenStream.post_all(
            [(stream, final_event(FinishReason.ERROR, why)) for stream in streams.values()]
        )

    # ------------------------------------------------------------ the Engine interface

    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        request.submit_ns = time.perf_counter_ns()
        refused = refusal(request)
        if refused is not None:
            return refused
        stream = TokenStream(asyncio.get_running_loop(), IncrementalDetokenizer(self._tokenizer))
        with self._lock:
            if self._failure is not None:
                return EndedStream(final_event(FinishReason.ERROR, self._failure))
            try:
                self._req_w.send_bytes(self._codec.encode(ipc.Submit(request)))
            except OSError as exc:  # the child is going away; the reader will notice too
                return EndedStream(final_event(FinishReason.ERROR, f"engine unreachable: {exc}"))
            self._streams[request.request_id] = stream
            self.ledger.opened(request.request_id)
        return stream

    def cancel(self, request_id: str) -> None:
        with self._lock:
            if self._failure is None:
                try:
                    self._req_w.send_bytes(self._codec.encode(ipc.Cancel(request_id)))
                except OSError:
                    pass  # gone: its streams end through the reader

    def stats(self) -> EngineStats:
        """Request counters as this side has seen them (exact: every request's end comes through
        here), with the figures the child last pushed (at most STATS_INTERVAL_S old). Never blocks."""
        stats = self.ledger.snapshot()
        if self._stats is not None and self._failure is None:
            stats.extra = self._stats.load.extra()
        return stats

    def drain_steps(self) -> list[StepRecord]:
        out = []
        while self._steps:
            out.append(self._steps.popleft())
        return out

    def drain_gc(self) -> list[GcPause]:
        """The engine process's garbage-collector pauses (pushed with its stats)."""
        out = []
        while self._gc:
            out.append(self._gc.popleft())
        return out

    @property
    def scores(self) -> bool:
        return True  # the engine process's core scores

    def live_requests(self) -> set[str]:
        return self.ledger.live()

    def warmup(self) -> None:
        """The child warmed up before it said it was ready."""

    def close(self) -> None:
        """Say :class:`~voicert.engine.ipc.Stop` (to an engine host: this side leaves, and its
        open requests are aborted there; their streams end here as closed) and wait for the far
        side to hang up."""
        self._closing = True
        with self._lock:
            try:
                self._req_w.send_bytes(self._codec.encode(ipc.Stop()))
            except OSError:
                pass
        self._reader.join(5)
        self._req_w.close()


class EngineProcess(EngineLink):
    """An engine core in a child process of this one (``llm.process``), served over two pipes.
    The constructor blocks until the child has loaded and warmed up the model. The child is
    reaped when it goes."""

    def __init__(
        self,
        model_dir: str,
        cfg,
        threads: int = 0,
        start_timeout_s: float = 600,
        gc_freeze: bool = True,
        gpu: str | None = None,
    ) -> None:
        """``gpu``: the index of the one GPU the child uses (its ``cuda``), for one engine per
        GPU; None: the devices this process sees."""
        ctx = child_context()
        req_r, req_w = ctx.Pipe(duplex=False)
        ev_r, ev_w = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=_child,
            name="voicert-engine",
            args=(model_dir, cfg, threads, gc_freeze, req_r, ev_w, gpu),
            daemon=True,
        )
        self._proc.start()
        req_r.close()
        ev_w.close()
        if not ev_r.poll(start_timeout_s):
            self._proc.kill()
            self._proc.join(5)
            raise RuntimeError(f"engine process did not start within {start_timeout_s:.0f} s")
        try:
            first = ipc.Codec().from_engine.decode(ev_r.recv_bytes())
        except (EOFError, OSError):
            first = ipc.StartFailed(f"it exited (status {self._proc.exitcode})")
        if not isinstance(first, ipc.Ready):
            self._proc.join(5)
            why = (
                first.error
                if isinstance(first, (ipc.StartFailed, ipc.Failed))
                else f"it sent {type(first).__name__} before it was ready"
            )
            raise RuntimeError(f"engine process failed to start: {why}")
        super().__init__(req_w, ev_r, model_dir, first.pid)
        log.info("engine process %d ready", self.pid)

    def _gone(self, why: str) -> str:
        self._proc.join(5)  # reap it (no defunct child)
        return f"{why} (status {self._proc.exitcode})"

    def kill(self) -> None:
        """Kill the child at once (tests and chaos checks: what a crash looks like)."""
        self._proc.kill()

    def close(self) -> None:
        self._closing = True
        if self._proc.is_alive():
            with self._lock:
                try:
                    self._req_w.send_bytes(self._codec.encode(ipc.Stop()))
                except OSError:
                    pass
            self._proc.join(15)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._req_w.close()
        self._reader.join(5)
