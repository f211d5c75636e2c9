"""scripts/torch_source.py: where set-up takes torch from. A machine without an NVIDIA GPU gets
the CPU build's index when it answers (a local stand-in index here), pip's own when it does not."""

from __future__ import annotations

import http.server
import importlib.util
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "torch_source.py"
spec = importlib.util.spec_from_file_location("torch_source", SCRIPT)
assert spec is not None and spec.loader is not None
ts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ts)


@pytest.fixture
def index():
    """A stand-in package index that answers every path."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html></html>")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/whl/cpu"
    server.shutdown()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_without_nvidia_the_cpu_index_is_used_when_it_answers(index):
    args, why = ts.choose("Linux", "x86_64", False, index, ts.reachable)
    assert args == ["--index-url", index] and "CPU build" in why


def test_an_unreachable_cpu_index_falls_back_to_pips_own_and_says_so():
    index = f"http://127.0.0.1:{closed_port()}/whl/cpu"
    args, why = ts.choose("Linux", "x86_64", False, index, ts.reachable)
    assert args == [] and "cannot be reached" in why


def test_a_gpu_machine_or_another_platform_keeps_pips_index():
    always = lambda url: True
    assert ts.choose("Linux", "x86_64", True, ts.CPU_INDEX, always)[0] == []
    assert ts.choose("Darwin", "arm64", False, ts.CPU_INDEX, always)[0] == []
    assert ts.choose("Linux", "aarch64", False, ts.CPU_INDEX, always)[0] == []


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the CPU index is for x86-64 Linux")
def test_the_script_prints_pips_arguments_one_a_line(index):
    env = {**os.environ, "VOICERT_TORCH_GPU": "0", "VOICERT_TORCH_INDEX": index}
    out = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.splitlines() == ["--index-url", index]
    env["VOICERT_TORCH_INDEX"] = f"http://127.0.0.1:{closed_port()}/whl/cpu"
    out = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout == "" and "cannot be reached" in out.stderr
