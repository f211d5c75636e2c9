"""One engine core shared by several server processes (``server.workers``).

The engine host is a process of its own (spawned: CUDA cannot be forked) that loads one
:class:`~voicert.engine.core.engine_core.EngineCore` and serves every front-end worker over a Unix socket in a
private directory: each worker connects with :class:`SharedEngineClient` (the :class:`Engine`
interface, an :class:`~voicert.engine.clients.remote.EngineLink`) and speaks the same typed messages as
the engine process (``voicert.engine.ipc``). All workers' requests share the engine's batches and
its prefix cache.

In the host, per client: a receiving thread (template and tokenise, then hand the request to the
engine thread) and a sending thread with an outbox, so a worker that reads slowly never holds up
the engine step. Request ids are namespaced by client (two workers may use the same id). A client
that hangs up has its open requests aborted. The engine's step records and collector pauses go to
one client only (the lowest-numbered connected one), so the workers' metrics count each step once.

If the engine thread dies, every client is told (:class:`~voicert.engine.ipc.Failed`) and the host
exits; whoever started it (:func:`start_engine_host`, the primary process) starts another at
the same address, and each worker's supervisor reconnects.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import msgspec

from voicert.engine import ipc
from voicert.engine.base import TokenOut
from voicert.engine.clients.remote import (
    EXIT_ENGINE_DIED,
    STATS_INTERVAL_S,
    EngineLink,
    _submit,
    start_engine,
)
from voicert.hosting import (
    HostFailed,
    HostProcess,
    Peer,
    connect,
    listen,
    say_status,
    serve_peers,
)
from voicert.telemetry.logs import setup_logging

if TYPE_CHECKING:
    from voicert.engine.clients.llm_engine import EngineThread

log = logging.getLogger(__name__)
SEP = "/"  # client id SEP the client's request id: the id the engine core sees


@dataclass(frozen=True, slots=True)
class HostAddresses:
    """Where a worker finds its engine hosts (one per GPU with ``llm.gpus``), the key they
    check, and the model they serve (for the worker's tokenizer)."""

    addresses: tuple[str, ...]
    authkey: bytes
    model_dir: str


class _Hub:
    """The host's clients: routes each step's records to the workers that asked for them."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self._engine: EngineThread | None = None  # set once made (it delivers to this hub)
        self.lock = threading.Lock()  # guards clients and each client's ``open``
        self.clients: dict[int, Peer] = {}
        self._next_id = 0

    @property
    def engine(self) -> EngineThread:
        if self._engine is None:
            raise RuntimeError("the engine host's engine thread is not made yet")
        return self._engine

    @property
    def core(self):
        return self.engine.core

    def attach(self, engine: EngineThread) -> None:
        self._engine = engine

    def reporter(self) -> Peer | None:
        """The client that gets the engine's step records and collector pauses (caller holds the
        lock)."""
        return self.clients[min(self.clients)] if self.clients else None

    def deliver(self, outs: list[TokenOut]) -> None:
        """Engine thread: one step's records, one message per client that has any."""
        groups: dict[int, list[TokenOut]] = {}
        for rec in outs:
            prefix, _, rid = rec.request_id.partition(SEP)
            groups.setdefault(int(prefix), []).append(msgspec.structs.replace(rec, request_id=rid))
        steps = self.core.drain_steps()
        with self.lock:
            reporter = self.reporter()
            for cid, items in groups.items():
                client = self.clients.get(cid)
                if client is None:
                    continue  # it hung up: its requests were aborted
                for rec in items:
                    if rec.finish_reason is not None:
                        client.open.discard(rec.request_id)
                if reporter is not None and client is reporter:
                    client.post(ipc.Events(items, steps))
                    steps = []
                else:
                    client.post(ipc.Events(items))
            if steps and reporter is not None:
                reporter.post(ipc.Events([], steps))

    def engine_failed(self, why: str) -> None:
        """Engine thread died: tell every client, then exit (the primary starts another host)."""
        try:
            with self.lock:
                clients = list(self.clients.values())
            for client in clients:
                client.say_now(ipc.Failed(why))
        finally:
            os._exit(EXIT_ENGINE_DIED)

    def push_stats(self, gc_watch, stop: threading.Event) -> None:
        """Every STATS_INTERVAL_S: the engine's load to every client; steps and pauses to one."""
        while not stop.wait(STATS_INTERVAL_S):
            load = self.engine.load
            with self.lock:
                reporter = self.reporter()
                for client in self.clients.values():
                    if client is reporter:
                        client.post(ipc.Stats(load, self.core.drain_steps(), gc_watch.drain()))
                    else:
                        client.post(ipc.Stats(load, [], []))

    def join(self, conn) -> None:
        """A worker connected (the accepting thread): it gets a receiving thread."""
        with self.lock:
            cid, self._next_id = self._next_id, self._next_id + 1
            client = self.clients[cid] = Peer(cid, conn)
            client.post(ipc.Ready(os.getpid()))
        threading.Thread(
            target=self.serve, args=(client,), name=f"voicert-host-recv-{cid}", daemon=True
        ).start()
        log.info("engine host: worker connection %d", cid)

    def serve(self, client: Peer) -> None:
        """Receiving thread of one client: its requests into the engine until it hangs up (or
        says Stop); then its open requests are aborted."""
        from voicert.engine.core.prompt import PromptBuilder

        prompts = PromptBuilder(self.core.tokenizer)  # this thread's
        decoder = ipc.Codec().to_engine
        prefix = f"{client.cid}{SEP}"
        while True:
            try:
                msg = decoder.decode(client.conn.recv_bytes())
            except (EOFError, OSError):
                break
            except msgspec.DecodeError as exc:  # our own workers send these: a bug, said loudly
                log.error(
                    "engine host: undecodable message from worker connection %d: %s",
                    client.cid,
                    exc,
                )
                break
            if isinstance(msg, ipc.Submit):
                self._submit(client, prompts, msg.request, prefix)
            elif isinstance(msg, ipc.Cancel):
                self.engine.abort(prefix + msg.request_id)
            elif isinstance(msg, ipc.Stop):
                break
        self._hang_up(client, prefix)

    def _submit(self, client: Peer, prompts, request, prefix: str) -> None:
        rid = request.request_id
        with self.lock:
            client.open.add(rid)
        request.request_id = prefix + rid
        refused = lambda msg: self._refused(client, rid, msg)
        if not _submit(self.engine, prompts, self.cfg, request, refused):
            with self.lock:
                client.open.discard(rid)

    @staticmethod
    def _refused(client: Peer, rid: str, msg: ipc.Events) -> None:
        """A request that could not be templated: its final record, under the client's id."""
        client.post(ipc.Events([msgspec.structs.replace(rec, request_id=rid) for rec in msg.items]))

    def _hang_up(self, client: Peer, prefix: str) -> None:
        with self.lock:
            self.clients.pop(client.cid, None)
            still_open = list(client.open)
        for rid in still_open:
            self.engine.abort(prefix + rid)
        client.close()
        log.info(
            "engine host: worker connection %d closed (%d request(s) aborted)",
            client.cid,
            len(still_open),
        )


