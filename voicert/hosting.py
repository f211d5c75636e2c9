"""Serving several worker processes from one process over a Unix socket (the engine host, the
speech host): a connected peer's outbox and sending thread on the host side, and the client's
connect that waits for a host still loading. The messages are each host's own (msgspec)."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener
from typing import Union

import msgspec

log = logging.getLogger(__name__)
FAMILY = "AF_UNIX"

# What voicert's child processes (workers, hosts, engine processes) import anyway. They start from
# a forkserver that has imported these once: a child is up in milliseconds instead of 2-4 s of
# imports per start (more on a busy machine), so a failed engine or worker is replaced sooner. None
# of these starts a thread or CUDA at import (a fork must not copy either).
PRELOAD = (
    "voicert.engine.core.engine_core",
    "voicert.engine.clients.remote",
    "voicert.engine.clients.host",
    "voicert.speech.host",
    "voicert.server.app",
    "voicert.server.workers",
    "transformers.models.auto.tokenization_auto",
)


def child_context() -> mp.context.SpawnContext | mp.context.ForkServerContext:
    """The multiprocessing context for voicert's child processes: forkserver with :data:`PRELOAD`
    where the platform has it, else spawn. Either way a child starts from a clean process, not
    a fork of this one (its threads, CUDA, event loop). A child gets the environment this
    process had when its first child started; set per-child variables (CUDA_VISIBLE_DEVICES) in
    the child."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


class HostReady(msgspec.Struct, tag=True, array_like=True):
    pid: int


class HostFailed(msgspec.Struct, tag=True, array_like=True):
    error: str


class HostStop(msgspec.Struct, tag=True, array_like=True):
    pass


_Status = Union[HostReady, HostFailed, HostStop]


def say_status(conn: Connection, msg: _Status) -> None:
    """A host process, on its status pipe: HostReady or HostFailed once (then it hears HostStop)."""
    conn.send_bytes(msgspec.msgpack.encode(msg))


def wait_stop(conn: Connection) -> None:
    """A host process: block until the primary says HostStop or goes away."""
    decoder = msgspec.msgpack.Decoder(_Status)
    try:
        while not isinstance(decoder.decode(conn.recv_bytes()), HostStop):
            pass
    except (EOFError, OSError):
        pass


def listen(address: str, authkey: bytes) -> Listener:
    """A host's listening socket at ``address``, replacing one a crashed host left there (the
    primary's private directory holds nothing else)."""
    if os.path.exists(address):
        os.unlink(address)
    return Listener(address, FAMILY, authkey=authkey)


def accept_peers(listener, what: str, on_peer: Callable[[Connection], None]) -> None:
    """A host's accepting thread: each connection that passes the key handshake goes to
    ``on_peer``; returns when the listener is closed."""
    while True:
        try:
            conn = listener.accept()
        except OSError:
            return
        except Exception as exc:  # failed the handshake: not one of our workers
            log.warning("%s: refused a connection: %s", what, exc)
            continue
        on_peer(conn)


def serve_peers(
    listener,
    status: Connection,
    what: str,
    on_peer: Callable[[Connection], None],
    push_stats: Callable[[threading.Event], None],
) -> None:
    """A host process once loaded: ``push_stats(stop)`` and :func:`accept_peers` on threads of
    their own, HostReady on ``status``, then serve until the primary says HostStop or goes
    away; returns with ``stop`` set and the listener closed. The caller then stops what it
    loaded. ``what``: "engine host", "speech host" (messages, thread names)."""
    stop = threading.Event()
    name = what.replace(" ", "-")
    threading.Thread(
        target=push_stats, args=(stop,), name=f"voicert-{name}-stats", daemon=True
    ).start()
    threading.Thread(
        target=accept_peers,
        args=(listener, what, on_peer),
        name=f"voicert-{name}-accept",
        daemon=True,
    ).start()
    say_status(status, HostReady(os.getpid()))
    wait_stop(status)
    stop.set()
    listener.close()


