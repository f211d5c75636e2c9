"""What makes a server process one of several workers (server/workers.py's primary starts them):
its role (its socket, the engine and speech hosts it uses) and its bus to the primary, which
relays each worker's finished turns and figures to the others' dashboards. The server
(server/app.py) reads these; the primary that hands them over stands above it."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import msgspec

from voicert.telemetry.latency import TurnRecord
from voicert.telemetry.sampler import SystemSample

log = logging.getLogger(__name__)


class PeerTurn(msgspec.Struct, tag=True, array_like=True):
    turn: TurnRecord  # a turn another worker finished


class PeerSample(msgspec.Struct, tag=True, array_like=True):
    worker: int
    sample: SystemSample  # another worker's figures, once a second


class PeerBus:
    """A worker's line to the primary (which relays to the other workers): its finished turns
    and its figures out, the other workers' in (to the dashboards). If the primary goes away,
    ``on_primary_gone`` is called."""

    def __init__(self, conn: Connection, worker: int = 0) -> None:
        self.conn = conn
        self.worker = worker
        self._encoder = msgspec.msgpack.Encoder()
        self._lock = threading.Lock()
        self.on_primary_gone: Callable[[], None] | None = None

    def publish(self, rec: TurnRecord) -> None:
        self._send(PeerTurn(rec))

    def publish_sample(self, sample: SystemSample) -> None:
        self._send(PeerSample(self.worker, sample))

    def _send(self, msg: PeerTurn | PeerSample) -> None:
        try:
            with self._lock:
                self.conn.send_bytes(self._encoder.encode(msg))
        except OSError:
            pass  # the primary is gone: the reader says so

    def start(self, loop, on_peer_turn, on_peer_sample) -> None:
        threading.Thread(
            target=self._read,
            args=(loop, on_peer_turn, on_peer_sample),
            name="voicert-peer-bus",
            daemon=True,
        ).start()

    def _read(self, loop, on_peer_turn, on_peer_sample) -> None:
        decoder = msgspec.msgpack.Decoder(PeerTurn | PeerSample)
        while True:
            try:
                msg = decoder.decode(self.conn.recv_bytes())
            except (EOFError, OSError):
                break
            except msgspec.DecodeError:
                log.exception("peer bus: undecodable message")
                continue
            if isinstance(msg, PeerTurn):
                loop.call_soon_threadsafe(on_peer_turn, msg.turn)
            else:
                loop.call_soon_threadsafe(on_peer_sample, msg.worker, msg.sample)
        if self.on_primary_gone is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.on_primary_gone)


@dataclass
class WorkerRole:
    """What makes a server process one of several workers (the primary hands it over)."""

    index: int
    sock: socket.socket  # its share of the port, bound and listening
    hosts: object | None  # HostAddresses of the engine hosts; None: llm.engine openai
    speech: tuple[str, bytes] | None  # the speech host's address and key; None: its own Whisper
    bus: PeerBus
