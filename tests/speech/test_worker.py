"""The shared priority worker (ASR and TTS): priority order, batching by priority, a failing job
fails alone, a dying thread is replaced, and one that keeps dying gives up and says so."""

from __future__ import annotations

import threading

import pytest

from voicert.speech.worker import PriorityWorker, WorkerClosed


class Recorder(PriorityWorker[str]):
    def __init__(self, **kw) -> None:
        self.gate = threading.Event()
        self.batches: list[list[str]] = []
        self.failed: dict[str, BaseException] = {}
        self.done = threading.Event()
        self.expect = 0
        self.took = threading.Event()
        super().__init__("test", **kw)

    def taken(self, job):
        self.took.set()

    def handle(self, jobs):
        self.gate.wait(10)
        if "raise" in jobs:
            raise ValueError("bad job")
        if "die" in jobs:
            raise SystemExit("thread killed")  # escapes the per-job guard, like a bug would
        self.batches.append(jobs)
        self._count(len(jobs))

    def fail(self, job, exc):
        self.failed[job] = exc
        self._count(1)

    def _count(self, n):
        self.expect -= n
        if self.expect <= 0:
            self.done.set()

    def run_all(self, jobs, running=0):
        self.expect = len(jobs) + running
        for job, prio in jobs:
            self.put(job, prio)
        self.gate.set()
        assert self.done.wait(10)


def test_jobs_run_by_priority_then_arrival_and_batch_within_one_priority():
    w = Recorder(max_batch=2)
    try:
        w.put("hold", 0)  # taken at once; waits on the gate while the rest queue up
        assert w.took.wait(10)
        w.run_all(
            [("late-2", 2), ("final-a", 0), ("partial", 5), ("final-b", 0), ("final-c", 0)],
            running=1,
        )
        assert w.batches == [["hold"], ["final-a", "final-b"], ["final-c"], ["late-2"], ["partial"]]
    finally:
        w.close()


def test_a_failing_job_fails_alone_and_the_worker_goes_on():
    w = Recorder()
    try:
        w.run_all([("raise", 0), ("ok", 1)])
        assert isinstance(w.failed["raise"], ValueError) and w.batches == [["ok"]]
        assert w.alive
    finally:
        w.close()


def test_a_dying_thread_fails_its_job_and_is_replaced():
    w = Recorder()
    try:
        w.run_all([("die", 0), ("after", 1)])
        assert isinstance(w.failed["die"], SystemExit) and w.batches == [["after"]]
        assert w.alive and w.restarts == 1
    finally:
        w.close()


def test_a_thread_that_keeps_dying_gives_up_and_says_so():
    w = Recorder(max_restarts=2)
    gave_up, said = [], threading.Event()
    w.on_give_up = lambda why: (gave_up.append(why), said.set())
    w.run_all([("die", 0), ("die", 0), ("die", 0)])
    assert said.wait(10)
    assert not w.alive and "thread killed" in gave_up[0]
    with pytest.raises(WorkerClosed):
        w.put("more", 0)
    w.close()


def test_close_fails_queued_jobs():
    w = Recorder()
    w.put("hold", 0)
    w.put("queued", 1)
    threading.Timer(0.05, w.gate.set).start()
    w.close()
    assert isinstance(w.failed.get("queued"), WorkerClosed)


class Pair(PriorityWorker[str]):
    """Each job waits for a second job to run at the same time (a barrier of two)."""

    def __init__(self, **kw) -> None:
        self.barrier = threading.Barrier(2, timeout=10)
        self.ran: list[str] = []
        self.failed: dict[str, BaseException] = {}
        super().__init__("pair", **kw)

    def handle(self, jobs):
        if "die" in jobs:
            raise SystemExit("thread killed")
        self.barrier.wait()  # BrokenBarrierError unless another thread runs a job meanwhile
        self.ran += jobs

    def fail(self, job, exc):
        self.failed[job] = exc


def test_several_threads_serve_one_queue_at_once_and_a_dying_one_is_replaced():
    w = Pair(threads=2)
    try:
        w.put("die", 0)  # one of the two threads dies; its replacement takes its place
        for job in ("a", "b", "c", "d"):
            w.put(job, 1)
        deadline = threading.Event()
        for _ in range(500):
            if len(w.ran) == 4:
                break
            deadline.wait(0.01)
        assert sorted(w.ran) == ["a", "b", "c", "d"]  # in pairs, two threads at a time
        assert list(w.failed) == ["die"] and w.restarts == 1
        assert w.alive and w.threads == 2
    finally:
        w.close()


class Held(PriorityWorker[str]):
    """Each job but "urgent" waits for ``release``; records which thread ran what."""

    def __init__(self, **kw) -> None:
        self.release = threading.Event()
        self.started: list[tuple[str, str]] = []
        self.ran = threading.Event()
        super().__init__("held", **kw)

    def handle(self, jobs):
        for job in jobs:
            self.started.append((job, threading.current_thread().name))
            if job == "urgent":
                self.ran.set()
            else:
                self.release.wait(10)

    def fail(self, job, exc):
        pass


def test_a_thread_kept_for_urgent_jobs_leaves_later_ones_queued_and_takes_an_urgent_one_at_once():
    w = Held(threads=1, urgent_threads=1)
    try:
        assert w.threads == 2
        w.put("later-1", 1)
        w.put("later-2", 2)
        for _ in range(500):  # the general thread takes later-1 and is held there
            if w.started:
                break
            threading.Event().wait(0.01)
        threading.Event().wait(0.05)
        assert [job for job, _ in w.started] == ["later-1"] and w.pending() == 1  # kept thread idle
        w.put("urgent", 0)
        assert w.ran.wait(10)  # while the general thread is still held
        assert w.started[-1][1] != w.started[0][1]
        assert w.pending() == 1
    finally:
        w.release.set()
        w.close()