def _host(
    model_dir: str,
    cfg,
    threads: int,
    gc_freeze: bool,
    address: str,
    authkey: bytes,
    gpu: str | None,
    log_level: str,
    status,
) -> None:
    """The engine host process: load and warm up, listen at ``address``, say Ready on ``status``
    (or StartFailed), serve workers until the primary says Stop or goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the primary shuts us down in order
    setup_logging(log_level, "%(asctime)s %(levelname)s [engine] %(name)s: %(message)s")
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    hub = _Hub(cfg)
    try:
        engine, gc_watch = start_engine(model_dir, cfg, threads, gc_freeze, hub.deliver)
        listener = listen(address, authkey)
    except Exception as exc:
        say_status(status, HostFailed(f"{type(exc).__name__}: {exc}"))
        return
    hub.attach(engine)
    engine.on_failure = hub.engine_failed
    serve_peers(listener, status, "engine host", hub.join, partial(hub.push_stats, gc_watch))
    engine.stop()


def start_engine_host(
    model_dir: str,
    cfg,
    address: str,
    authkey: bytes,
    threads: int = 0,
    gc_freeze: bool = True,
    gpu: str | None = None,
    log_level: str = "INFO",
) -> HostProcess:
    """Start one engine host process serving at ``address`` (the primary's handle; its
    ``wait_ready`` blocks until it serves or raises with the reason it could not start)."""
    return HostProcess(
        "engine host", _host, (model_dir, cfg, threads, gc_freeze, address, authkey, gpu, log_level)
    )


class SharedEngineClient(EngineLink):
    """A worker's :class:`Engine`: a connection to the engine host at ``address``. It waits up to
    ``connect_timeout_s`` for a host to accept (one may be starting or restarting) and raises
    ``RuntimeError`` if none does. ``close`` leaves the host (it aborts this side's requests)."""

    def __init__(
        self,
        address: str,
        authkey: bytes,
        model_dir: str,
        connect_timeout_s: float = 600,
        tokenizer=None,
    ) -> None:
        conn = connect(address, authkey, connect_timeout_s)
        if not conn.poll(max(connect_timeout_s, 1.0)):
            conn.close()
            raise RuntimeError(f"engine host at {address} did not say it was ready")
        first = ipc.Codec().from_engine.decode(conn.recv_bytes())
        if not isinstance(first, ipc.Ready):
            conn.close()
            raise RuntimeError(f"engine host at {address} answered {type(first).__name__}")
        super().__init__(conn, conn, model_dir, first.pid, tokenizer)
        log.info("connected to the engine host (pid %d)", self.pid)

    def _gone(self, why: str) -> str:
        return "engine host went away" if why == "engine process exited" else why
