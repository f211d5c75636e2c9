"""Streaming Silero VAD through onnxruntime, batched across sessions.

One :class:`SileroVad` holds the ONNX session (the model the ``silero-vad`` package ships, MIT; its
inputs have a batch dimension: one call scores one 32 ms window for each of B streams). Each session
owns a :class:`VadStream` (framing, and its recurrent state and audio context in a
:class:`VadState`). A :class:`VadBatcher` on the event loop gathers the windows sessions complete
(those of one loop iteration, or, under load, all that arrived while the last batch ran) and
scores them with one model call per window position, so the cost grows far slower than the
number of sessions; a stream's probabilities are exactly
those it would get scored alone (the rows do not mix: tests/speech/test_vad.py).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np
import onnxruntime

SAMPLE_RATE = 16000
FRAME = 512  # samples per VAD window: 32 ms at 16 kHz
CONTEXT = 64  # samples of the previous window the model sees in front of each window
STATE = 128
_SR = np.array(SAMPLE_RATE, np.int64)


def silero_model_path() -> str:
    """The batched Silero VAD ONNX file inside the installed ``silero-vad`` package.

    Found without importing the package: its import runs ``torch.set_num_threads(1)``, and torch
    then gives every thread that starts its work afterwards (the engine's) one thread."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "Silero VAD needs the package silero-vad (pip install --no-deps silero-vad)"
        )
    path = os.path.join(spec.submodule_search_locations[0], "data", "silero_vad.onnx")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no Silero VAD ONNX model at {path}")
    return path


@dataclass(slots=True)
class VadState:
    """One stream's recurrent state and the tail of its last window."""

    state: np.ndarray = field(default_factory=lambda: np.zeros((2, 1, STATE), np.float32))
    context: np.ndarray = field(default_factory=lambda: np.zeros(CONTEXT, np.float32))


class SileroVad:
    """The shared model (``InferenceSession.run`` is thread-safe)."""

    def __init__(self, path: str | None = None, threads: int = 1) -> None:
        opts = onnxruntime.SessionOptions()
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = threads
        opts.log_severity_level = 4
        self.session = onnxruntime.InferenceSession(
            path or silero_model_path(), providers=["CPUExecutionProvider"], sess_options=opts
        )

    def score(self, windows: np.ndarray, states: list[VadState]) -> np.ndarray:
        """One window for each of B streams: windows [B, FRAME] float32 -> probabilities [B].
        Updates each stream's state and context in place."""
        contexts = np.stack([s.context for s in states])  # [B, CONTEXT]
        x = np.concatenate([contexts, windows], axis=1).astype(np.float32, copy=False)  # [B, 576]
        h = np.concatenate([s.state for s in states], axis=1)  # [2, B, STATE]
        out, h = self.session.run(
            None, {"input": x, "state": h, "sr": _SR}
        )  # [B, 1], [2, B, STATE]
        for i, s in enumerate(states):
            s.state = h[:, i : i + 1].copy()
            s.context = windows[i, -CONTEXT:].copy()
        return out.reshape(-1)

    def probs(self, windows: np.ndarray, state: VadState) -> np.ndarray:
        """One stream: windows [W, FRAME] consecutive audio -> probabilities [W] (W calls)."""
        return np.array(
            [self.score(windows[i : i + 1], [state])[0] for i in range(len(windows))], np.float32
        )


