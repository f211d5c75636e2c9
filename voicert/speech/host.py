"""One Whisper shared by several server processes (``server.workers`` with ``asr.shared``).

With a Whisper per worker, N models take turns on the GPU and each batches only its own
sessions' utterances (docs/benchmarks.md section 16: ASR P99 went from 28 to 831 ms with four
workers at 128 callers). The speech host is a process of its own that loads one
:class:`~voicert.speech.asr.WhisperAsr` (its priority queue and batching as in one process) and
decodes every worker's utterances together. Each worker talks to it through :class:`SharedAsr`,
which has the event-loop side of ``WhisperAsr``'s interface (``submit`` -> a handle with a
``future``, ``started`` and ``drop``; ``pending``, ``alive``), over a Unix socket with typed
messages (below).

With a turn-completion model on a GPU (``turn.device``), the host also judges pauses for every
worker (:class:`HostJudge`): one model and one CUDA context beside Whisper's, not one per
worker, and each call batches the judgements every worker asked for meanwhile.

If the host dies, every open decode fails at once (the session reports ``asr_failed`` for that
turn), the workers say they are not ready, and each reconnects to the host the primary starts in
its place.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Union

import msgspec
import numpy as np

from voicert.config import AsrConfig, ConfigError
from voicert.core.speech import FINAL, AsrBase, SpeechUnavailable, Transcript, TurnAudio
from voicert.hosting import (
    HostFailed,
    HostProcess,
    Peer,
    connect,
    limit_blas_threads,
    listen,
    say_status,
    serve_peers,
)
from voicert.speech.asr import settle_soon
from voicert.telemetry.logs import setup_logging

log = logging.getLogger(__name__)
STATS_INTERVAL_S = 0.5
EXIT_ASR_DIED = 71  # the host's exit status when its Whisper thread gave up


class Decode(msgspec.Struct, tag=True, array_like=True):
    job: int  # the worker's own id for it
    audio: bytes  # [N] float32 16 kHz, little-endian
    priority: int  # speech.asr FINAL | EARLY | PARTIAL


class Drop(msgspec.Struct, tag=True, array_like=True):
    job: int


class Leave(msgspec.Struct, tag=True, array_like=True):
    pass


class Hello(msgspec.Struct, tag=True, array_like=True):
    pid: int


class Taken(msgspec.Struct, tag=True, array_like=True):
    job: int


class Decoded(msgspec.Struct, tag=True, array_like=True):
    job: int
    transcript: Transcript


class DecodeFailed(msgspec.Struct, tag=True, array_like=True):
    job: int
    error: str


class Judge(msgspec.Struct, tag=True, array_like=True):
    job: int
    audio: bytes  # [N] float32 16 kHz, little-endian: the utterance up to the pause


class Judged(msgspec.Struct, tag=True, array_like=True):
    job: int
    prob: float  # the audio model's P(turn complete)
    pause: float | None = None  # its pause head's (core/speech.py TurnAudio; None: no head)


class JudgeFailed(msgspec.Struct, tag=True, array_like=True):
    job: int
    error: str


class AsrStats(msgspec.Struct, tag=True, array_like=True):
    pending: int  # utterances queued in the host (all workers')
    batches: list[int]  # decode batch sizes since the last (to one worker only)


ToHost = Union[Decode, Drop, Leave, Judge]
FromHost = Union[Hello, Taken, Decoded, DecodeFailed, AsrStats, Judged, JudgeFailed]


def host_judges(cfg) -> bool:
    """The speech host (``asr.shared`` with several workers) runs the turn model for every
    worker: where it runs on a GPU (``turn.device``), one model and one batch for all."""
    audio_model = cfg.turn.detector != "silence" and cfg.turn.model != "none"
    return audio_model and cfg.turn.device != "cpu" and cfg.asr.shared and cfg.server.workers > 1


# ------------------------------------------------------------------ the host process


class _Judges:
    """Every worker's pending judgements, scored by one thread: each model call takes all that
    are waiting (at most ``max_batch``), so a call grows to what arrived during the last."""

    def __init__(self, model, max_batch: int = 64) -> None:
        self.model = model
        self.max_batch = max_batch
        self._cond = threading.Condition()
        self._waiting: list[tuple[Peer, int, np.ndarray]] = []
        self._closed = False
        threading.Thread(target=self._run, name="voicert-speech-judge", daemon=True).start()

    def submit(self, peer: Peer, msg: Judge) -> None:
        with self._cond:
            self._waiting.append((peer, msg.job, np.frombuffer(msg.audio, np.float32)))
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch = [w for w in self._waiting[: self.max_batch] if not w[0].gone]
                self._waiting = self._waiting[self.max_batch :]
            if not batch:
                continue
            try:
                opinions = self.model.opinions([audio for _, _, audio in batch])
            except Exception as exc:  # every judgement of the call fails; the sessions go on
                log.exception("speech host: the turn-completion model failed")
                for peer, job, _ in batch:
                    peer.post(JudgeFailed(job, f"{type(exc).__name__}: {exc}"))
                continue
            for (peer, job, _), op in zip(batch, opinions):
                peer.post(Judged(job, op.complete, op.pause))


class _Hub:
    def __init__(self, asr, judges: _Judges | None = None) -> None:
        self.asr = asr
        self.judges = judges
        self.lock = threading.Lock()
        self.peers: dict[int, Peer] = {}
        self._ids = itertools.count()

    def join(self, conn: Connection) -> None:
        """A worker connected (the accepting thread): it gets a receiving thread."""
        with self.lock:
            cid = next(self._ids)
            peer = self.peers[cid] = Peer(cid, conn)
            peer.post(Hello(os.getpid()))
        threading.Thread(
            target=self.serve, args=(peer,), daemon=True, name=f"voicert-speech-recv-{cid}"
        ).start()
        log.info("speech host: worker connection %d", cid)

    def serve(self, peer: Peer) -> None:
        """One worker's decodes into the shared queue until it hangs up."""
        decoder = msgspec.msgpack.Decoder(ToHost)
        dropped: set[int] = set()  # its jobs it no longer wants (if still queued: skipped)
        while True:
            try:
                msg = decoder.decode(peer.conn.recv_bytes())
            except (EOFError, OSError):
                break
            except msgspec.DecodeError as exc:  # our own workers send these: a bug, said loudly
                log.error(
                    "speech host: undecodable message from worker connection %d: %s", peer.cid, exc
                )
                break
            if isinstance(msg, Decode):
                self._decode(peer, msg, dropped)
            elif isinstance(msg, Drop):
                dropped.add(msg.job)
            elif isinstance(msg, Judge):
                if self.judges is None:  # a worker configured unlike the host: a bug
                    peer.post(JudgeFailed(msg.job, "this speech host has no turn model"))
                else:
                    self.judges.submit(peer, msg)
            elif isinstance(msg, Leave):
                break
        with self.lock:
            self.peers.pop(peer.cid, None)
        peer.gone = True  # its queued jobs are withdrawn as the worker thread reaches them
        peer.close()
        log.info("speech host: worker connection %d closed", peer.cid)

    def _decode(self, peer: Peer, msg: Decode, dropped: set) -> None:
        job = msg.job
        audio = np.frombuffer(msg.audio, np.float32)  # [N]

        def settle(result: Transcript | None, exc: BaseException | None) -> None:
            dropped.discard(job)
            if exc is None and result is not None:
                peer.post(Decoded(job, result))
            else:
                peer.post(DecodeFailed(job, f"{type(exc).__name__}: {exc}"))

        try:
            self.asr.submit_job(
                audio,
                msg.priority,
                settle,
                lambda: peer.gone or job in dropped,
                lambda: peer.post(Taken(job)),
            )
        except Exception as exc:  # the worker thread is closed or gone
            settle(None, exc)

    def push_stats(self, stop: threading.Event) -> None:
        while not stop.wait(STATS_INTERVAL_S):
            pending = self.asr.pending()
            with self.lock:
                peers = [self.peers[c] for c in sorted(self.peers)]
            for i, peer in enumerate(peers):  # batch sizes to the first only: counted once
                peer.post(AsrStats(pending, self.asr.drain_batch_sizes() if i == 0 else []))


