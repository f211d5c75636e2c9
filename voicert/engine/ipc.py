"""The typed messages between the server and the engine process (``llm.process``), encoded with
msgspec (msgpack) over a pipe. One union per direction; nothing else crosses.

Server -> engine: :class:`Submit`, :class:`Cancel`, :class:`Stop`.
Engine -> server: :class:`Ready` or :class:`StartFailed` once, then :class:`Events` (one engine
step's records: token ids; the server detokenises), :class:`Stats` (pushed every
``stats_interval_s``: the server never waits for them) and, if the engine thread dies, :class:`Failed` before the process exits.
"""

from __future__ import annotations

from typing import Union

import msgspec

from voicert.core.llm import EngineLoad, GcPause, GenerationRequest, StepRecord
from voicert.engine.base import TokenOut


class Submit(msgspec.Struct, tag=True, array_like=True):
    request: GenerationRequest


class Cancel(msgspec.Struct, tag=True, array_like=True):
    request_id: str


class Stop(msgspec.Struct, tag=True, array_like=True):
    pass


class Ready(msgspec.Struct, tag=True, array_like=True):
    pid: int


class StartFailed(msgspec.Struct, tag=True, array_like=True):
    error: str


class Events(msgspec.Struct, tag=True, array_like=True):
    items: list[TokenOut]  # token ids and final records, in the order they were made
    steps: list[StepRecord] = []  # the engine step(s) that made them (for metrics)


class Stats(msgspec.Struct, tag=True, array_like=True):
    load: EngineLoad
    steps: list[StepRecord]  # engine steps since the last Stats
    gc: list[GcPause]  # the engine process's collector pauses since the last Stats


class Failed(msgspec.Struct, tag=True, array_like=True):
    error: str


ToEngine = Union[Submit, Cancel, Stop]
FromEngine = Union[Ready, StartFailed, Events, Stats, Failed]


class Codec:
    """Encoder and decoders for one end of the pipe (msgspec objects are not shared across
    threads: each thread that sends or receives keeps its own)."""

    def __init__(self) -> None:
        self.encoder = msgspec.msgpack.Encoder()
        self.to_engine = msgspec.msgpack.Decoder(ToEngine)
        self.from_engine = msgspec.msgpack.Decoder(FromEngine)

    def encode(self, msg: ToEngine | FromEngine) -> bytes:
        return self.encoder.encode(msg)
