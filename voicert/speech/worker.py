"""Worker threads that serve jobs by priority from one queue, shared by the ASR and TTS workers.

Jobs wait in a heap keyed by (priority, arrival): lower priorities run first, equal ones in
order. A free thread takes the most urgent job, optionally waits ``batch_window_s`` for more and
takes up to ``max_batch`` of the same priority, and hands them to :meth:`PriorityWorker.handle`.
With ``threads`` above 1 no job waits while a thread is idle (one queue, not one per thread).
``urgent_threads`` more threads take only jobs of priority 0 (a reply's first piece of speech):
those never wait behind a queue of later work that holds every other thread.

Supervised: a job that raises fails alone (:meth:`PriorityWorker.fail`, then the next job); if a
thread itself dies, its jobs are failed and a new thread takes its place, at most
``max_restarts`` times in all, after which ``alive`` is False (readiness says 503) and
``on_give_up`` tells the server, which exits non-zero rather than leave turns waiting on a worker
that is gone.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from voicert.core.speech import SpeechUnavailable

log = logging.getLogger(__name__)
J = TypeVar("J")


class WorkerClosed(SpeechUnavailable):
    """The worker was closed before the job ran."""


class PriorityWorker(Generic[J]):
    def __init__(
        self,
        name: str,
        max_batch: int = 1,
        batch_window_s: float = 0.0,
        max_restarts: int = 5,
        threads: int = 1,
        urgent_threads: int = 0,
    ) -> None:
        self.name = name
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self.max_restarts = max_restarts
        self.restarts = 0
        self.on_give_up: Callable[[str], None] | None = None
        self._heap: list[tuple[int, int, J]] = []
        self._cv = threading.Condition()
        self._seq = itertools.count()
        self._closed = False
        self._gone = False  # the thread died more often than allowed
        self._general = max(1, threads)  # slots below this take any job; the rest, priority 0
        self._threads = [self._spawn(i) for i in range(self._general + max(0, urgent_threads))]

    # ------------------------------------------------------------ for subclasses

    def handle(self, jobs: list[J]) -> None:
        """Run the taken jobs (the worker thread). An exception fails them all (:meth:`fail`)."""
        raise NotImplementedError

    def fail(self, job: J, exc: BaseException) -> None:
        """Tell a job's owner it will not run (the worker thread, or the closing thread)."""
        raise NotImplementedError

    def taken(self, job: J) -> None:
        """Called for each job as the thread takes it, under the queue's lock."""

    # ------------------------------------------------------------ any thread

    def put(self, job: J, priority: int) -> J:
        with self._cv:
            if self._closed or self._gone:
                raise WorkerClosed(f"{self.name} worker is {'closed' if self._closed else 'down'}")
            heapq.heappush(self._heap, (priority, next(self._seq), job))
            if len(self._threads) > self._general:
                self._cv.notify_all()  # a woken urgent thread leaves a later job to the others
            else:
                self._cv.notify()
        return job

    def pending(self) -> int:
        with self._cv:
            return len(self._heap)

    @property
    def threads(self) -> int:
        return len(self._threads)

    @property
    def alive(self) -> bool:
        return not self._gone and all(t.is_alive() for t in self._threads)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            queued = [job for _, _, job in self._heap]
            self._heap.clear()
            self._cv.notify_all()
        for job in queued:
            self.fail(job, WorkerClosed(f"{self.name} worker closed"))
        for thread in list(self._threads):
            thread.join(10)

    # ------------------------------------------------------------ the worker thread

    def _spawn(self, slot: int) -> threading.Thread:
        suffix = f"-{slot}" if slot else ""
        thread = threading.Thread(
            target=self._run, args=(slot,), name=f"voicert-{self.name}{suffix}", daemon=True
        )
        thread.start()
        return thread

    def _take(self, slot: int) -> list[J] | None:
        urgent_only = slot >= self._general
        with self._cv:
            while not self._closed and (not self._heap or (urgent_only and self._heap[0][0] > 0)):
                self._cv.wait()
            if self._closed:
                return None
            deadline = time.monotonic() + self.batch_window_s
            while len(self._heap) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                self._cv.wait(left)
                if self._closed:
                    return None
            priority, _, first = heapq.heappop(self._heap)
            jobs = [first]
            while self._heap and len(jobs) < self.max_batch and self._heap[0][0] == priority:
                jobs.append(heapq.heappop(self._heap)[2])
            for job in jobs:
                self.taken(job)
            return jobs

    def _run(self, slot: int) -> None:
        held: list[J] = []  # the jobs this thread holds, failed with it if it dies
        try:
            while (jobs := self._take(slot)) is not None:
                held = jobs
                try:
                    self.handle(jobs)
                except Exception as exc:  # these jobs fail; the worker keeps serving
                    log.exception("%s worker: a job failed", self.name)
                    for job in jobs:
                        self.fail(job, exc)
                held = []
        except BaseException as exc:  # the thread itself is dying: fail what it held, replace it
            log.exception("%s worker thread died", self.name)
            for job in held:
                self.fail(job, exc)
            self._replace(slot, f"{type(exc).__name__}: {exc}")

    def _replace(self, slot: int, why: str) -> None:
        with self._cv:
            if self._closed:
                return
            if self.restarts >= self.max_restarts:
                self._gone = True
                queued = [job for _, _, job in self._heap]
                self._heap.clear()
            else:
                self.restarts += 1
                self._threads[slot] = self._spawn(slot)
                log.warning("%s worker restarted (restart %d)", self.name, self.restarts)
                return
        for job in queued:
            self.fail(job, WorkerClosed(f"{self.name} worker is down: {why}"))
        log.critical("%s worker cannot be kept up: %s", self.name, why)
        if self.on_give_up is not None:
            self.on_give_up(f"{self.name} worker: {why}")
