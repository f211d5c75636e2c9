"""Front-end workers: ``server.workers: N`` processes serving one port, sharing one engine.

One event loop runs out of host time at ~100 callers (every audio frame, VAD batch, turn decision
and token of every session goes through it). With workers, the process started by ``voicert
serve`` becomes the *primary*; it serves no socket itself:

- it binds N listening sockets to the same port with ``SO_REUSEPORT`` (the kernel spreads new
  connections over them) and hands one to each worker;
- it starts the engine host (``voicert.engine.clients.host``; one per GPU with ``llm.gpus``): one engine
  core whose batches and prefix cache every worker shares; and, with ``asr.shared``, the speech
  host (``voicert.speech.host``): one Whisper batching every worker's utterances;
- it spawns the workers: each is a whole server (its own uvloop, VAD, voice, turn judge,
  sessions) whose engine and ASR are clients of the hosts;
- it relays each worker's finished turns and figures to the others (:class:`PeerBus`), so every
  dashboard shows every turn and every worker's sessions; ``/metrics`` on any worker shows all
  of them (a shared multiprocess directory);
- it supervises: a worker that dies is started again on its socket, a host that dies is started
  again at its address (the workers reconnect), each at most ``llm.restart_max`` times
  within ``llm.restart_window_s``; more, or a worker that gave up on a part (exit status 3), stops
  the server with status 3;
- on SIGINT or SIGTERM it asks every worker to shut down gracefully (``server.shutdown_grace_s``),
  then stops the hosts. A second signal makes the workers exit at once.

Per-server limits (``max_sessions``, ``max_connections``, ``max_completions``) are split evenly
over the workers.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import multiprocessing as mp
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING

from voicert.config import Config, cache_dir
from voicert.hosting import child_context
from voicert.server.app import run_server, websockets_problem, where_to_start
from voicert.server.peers import PeerBus, WorkerRole

if TYPE_CHECKING:
    from voicert.engine.clients.host import HostAddresses
    from voicert.engine.settings import EngineConfig

log = logging.getLogger(__name__)
EXIT_GAVE_UP = 3  # a part could not be kept up (the same status a single server exits with)
EXIT_START_FAILED = 2  # a worker or the engine could not start (a config error, a port in use)


def listening_sockets(host: str, port: int, n: int) -> list[socket.socket]:
    """``n`` sockets listening on the same address with SO_REUSEPORT (``port`` 0: the first one's
    free port for all). Raises OSError naming the address if it is taken."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = infos[0]
    out: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.socket(family, socket.SOCK_STREAM)
            out.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(addr)
            sock.listen(1024)
            sock.setblocking(False)
            addr = sock.getsockname()  # the port, once chosen
    except OSError as exc:
        for sock in out:
            sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return out


def worker_limits(cfg: Config, workers: int) -> Config:
    """The config one of ``workers`` workers runs with: the per-server limits split evenly."""
    s = cfg.server

    def share(n: int) -> int:
        return max(1, math.ceil(n / workers)) if n > 0 else 0

    server = dataclasses.replace(
        s,
        max_sessions=share(s.max_sessions),
        max_connections=share(s.max_connections),
        max_completions=share(s.max_completions),
    )
    return dataclasses.replace(cfg, server=server)


