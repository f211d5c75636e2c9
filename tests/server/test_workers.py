"""server.workers: 2 worker processes on one port sharing one engine host and, with
``asr.hosts: 2``, a speech host each, run as a user runs it (``voicert serve``) with the embedded
models: turns served by either worker show on every worker's /metrics and dashboard; a killed
worker is started again; a killed speech host is replaced and only its worker reconnects (the
engine's side of that: tests/engine/test_host.py); SIGINT stops every process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from websockets.asyncio.client import connect

from tests.conftest import wav
from tests.server.test_stream import recv_until
from voicert.client import stream_audio
from voicert.protocol import native as p

START_S = 300  # models load in three processes at once on a busy 2-core machine


class ServerProcess:
    """``voicert serve`` in a child process; its log lines collected as they come."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "voicert", "serve", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def wait_for(self, pattern: str, count: int = 1, timeout: float = START_S) -> list[re.Match]:
        """The first ``count`` matches of ``pattern`` in the log (waiting for them)."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = [m for m in map(rx.search, self.lines) if m]
                if len(found) >= count:
                    return found[:count]
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(
                        f"no {count} x {pattern!r} in the log:\n" + "\n".join(self.lines[-40:])
                    )
                self.cond.wait(min(left, 1.0))

    def matches(self, pattern: str) -> list[re.Match]:
        rx = re.compile(pattern)
        with self.cond:
            return [m for m in map(rx.search, self.lines) if m]


@pytest.fixture(scope="module")
def served():
    server = ServerProcess(
        "--port",
        "0",
        "--set",
        "server.workers=2",
        "--set",
        "asr.hosts=2",
        "--set",
        "tts.engine=none",
        "--set",
        "log.level=INFO",
        "--set",
        "server.admission=false",  # (a busy CI machine's lag would close the door: conftest)
    )
    try:
        port = int(server.wait_for(r"listening on ws://[^:]+:(\d+)/")[0].group(1))
        server.wait_for(rf"open http://[^ ]+:{port}/ in a browser")  # the port it took, said
        server.wait_for(r"\[w\d\] voicert\.server\.app: ready$", count=2)
        server.port = port
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        server.proc.wait(30)


def url(server, path="/v1/stream") -> str:
    return f"ws://127.0.0.1:{server.port}{path}"


def get(server, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=30) as r:
        return r.read().decode()


async def text_turn(server, text: str = "What is the capital of France?") -> str:
    """One typed turn on a new connection; the session id."""
    async with connect(url(server)) as ws:
        await ws.send(p.encode(p.SessionStart()))
        sid = (await recv_until(ws, "session.started"))["session_id"]
        await ws.send(p.encode(p.UserText(text)))
        done = await recv_until(ws, "response.done")
        assert done["finish_reason"] == "stop" and done["text"], done
        return sid


def worker_of(server, sid: str) -> int:
    return int(
        server.wait_for(rf"\[w(\d)\] voicert\.agent\.session: turn {sid}/", 1, 60)[0].group(1)
    )


def turns_total(metrics: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("voicert_turns_total{")
    )


async def test_turns_on_either_worker_show_on_every_workers_metrics_and_dashboard(served):
    sessions: dict[int, list[str]] = {0: [], 1: []}
    for _ in range(40):  # the kernel spreads connections over the two workers' sockets
        sid = await text_turn(served)
        sessions[worker_of(served, sid)].append(sid)
        if sessions[0] and sessions[1]:
            break
    assert sessions[0] and sessions[1], sessions
    n = len(sessions[0]) + len(sessions[1])
    # every scrape (a new connection each: either worker answers) counts every worker's turns
    for _ in range(6):
        metrics = get(served, "/metrics")
        assert turns_total(metrics) == n
        assert "voicert_engine_up 1.0" in metrics
    # each dashboard's snapshot holds the turns of both workers (relayed by the primary)
    for _ in range(4):
        async with connect(url(served, "/v1/dashboard")) as ws:
            snapshot = json.loads(await asyncio.wait_for(ws.recv(), 30))
            seen = {t["session_id"] for t in snapshot["turns"]}
            assert set(sessions[0]) | set(sessions[1]) <= seen


async def test_a_dashboard_counts_the_sessions_open_on_every_worker(served):
    async with contextlib.AsyncExitStack() as stack:
        open_on: dict[int, int] = {0: 0, 1: 0}
        for _ in range(40):  # sessions held open until both workers have one
            ws = await stack.enter_async_context(connect(url(served)))
            await ws.send(p.encode(p.SessionStart()))
            sid = (await recv_until(ws, "session.started"))["session_id"]
            await ws.send(p.encode(p.UserText("Hello.")))
            await recv_until(ws, "response.done")
            open_on[worker_of(served, sid)] += 1
            if open_on[0] and open_on[1]:
                break
        total = open_on[0] + open_on[1]
        assert open_on[0] and open_on[1]
        async with connect(url(served, "/v1/dashboard")) as dash:
            for _ in range(20):  # a system message a second: the workers' figures merged
                msg = json.loads(await asyncio.wait_for(dash.recv(), 30))
                if msg["type"] == "system" and msg["sessions"] == total:
                    break
            assert msg["type"] == "system" and msg["sessions"] == total, msg


async def test_a_killed_worker_is_started_again_and_the_port_still_serves(served):
    pids = {
        int(m.group(1)): int(m.group(2))
        for m in served.matches(r"worker (\d) started \(pid (\d+)\)")
    }
    os.kill(pids[1], signal.SIGKILL)
    served.wait_for(r"worker 1 exited \(status -9\): starting it again", timeout=60)
    served.wait_for(r"\[w1\] voicert\.server\.app: ready$", count=2)
    for _ in range(12):  # whichever worker answers, each turn is served
        await text_turn(served, "Name a colour.")
    assert served.proc.poll() is None


def first_speech_hosts(server) -> dict[int, int]:
    """Speech host index -> pid, as the two hosts first said they were ready."""
    found = server.wait_for(r"speech host (\d) ready \(pid (\d+)\)", count=2)
    return {int(m.group(1)): int(m.group(2)) for m in found}


def connected(server, worker: int, pid: int, timeout: float = 120) -> None:
    server.wait_for(
        rf"\[w{worker}\] voicert\.speech\.host: connected to the speech host \(pid {pid}\)",
        timeout=timeout,
    )


async def test_each_worker_has_its_own_speech_host_and_a_killed_one_is_replaced(served):
    hosts = first_speech_hosts(served)
    assert sorted(hosts) == [0, 1] and hosts[0] != hosts[1]
    for w in (0, 1):  # worker w sends to host w mod asr.hosts
        connected(served, w, hosts[w])
    w1_connects = r"\[w1\] voicert\.speech\.host: connected to the speech host"
    before = len(served.matches(w1_connects))  # (a restarted worker 1 connected again)
    os.kill(hosts[0], signal.SIGKILL)
    served.wait_for(r"speech host 0 exited \(status -9\): starting another", timeout=60)
    second = int(served.wait_for(r"speech host 0 ready \(pid (\d+)\)", count=2)[1].group(1))
    connected(served, 0, second)
    assert len(served.matches(w1_connects)) == before  # host 1 was not touched
    # spoken turns go through, whichever worker (and so speech host) takes them
    for _ in range(2):
        result = await stream_audio(url(served), [wav("capital_of_france")], realtime=False)
        assert "france" in result.turns[0].transcript.lower()


def test_sigint_stops_the_workers_and_the_hosts_and_exits_cleanly(served):
    pids = [int(m.group(2)) for m in served.matches(r"worker (\d) started \(pid (\d+)\)")]
    pids += [int(m.group(1)) for m in served.matches(r"host(?: \d)? ready \(pid (\d+)\)")]
    served.proc.send_signal(signal.SIGINT)
    assert served.proc.wait(120) == 0
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        # a zombie of an exited child is not a running process
        with open(f"/proc/{pid}/stat") as f:
            assert f.read().split()[2] == "Z", f"process {pid} still runs"


def test_a_bus_closed_or_replaced_earlier_in_the_same_wakeup_is_not_read():
    # One wake-up can hold a worker's exit and its bus: the exit is handled first, closes the bus
    # and may start a new worker with a new one. Reading the old bus then crashed the supervisor
    # (seen on the GPU box: 'NoneType' object has no attribute 'recv_bytes') or could block on
    # the new one; the relay must skip it and still pass on turns from live buses.
    from multiprocessing import Pipe

    from voicert.server.workers import Primary

    primary = Primary.__new__(Primary)  # the relay only: no processes
    old_worker_end, old_primary_end = Pipe()
    new_worker_end, new_primary_end = Pipe()
    other_worker_end, other_primary_end = Pipe()
    old_worker_end.send_bytes(b"turn from the exited worker")
    primary.buses = [None, other_primary_end]
    primary._relay(0, old_primary_end)  # closed by the exit: skipped, no crash
    primary.buses = [new_primary_end, other_primary_end]
    primary._relay(0, old_primary_end)  # replaced by a new worker's bus: skipped, not read
    assert not new_primary_end.poll() and not other_worker_end.poll()
    new_worker_end.send_bytes(b"a live turn")
    primary._relay(0, new_primary_end)
    assert other_worker_end.recv_bytes() == b"a live turn"  # passed on to the other worker