class VadStream:
    """Per-session framing: push any number of 16 kHz samples, get one probability per full window."""

    def __init__(self, model) -> None:
        self.model = model
        self.state = VadState()
        self._pending = np.zeros(0, np.float32)
        self.windows_done = 0

    def frame(self, samples: np.ndarray) -> np.ndarray:
        """samples [N] float32 16 kHz -> the windows [W, FRAME] they complete (W may be 0)."""
        buf = np.concatenate([self._pending, samples]) if self._pending.size else samples
        n = buf.size // FRAME
        self._pending = buf[n * FRAME :].copy()
        self.windows_done += n
        return buf[: n * FRAME].reshape(n, FRAME)

    def push(self, samples: np.ndarray) -> np.ndarray:
        """samples [N] -> probabilities [W] for the windows completed, scored here and now."""
        windows = self.frame(samples)
        if not len(windows):
            return np.zeros(0, np.float32)
        return self.model.probs(windows, self.state)

    async def push_batched(self, samples: np.ndarray, batcher: VadBatcher) -> np.ndarray:
        """As :meth:`push`, scored together with every other session's windows of this tick."""
        windows = self.frame(samples)
        if not len(windows):
            return np.zeros(0, np.float32)
        return await batcher.score(self.state, windows)


@dataclass(slots=True)
class _Job:
    state: VadState
    windows: np.ndarray  # [W, FRAME]
    done: asyncio.Future


class VadBatcher:
    """Scores the windows sessions submit together: window k of every job goes into the k-th
    model call of a batch. With an ``executor`` the calls run there (the loop stays free;
    onnxruntime releases the GIL), at most ``in_flight`` batches at a time (the executor's
    threads): windows that arrive while that many batches run wait and go together in the next
    one, as soon as one finishes. So under load each batch grows to what arrived during the last
    one instead of many small calls queueing in the pool, and a window waits at most about two
    batch times. Without one, each loop iteration's windows are scored on the loop.

    Contract: a stream submits its next windows only after its previous ones were scored (a
    session awaits each frame), so a stream is in at most one job at a time."""

    def __init__(
        self, model: SileroVad, executor: Executor | None = None, in_flight: int = 1
    ) -> None:
        self.model = model
        self.executor = executor
        self.in_flight = max(1, in_flight)
        self._jobs: list[_Job] = []
        self._scheduled = False  # a flush is due on the loop
        self._running = 0  # batches in the executor
        self.batches = 0  # model calls made (for metrics and tests)
        self.rows = 0  # windows scored

    def score(self, state: VadState, windows: np.ndarray) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        job = _Job(state, windows, loop.create_future())
        self._jobs.append(job)
        self._schedule(loop)
        return job.done

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        """Flush after every task already woken this iteration, unless one is due already or
        every batch slot is taken (then the batch that finishes first flushes)."""
        if self._jobs and not self._scheduled and self._running < self.in_flight:
            self._scheduled = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        jobs, self._jobs = self._jobs, []
        if not jobs:
            return
        if self.executor is None:
            self._finish(jobs, self._run, jobs)
            return
        loop = asyncio.get_running_loop()
        self._running += 1
        fut = loop.run_in_executor(self.executor, self._run, jobs)
        fut.add_done_callback(lambda f: self._done(jobs, f, loop))

    def _done(self, jobs: list[_Job], fut: asyncio.Future, loop) -> None:
        self._running -= 1
        self._finish(jobs, fut.result)
        self._schedule(loop)  # what arrived meanwhile goes now, as one batch

    @staticmethod
    def _finish(jobs: list[_Job], result, *args) -> None:
        try:
            probs = result(*args)
        except BaseException as exc:  # every waiting session hears of it
            for job in jobs:
                if not job.done.done():
                    job.done.set_exception(exc)
            return
        for job, p in zip(jobs, probs):
            if not job.done.done():
                job.done.set_result(p)

    def _run(self, jobs: list[_Job]) -> list[np.ndarray]:
        """Window position by window position: one model call for all jobs that have one."""
        out = [np.zeros(len(j.windows), np.float32) for j in jobs]
        for k in range(max(len(j.windows) for j in jobs)):
            rows = [i for i, j in enumerate(jobs) if len(j.windows) > k]
            probs = self.model.score(
                np.stack([jobs[i].windows[k] for i in rows]), [jobs[i].state for i in rows]
            )
            for i, p in zip(rows, probs):
                out[i][k] = p
            self.batches += 1
            self.rows += len(rows)
        return out