class HostProcess:
    """The primary's handle on one host process (``target(*args, status)``, started from
    :func:`child_context`): its status pipe says whether it started; ``stop`` asks it to stop,
    then makes sure."""

    def __init__(self, what: str, target: Callable, args: tuple) -> None:
        ctx = child_context()
        self.what = what  # "engine host", "speech host": for messages
        self.status, child_status = ctx.Pipe()  # HostReady/HostFailed up; HostStop down
        self.proc = ctx.Process(
            target=target,
            name=f"voicert-{what.replace(' ', '-')}",
            args=(*args, child_status),
            daemon=True,
        )
        self.proc.start()
        child_status.close()
        self.pid: int | None = None

    def wait_ready(self, timeout_s: float = 600) -> int:
        """Block until the host serves (its pid) or raise ``RuntimeError`` with why it could
        not start."""
        if not self.status.poll(timeout_s):
            self.kill()
            raise RuntimeError(f"{self.what} did not start within {timeout_s:.0f} s")
        return self.read_status()

    def read_status(self) -> int:
        """Its first word, once ``status`` is readable: its pid when it serves; else raises
        ``RuntimeError`` with why it could not start."""
        try:
            first = msgspec.msgpack.decode(self.status.recv_bytes(), type=_Status)
        except (EOFError, OSError):
            self.proc.join(5)
            first = HostFailed(f"it exited (status {self.proc.exitcode})")
        if not isinstance(first, HostReady):
            self.proc.join(5)
            why = first.error if isinstance(first, HostFailed) else "it stopped before it started"
            raise RuntimeError(f"{self.what} failed to start: {why}")
        self.pid = first.pid
        return first.pid

    @property
    def sentinel(self) -> int:
        return self.proc.sentinel

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)

    def stop(self, timeout_s: float = 15) -> None:
        """Ask it to stop (its clients see the connection close), then make sure it has."""
        if self.proc.is_alive():
            try:
                say_status(self.status, HostStop())
            except OSError:
                pass
            self.proc.join(timeout_s)
        if self.proc.is_alive():
            self.kill()
        self.status.close()


class Peer:
    """Host side of one connected worker: its connection, what it has open, and a sending thread
    (messages are queued, so a worker that reads slowly never holds up the host's own threads;
    only that thread encodes and writes, except a last word on failure)."""

    def __init__(self, cid: int, conn: Connection) -> None:
        self.cid = cid
        self.conn = conn
        self.open: set = set()  # its requests or jobs (by its own ids) not yet finished
        self.gone = False  # it hung up (what it still had queued is withdrawn)
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.write_lock = threading.Lock()
        self.sender = threading.Thread(
            target=self._send_loop, name=f"voicert-host-send-{cid}", daemon=True
        )
        self.sender.start()

    def post(self, msg) -> None:
        self.outbox.put(msg)

    def _send_loop(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        while True:
            msg = self.outbox.get()
            if msg is None:
                return
            try:
                with self.write_lock:
                    self.conn.send_bytes(encoder.encode(msg))
            except OSError:
                return  # gone: its receiving thread cleans up

    def say_now(self, msg) -> None:
        """Write at once, from any thread (the engine's last word before the host exits)."""
        try:
            with self.write_lock:
                self.conn.send_bytes(msgspec.msgpack.encode(msg))
        except OSError:
            pass

    def close(self) -> None:
        """It hung up: let the sending thread finish what is queued (briefly), then close."""
        self.outbox.put(None)
        self.sender.join(2)
        self.conn.close()


def connect(address: str, authkey: bytes, timeout_s: float) -> Connection:
    """Connect, retrying while the socket is missing or refuses (a host still loading)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Client(address, FAMILY, authkey=authkey)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"no host at {address} after {timeout_s:.0f} s: {exc}") from None
            time.sleep(0.1)


def raise_fd_limit(cap: int = 1 << 20) -> tuple[int, int]:
    """Raise this process's soft limit on open files to its hard limit (at most ``cap``); returns
    (before, after). A soft limit of 1024, many systems' default, is reached with a few hundred
    callers and their sockets, pipes and model files: accept() then fails with EMFILE and the
    health checks with it, which nobody sees as the cause."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):  # not allowed here: keep what there is
            return soft, soft
        return soft, wanted
    return soft, soft


def limit_blas_threads(n: int) -> None:
    """Keep numpy's BLAS pool (OpenBLAS) in this process to ``n`` threads (0: leave it). Its
    default, one thread per core, spin-waits after every small product the front end makes
    (Whisper's log-mel filterbank on each decode) and so keeps every core busy."""
    if n <= 0:
        return
    import importlib

    from threadpoolctl import threadpool_limits

    importlib.import_module("numpy")  # loaded first: threadpoolctl limits the libraries loaded now
    threadpool_limits(limits=n, user_api="blas")