def _speech_host(
    asr_cfg,
    model_spec: str,
    address: str,
    authkey: bytes,
    gpu: str | None,
    log_level: str,
    blas_threads: int,
    judge: tuple[str, str, str] | None,
    status: Connection,
) -> None:
    """The speech host process: load and warm Whisper (and the turn model ``judge`` names:
    (its path, "" for the wheel's; its device; its ``turn.audio_head``)), listen at ``address``, say so on ``status``,
    decode and judge for every worker until the primary says stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup_logging(log_level, "%(asctime)s %(levelname)s [speech] %(name)s: %(message)s")
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    try:
        limit_blas_threads(blas_threads)  # the log-mel product of every decode runs here
        from voicert.speech.asr import WhisperAsr

        asr = WhisperAsr(asr_cfg, model_spec)
        asr.warmup()
        asr.drain_batch_sizes()  # the warm-up's decode is no one's
        judges = None
        if judge is not None:
            from voicert.speech import smart_turn

            model = smart_turn.load(*judge)
            model.score([np.zeros(16000, np.float32)])  # warm: the first caller's is not slow
            judges = _Judges(model)
            head = " with its pause head" if model.head is not None else ""
            log.info("speech host: turn model %s%s on %s", model.path.name, head, judge[1])
        listener = listen(address, authkey)
    except Exception as exc:
        say_status(status, HostFailed(f"{type(exc).__name__}: {exc}"))
        return
    asr.on_give_up = lambda why: os._exit(EXIT_ASR_DIED)
    hub = _Hub(asr, judges)
    serve_peers(listener, status, "speech host", hub.join, hub.push_stats)
    if judges is not None:
        judges.close()
    asr.close()


def check_speech_gpus(asr_cfg: AsrConfig, count: Callable[[], int] | None = None) -> None:
    """Before starting them: ``asr.hosts`` above 1 on ``asr.device: cuda`` puts host i on GPU i
    alone, so this machine needs at least that many GPUs. ``count``: how many it has (default:
    CTranslate2's count, as each host's Whisper sees them). Raises ConfigError naming
    asr.hosts; else a host past the last GPU would fail only once started."""
    if asr_cfg.hosts <= 1 or asr_cfg.device != "cuda":
        return
    if count is None:
        import ctranslate2

        count = ctranslate2.get_cuda_device_count
    have = count()
    if have < asr_cfg.hosts:
        fix = f"set asr.hosts to at most {have}" if have else "use asr.device: cpu (or auto)"
        raise ConfigError(
            f"asr.hosts: {asr_cfg.hosts} speech hosts on asr.device cuda need a GPU each, but "
            f"CTranslate2 sees {have}; {fix}"
        )


def start_speech_host(
    asr_cfg,
    model_spec: str,
    address: str,
    authkey: bytes,
    log_level: str = "INFO",
    blas_threads: int = 1,
    judge: tuple[str, str, str] | None = None,
    index: int | None = None,
) -> HostProcess:
    """Start the speech host serving at ``address`` (the primary's handle); ``blas_threads``:
    numpy's BLAS pool in it (``server.blas_threads``); ``judge``: the turn model it runs for
    the workers, (path or "", device, audio head), or None; ``index``: which of
    ``asr.hosts`` it is (None: the only one). On cuda, host ``index`` sees GPU ``index`` alone
    (``CUDA_VISIBLE_DEVICES``)."""
    gpu = str(index) if index is not None and asr_cfg.device == "cuda" else None
    return HostProcess(
        "speech host" if index is None else f"speech host {index}",
        _speech_host,
        (asr_cfg, model_spec, address, authkey, gpu, log_level, blas_threads, judge),
    )


# ------------------------------------------------------------------ the worker's side


class RemoteAsrHandle:
    """A decode in the speech host. Await ``future`` for the Transcript. ``started`` turns True
    when the host says it took the job (a moment after it did)."""

    def __init__(self, owner: SharedAsr, job: int, future: asyncio.Future) -> None:
        self._owner = owner
        self.job = job
        self.future = future
        self.started = False

    def drop(self) -> bool:
        """Withdraw it; False if the host has (said it has) taken it already. A job the host took
        meanwhile is decoded and its result ignored."""
        if self.started:
            return False
        self.future.cancel()
        self._owner._send(Drop(self.job))
        return True


class SharedAsr(AsrBase):
    """A worker's :class:`~voicert.core.speech.Asr`: the speech host at ``address``. The constructor waits up to
    ``connect_timeout_s`` for it (it may still be loading); after that, a host that goes away is
    reconnected to in the background (``alive`` False meanwhile; decodes fail at once), for as
    long as the worker lives (the primary restarts the host; ``on_give_up`` is never called)."""

    def __init__(self, address: str, authkey: bytes, connect_timeout_s: float = 600) -> None:
        self.address, self.authkey = address, authkey
        self._lock = threading.Lock()  # guards _conn, _jobs, and writing
        self._jobs: dict[int, tuple[asyncio.AbstractEventLoop, RemoteAsrHandle]] = {}
        self._judges: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._ids = itertools.count()
        self._encoder = msgspec.msgpack.Encoder()
        self._pending = 0
        self._batches: collections.deque[int] = collections.deque(maxlen=4096)
        self._closing = False
        self.pid = 0
        self._conn: Connection | None = self._connect(connect_timeout_s)
        self._log_connected()
        self._reader = threading.Thread(
            target=self._read, name="voicert-speech-events", daemon=True
        )
        self._reader.start()

    def _connect(self, timeout_s: float) -> Connection:
        conn = connect(self.address, self.authkey, timeout_s)
        if not conn.poll(max(timeout_s, 1.0)):
            conn.close()
            raise RuntimeError(f"speech host at {self.address} did not say hello")
        hello = msgspec.msgpack.decode(conn.recv_bytes(), type=FromHost)
        if not isinstance(hello, Hello):
            conn.close()
            raise RuntimeError(f"speech host at {self.address} answered {type(hello).__name__}")
        self.pid = hello.pid
        return conn

    def _log_connected(self) -> None:
        """Logged once the connection is in use (``alive``): a line a supervisor or a test may wait
        on before sending work."""
        log.info("connected to the speech host (pid %d)", self.pid)

    # ------------------------------------------------------------ the event-loop side

    def submit(self, audio: np.ndarray, priority: int = FINAL) -> RemoteAsrHandle:
        """Queue an utterance ([N] float32 16 kHz); the handle's future gives its Transcript."""
        loop = asyncio.get_running_loop()
        handle = RemoteAsrHandle(self, next(self._ids), loop.create_future())
        msg = Decode(handle.job, np.ascontiguousarray(audio, np.float32).tobytes(), priority)
        if not self._send_tracked(self._jobs, handle.job, (loop, handle), msg):
            handle.future.set_exception(SpeechUnavailable("speech host unavailable"))
        return handle

    def _send_tracked(self, table: dict, job: int, entry: tuple, msg) -> bool:
        """Send ``msg`` with ``entry`` kept in ``table`` under ``job`` until its answer comes
        (or the host goes away); False, and nothing kept, when the host cannot be reached."""
        with self._lock:
            if self._conn is not None:
                table[job] = entry
                try:
                    self._conn.send_bytes(self._encoder.encode(msg))
                    return True
                except OSError:
                    table.pop(job, None)
        return False

    def judge(self, audio: np.ndarray) -> asyncio.Future:
        """The host's turn model's :class:`TurnAudio` for an utterance ([N] float32 16 kHz), as
        a future."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        job = next(self._ids)
        msg = Judge(job, np.ascontiguousarray(audio, np.float32).tobytes())
        if not self._send_tracked(self._judges, job, (loop, future), msg):
            future.set_exception(SpeechUnavailable("speech host unavailable"))
        return future

    def _send(self, msg) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.send_bytes(self._encoder.encode(msg))
                except OSError:
                    pass

    def pending(self) -> int:
        """Utterances queued in the host, every worker's (as it last said)."""
        return self._pending

    @property
    def alive(self) -> bool:
        return self._conn is not None

    def drain_batch_sizes(self) -> list[int]:
        out = []
        while self._batches:
            out.append(self._batches.popleft())
        return out

    def warmup(self) -> None:
        """The host warmed up before it said it was ready."""

    def close(self) -> None:
        self._closing = True
        self._send(Leave())
        self._reader.join(5)

    # ------------------------------------------------------------ the reader thread

    def _read(self) -> None:
        decoder = msgspec.msgpack.Decoder(FromHost)
        while not self._closing:
            conn = self._conn
            if conn is None:  # (a reconnect that gave up: closing)
                break
            try:
                while True:
                    self._on(decoder.decode(conn.recv_bytes()))
            except (EOFError, OSError, msgspec.DecodeError):
                pass
            with self._lock:
                self._conn = None
                jobs, self._jobs = self._jobs, {}
                judges, self._judges = self._judges, {}
            conn.close()
            why = "speech host went away"
            for loop, handle in jobs.values():
                settle_soon(loop, handle.future, None, SpeechUnavailable(why))
            for loop, future in judges.values():
                settle_soon(loop, future, None, SpeechUnavailable(why))
            if self._closing:
                return
            log.error("%s: %d decode(s) failed; reconnecting", why, len(jobs))
            self._reconnect()

    def _reconnect(self) -> None:
        while not self._closing:
            try:
                conn = self._connect(5.0)
            except (RuntimeError, OSError):
                time.sleep(0.5)
                continue
            with self._lock:
                self._conn = conn
            self._log_connected()
            return

    def _on(self, msg) -> None:
        if isinstance(msg, Taken):
            with self._lock:
                entry = self._jobs.get(msg.job)
            if entry is not None:
                entry[1].started = True
        elif isinstance(msg, (Decoded, DecodeFailed)):
            with self._lock:
                entry = self._jobs.pop(msg.job, None)
            if entry is not None:
                loop, handle = entry
                if isinstance(msg, Decoded):
                    settle_soon(loop, handle.future, msg.transcript, None)
                else:
                    settle_soon(loop, handle.future, None, RuntimeError(msg.error))
        elif isinstance(msg, (Judged, JudgeFailed)):
            with self._lock:
                waiting = self._judges.pop(msg.job, None)
            if waiting is not None:
                loop, future = waiting
                if isinstance(msg, Judged):
                    settle_soon(loop, future, TurnAudio(msg.prob, msg.pause), None)
                else:
                    settle_soon(loop, future, None, RuntimeError(msg.error))
        elif isinstance(msg, AsrStats):
            self._pending = msg.pending
            self._batches.extend(msg.batches)


class HostJudge:
    """A worker's turn judge (:class:`~voicert.speech.smart_turn.Judge`): the speech host's
    model, over the worker's connection to it (``SharedAsr``)."""

    def __init__(self, asr: SharedAsr) -> None:
        self.asr = asr

    async def score(self, audio: np.ndarray) -> TurnAudio:
        return await self.asr.judge(audio)