def _worker_main(
    index: int,
    cfg: Config,
    sock: socket.socket,
    hosts,
    speech,
    bus_conn: Connection,
    metrics_dir: str,
    log_level: str,
) -> None:
    """A worker process: one whole server on its socket, its engine the shared host."""
    from voicert.telemetry.logs import setup_logging

    setup_logging(log_level, f"%(asctime)s %(levelname)s [w{index}] %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the primary forwards the signals (as SIGTERM)
    from voicert.telemetry.metrics import use_multiprocess_dir

    use_multiprocess_dir(metrics_dir)
    from voicert.config import ConfigError

    role = WorkerRole(index, sock, hosts, speech, PeerBus(bus_conn, index))
    try:
        code = run_server(cfg, role)
    except (ConfigError, OSError) as exc:  # said once, as the single server says it
        print(f"voicert: {exc}", file=sys.stderr, flush=True)
        code = EXIT_START_FAILED
    except Exception:
        log.exception("worker %d failed", index)
        code = 1
    os._exit(code)  # not sys.exit: no atexit work in a spawned child (loaded models, threads)


class _Restarts:
    """Failures within a window: ``allow()`` is False once there were more than ``max`` of them
    within ``window_s``."""

    def __init__(self, max_restarts: int, window_s: float) -> None:
        self.max, self.window_s = max_restarts, window_s
        self.times: collections.deque[float] = collections.deque()

    def allow(self, now: float) -> bool:
        self.times.append(now)
        while self.times and now - self.times[0] > self.window_s:
            self.times.popleft()
        return len(self.times) <= self.max


class Primary:
    """Runs ``server.workers`` worker processes, the engine host(s) and the speech host; see the
    module doc."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.n = cfg.server.workers
        self.ctx = child_context()
        self.dir = tempfile.mkdtemp(prefix="voicert-")  # private (0700): sockets, metrics
        self.metrics_dir = os.path.join(self.dir, "metrics")
        os.mkdir(self.metrics_dir)
        self.authkey = secrets.token_bytes(32)
        self.sockets: list[socket.socket] = []
        self.workers: list[mp.process.BaseProcess | None] = [None] * self.n
        self.buses: list[Connection | None] = [None] * self.n
        self.hosts: list = []  # HostProcess: the engine hosts (one per GPU), the speech host
        self._host_starters: list = []  # what starts each again
        self.host_addresses: HostAddresses | None = None
        self.speech: list[str] = []  # the speech hosts' addresses (asr.hosts; none: asr.shared off)
        self.model_dir: str | None = None
        self.engine_cfg: EngineConfig | None = None
        self.stopping = False
        self.exit_code = 0
        llm = cfg.llm
        self.restarts = _Restarts(llm.restart_max, llm.restart_window_s)
        self._wake_r, self._wake_w = os.pipe()
        self._signals = 0

    # ------------------------------------------------------------ start

    def start(self) -> None:
        """Bind the port, start the hosts and the workers (they all load at the same time; a host
        that cannot start is heard of in :meth:`_supervise`). Raises OSError for a port that is
        taken, ConfigError for a model that cannot be resolved."""
        from voicert.engine.clients.host import HostAddresses

        s = self.cfg.server
        self.sockets = listening_sockets(s.host, s.port, self.n)
        port = self.sockets[0].getsockname()[1]
        log.info("voicert listening on ws://%s:%d/v1/stream (%d workers)", s.host, port, self.n)
        log.info("%s", where_to_start(s.host, port))
        if self.cfg.llm.engine != "openai":
            from voicert.engine.factory import check_device
            from voicert.engine.loader import resolve_llm
            from voicert.engine.settings import engine_config

            check_device(self.cfg.llm)
            self.model_dir = str(resolve_llm(self.cfg.models.llm, cache_dir(self.cfg.models)))
            self.engine_cfg = engine_config(self.cfg.llm, str(cache_dir(self.cfg.models)))
            addresses = tuple(
                os.path.join(self.dir, f"engine-{i}.sock") for i in range(self.cfg.llm.gpus)
            )
            self.host_addresses = HostAddresses(addresses, self.authkey, self.model_dir)
            self._host_starters += [
                lambda i=i: self._start_engine_host(i) for i in range(len(addresses))
            ]
        if self.cfg.asr.shared:
            from voicert.speech.host import check_speech_gpus

            check_speech_gpus(self.cfg.asr)
            self.speech = [
                os.path.join(self.dir, f"speech-{i}.sock") for i in range(self.cfg.asr.hosts)
            ]
            self._host_starters += [
                lambda i=i: self._start_speech_host(i) for i in range(len(self.speech))
            ]
        self.hosts = [start() for start in self._host_starters]
        for i in range(self.n):
            self._start_worker(i)

    def _start_speech_host(self, i: int):
        from voicert.speech.asr import resolve_asr_model
        from voicert.speech.host import host_judges, start_speech_host

        return start_speech_host(
            self.cfg.asr,
            str(resolve_asr_model(self.cfg.models.asr, cache_dir(self.cfg.models))),
            self.speech[i],
            self.authkey,
            index=i if len(self.speech) > 1 else None,
            log_level=self.cfg.log.level,
            blas_threads=self.cfg.server.blas_threads,
            judge=(self.cfg.turn.model_path, self.cfg.turn.device, self.cfg.turn.audio_head)
            if host_judges(self.cfg)
            else None,
        )

    def _speech_for(self, worker: int) -> tuple[str, bytes] | None:
        """The speech host worker ``worker`` sends its utterances to (address, key): host
        ``worker mod asr.hosts``; None where each worker runs its own Whisper."""
        if not self.speech:
            return None
        return self.speech[worker % len(self.speech)], self.authkey

    def _start_engine_host(self, i: int):
        from voicert.engine.clients.host import start_engine_host

        gpu = str(i) if self.cfg.llm.gpus > 1 else None
        model_dir, engine_cfg, addresses = self.model_dir, self.engine_cfg, self.host_addresses
        assert model_dir and engine_cfg and addresses  # set in start() before any host starts
        return start_engine_host(
            model_dir,
            engine_cfg,
            addresses.addresses[i],
            self.authkey,
            threads=self.cfg.llm.threads,
            gc_freeze=self.cfg.server.gc_freeze,
            gpu=gpu,
            log_level=self.cfg.log.level,
        )

    def _start_worker(self, i: int) -> None:
        ours, theirs = self.ctx.Pipe()
        proc = self.ctx.Process(
            target=_worker_main,
            name=f"voicert-worker-{i}",
            args=(
                i,
                worker_limits(self.cfg, self.n),
                self.sockets[i],
                self.host_addresses,
                self._speech_for(i),
                theirs,
                self.metrics_dir,
                self.cfg.log.level,
            ),
        )
        proc.start()
        theirs.close()
        self.workers[i], self.buses[i] = proc, ours
        log.info("worker %d started (pid %d)", i, proc.pid)

    # ------------------------------------------------------------ run

    def on_signal(self, signum, frame) -> None:
        """SIGINT/SIGTERM (main thread): the first asks for a graceful stop, the next forces."""
        self._signals += 1
        os.write(self._wake_w, b"s")

    def run(self) -> int:
        """Start, then supervise until a signal (or a part that gives up); stop everything."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.on_signal)
        try:
            self.start()
            self._supervise()
        finally:
            self._stop_all()
        return self.exit_code

    def _supervise(self) -> None:
        while not self.stopping:
            sentinels = {p.sentinel: ("worker", i) for i, p in enumerate(self.workers) if p}
            sentinels.update({h.sentinel: ("host", i) for i, h in enumerate(self.hosts)})
            buses = {c: i for i, c in enumerate(self.buses) if c is not None}
            starting = {h.status: i for i, h in enumerate(self.hosts) if h.pid is None}
            ready = wait([self._wake_r, *sentinels, *buses, *starting])
            for obj in ready:
                if obj == self._wake_r:
                    os.read(self._wake_r, 64)
                    log.info("signal received: shutting down (again to force)")
                    self.stopping = True
                elif obj in buses:
                    self._relay(buses[obj], obj)
                elif obj in starting:
                    self._host_started(starting[obj])
                else:
                    assert isinstance(obj, int)  # a process sentinel
                    kind, i = sentinels[obj]
                    if kind == "worker":
                        self._worker_exited(i)
                    else:
                        self._host_exited(i)

    def _relay(self, i: int, conn: Connection) -> None:
        """Worker ``i`` finished a turn (``conn``, its bus, is readable): pass it to the others.
        Nothing when that bus was closed or replaced earlier in the same wake-up (the worker's
        exit, handled first, closes it and may start a new worker with a new bus)."""
        if self.buses[i] is not conn:
            return
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            self.buses[i] = None  # its process is ending: the sentinel says how
            return
        for j, other in enumerate(self.buses):
            if j != i and other is not None:
                try:
                    other.send_bytes(data)
                except OSError:
                    pass

    def _worker_exited(self, i: int) -> None:
        from prometheus_client import multiprocess

        proc, bus = self.workers[i], self.buses[i]
        assert proc is not None  # its sentinel woke us
        proc.join()
        multiprocess.mark_process_dead(proc.pid, self.metrics_dir)
        self.workers[i] = None
        if bus is not None:
            bus.close()
            self.buses[i] = None
        if self.stopping:
            return
        if proc.exitcode == EXIT_GAVE_UP:
            log.critical("worker %d gave up on a part of the server: stopping", i)
            self._give_up()
        elif proc.exitcode == EXIT_START_FAILED:
            self.exit_code = EXIT_START_FAILED
            self.stopping = True
        elif not self.restarts.allow(time.monotonic()):
            log.critical(
                "worker %d exited (status %s); too many restarts: stopping", i, proc.exitcode
            )
            self._give_up()
        else:
            log.error("worker %d exited (status %s): starting it again", i, proc.exitcode)
            self._start_worker(i)

    def _host_started(self, i: int) -> None:
        """Host ``i`` said whether it serves. One that cannot start stops the server (status 2):
        trying again would fail the same way."""
        try:
            pid = self.hosts[i].read_status()
        except RuntimeError as exc:
            log.critical("%s", exc)
            self.exit_code = EXIT_START_FAILED
            self.stopping = True
            return
        log.info("%s ready (pid %d)", self.hosts[i].what, pid)

    def _host_exited(self, i: int) -> None:
        host = self.hosts[i]
        host.proc.join()
        if self.stopping:
            return
        if host.pid is None:  # before it said Ready (a StartFailed would have been read first)
            self._host_started(i)
            return
        if not self.restarts.allow(time.monotonic()):
            log.critical(
                "%s exited (status %s); too many restarts: stopping", host.what, host.proc.exitcode
            )
            self._give_up()
            return
        log.error("%s exited (status %s): starting another", host.what, host.proc.exitcode)
        self.hosts[i] = self._host_starters[i]()  # the workers reconnect when it is ready

    def _give_up(self) -> None:
        self.exit_code = EXIT_GAVE_UP
        self.stopping = True

    # ------------------------------------------------------------ stop

    def _stop_all(self) -> None:
        """Workers first (each drains its sessions within the grace period), then the hosts."""
        self.stopping = True
        live = [p for p in self.workers if p is not None and p.is_alive()]
        for p in live:
            _terminate(p)
        deadline = time.monotonic() + self.cfg.server.shutdown_grace_s + 10
        forced = self._signals
        while any(p.is_alive() for p in live) and time.monotonic() < deadline:
            wait([p.sentinel for p in live if p.is_alive()] + [self._wake_r], timeout=0.5)
            if self._signals > max(forced, 1):  # another signal: make them exit now
                forced = self._signals
                for p in live:
                    if p.is_alive():
                        _terminate(p)
        for p in live:
            if p.is_alive():
                log.warning("worker pid %d did not stop: killing it", p.pid)
                p.kill()
            p.join(5)
        for host in self.hosts:
            host.stop()
        for sock in self.sockets:
            sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        os.close(self._wake_r)
        os.close(self._wake_w)


def serve(cfg: Config) -> int:
    """``voicert serve`` (the exit status): one server process (``app.run_server``), or with
    ``server.workers`` above 1 the primary of that many worker processes. 2 when it cannot
    start (a message says why), as when the installed websockets cannot serve."""
    import websockets

    if (why := websockets_problem(websockets.__version__)) is not None:
        log.critical("%s", why)
        return 2
    if cfg.server.workers > 1:
        return Primary(cfg).run()
    return run_server(cfg)


def _terminate(proc: mp.process.BaseProcess) -> None:
    """SIGTERM to a started process (a graceful stop within its grace period)."""
    if proc.pid is not None:
        os.kill(proc.pid, signal.SIGTERM)
