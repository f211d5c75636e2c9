"""SpeechOut (agent/speech_out.py) on a fake TTS worker: no voice, no sockets."""

from __future__ import annotations

import asyncio

import numpy as np

from voicert.agent.speech_out import SpeechOut
from voicert.protocol.native import OutputAudio
from voicert.speech.tts import TtsJob
from voicert.telemetry.latency import TurnTrace


class HeldWorker:
    """Takes pieces and keeps them: the test plays the TTS thread."""

    def __init__(self) -> None:
        self.jobs: list[TtsJob] = []

    def lane(self):
        return self

    def rate_of(self, voice):
        return 16000

    def submit(self, job: TtsJob, piece_index: int) -> TtsJob:
        self.jobs.append(job)
        return job


def test_a_piece_finishing_after_the_event_loop_closed_is_dropped_quietly():
    worker = HeldWorker()

    async def start() -> SpeechOut:
        async def send(out) -> None:
            pass

        out = SpeechOut(worker, OutputAudio("pcm16", 16000), send, TurnTrace(1))
        out.feed("A reply that is still being spoken. ")
        out.cancel()
        return out

    loop = asyncio.new_event_loop()
    loop.run_until_complete(start())
    loop.close()
    job = worker.jobs[0]  # the TTS thread speaks on after the loop is gone
    job.on_chunk(np.zeros(160, np.float32))
    job.on_done(None)
