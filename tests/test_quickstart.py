"""docs/quickstart.md, run as a newcomer would: each ```console block's ``$`` commands in order,
from the repository root (a command ending in ``&`` stays running, as the server does), and every
line the page shows must come back, in order, with ``...`` standing for what differs from run to
run. The set-up step is not run here (CI has just run it); the port is a free one."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "quickstart.md"
DOC_PORT = "8765"
STEP_TIMEOUT_S = 300  # a loaded 2-core machine loads the models in well under this


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)

    @property
    def background(self) -> bool:
        return self.command.endswith("&")


def steps(text: str) -> list[Step]:
    """The ``$`` commands of the page's console blocks, each with the lines shown after it."""
    out: list[Step] = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                out.append(Step(line[2:].strip()))
            elif line.strip() and out:
                out[-1].expected.append(line)
    return out


def pattern(line: str) -> re.Pattern:
    """A shown line as a regex: ``...`` matches anything, runs of spaces any spacing."""
    parts = [re.escape(p) for p in line.strip().split("...")]
    return re.compile(r"\s+".join(".*".join(parts).split(r"\ ")))


def unmatched(expected: list[str], output: str) -> list[str]:
    """The shown lines not found in ``output``, each searched for after the previous one's line."""
    lines, at, missing = output.splitlines(), 0, []
    for want in expected:
        rx = pattern(want)
        hit = next((i for i in range(at, len(lines)) if rx.search(lines[i])), None)
        if hit is None:
            missing.append(want)
        else:
            at = hit + 1
    return missing


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def localize(command: str, port: int) -> str:
    """The page's command on this machine: the free port, this interpreter's ``voicert``."""
    bin_dir = Path(sys.executable).parent
    command = command.replace(DOC_PORT, str(port)).removesuffix("&").strip()
    return command.replace(".venv/bin/", f"{bin_dir}/")


def test_the_page_parses_into_the_steps_a_newcomer_takes():
    found = steps(PAGE.read_text())
    assert [s.background for s in found].count(True) == 1  # the server, left running
    assert any("voicert client tests/data/capital_of_france.wav" in s.command for s in found)
    assert all(s.expected for s in found)
    assert pattern("agent: ...Paris...").search("agent: The capital of France is Paris.")
    assert not pattern("you:   What").search("you: Who")


def test_the_quickstart_runs_as_written(tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "VOICERT_SERVER__PORT": str(port),  # the server's port and the client's
        "VOICERT_URL": f"ws://127.0.0.1:{port}/v1/stream",
    }
    servers: list[tuple[subprocess.Popen, Path]] = []
    try:
        for step in steps(PAGE.read_text()):
            command = localize(step.command, port)
            expected = [line.replace(DOC_PORT, str(port)) for line in step.expected]
            if step.background:
                log = tmp_path / f"bg{len(servers)}.log"
                proc = subprocess.Popen(
                    f"exec {command}",
                    shell=True,
                    cwd=ROOT,
                    env=env,
                    stdout=log.open("w"),
                    stderr=subprocess.STDOUT,
                )
                servers.append((proc, log))
                wait_for_lines(proc, log, expected)
                continue
            done = subprocess.run(
                command,
                shell=True,
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=STEP_TIMEOUT_S,
            )
            said = done.stdout + done.stderr
            assert not unmatched(expected, said), f"$ {step.command}\n{said}"
            assert "Traceback" not in said, said
    finally:
        for proc, _log in servers:
            proc.send_signal(signal.SIGINT)  # Ctrl-C, as the page says
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
    for proc, log in servers:
        assert proc.returncode == 0 and "Traceback" not in log.read_text(), log.read_text()


def wait_for_lines(proc: subprocess.Popen, log: Path, expected: list[str]) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while unmatched(expected, log.read_text()):
        assert proc.poll() is None, f"exited early:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"not all of {expected} in:\n{log.read_text()}"
        time.sleep(0.2)
