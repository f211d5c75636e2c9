"""The process's logging: chatty libraries stay at warnings whatever ``log.level`` says; lines
are safe to read and keep: secrets masked, a caller's control characters escaped (no forged
lines), tracebacks whole; over a real server at DEBUG, a token presented in the query or a
header never reaches the log."""

import io
import logging

import pytest
from websockets.asyncio.client import connect

from voicert.telemetry.logs import FORMAT, QUIET, SafeFormatter, clean, setup_logging


@pytest.fixture
def unconfigured_torch():
    """The loggers as they are when a Ctrl-C stops ``import torch`` midway: torch's own set-up
    (its logger at WARNING, not propagating) has not run, but its ``atexit`` hook that logs the
    FakeTensor cache statistics at INFO is registered; and the root at INFO (``log.level``)."""
    names = ("", "torch", *QUIET)
    before = {n: (logging.getLogger(n).level, logging.getLogger(n).propagate) for n in names}
    logging.getLogger().setLevel(logging.INFO)  # pytest's root has handlers: basicConfig won't
    logging.getLogger("torch").setLevel(logging.NOTSET)
    logging.getLogger("torch").propagate = True
    yield
    for n, (level, propagate) in before.items():
        logging.getLogger(n).setLevel(level)
        logging.getLogger(n).propagate = propagate


def test_torchs_exit_statistics_are_not_logged_at_info(unconfigured_torch):
    fake = logging.getLogger("torch._subclasses.not_yet_configured")  # as fake_tensor's was
    assert fake.isEnabledFor(logging.INFO)  # what a Ctrl-C during start-up printed
    setup_logging("info")
    assert not fake.isEnabledFor(logging.INFO) and fake.isEnabledFor(logging.WARNING)
    assert not logging.getLogger("faster_whisper.transcribe").isEnabledFor(logging.INFO)


def test_secrets_in_queries_headers_and_bearer_values_are_masked():
    assert clean("< GET /twilio?auth=s3cr3t&x=1 HTTP/1.1") == "< GET /twilio?auth=***&x=1 HTTP/1.1"
    assert clean("GET /v1/stream?token=abc") == "GET /v1/stream?token=***"
    assert clean("< Authorization: Bearer abc.def") == "< Authorization: ***"
    assert clean("< X-Twilio-Signature: zzz=") == "< X-Twilio-Signature: ***"
    assert clean("upstream said: bearer sk-123, retry") == "upstream said: bearer ***, retry"
    assert clean("api_key=sk-9 tokens=12") == "api_key=sk-9 tokens=12"  # not a query: left


def test_a_callers_newline_cannot_forge_a_line():
    sid = "CA1\n2001-01-01 00:00:00,000 CRITICAL voicert: forged\r\x1b[31m"
    out = io.StringIO()
    log = logging.getLogger("test.forged")
    handler = logging.StreamHandler(out)
    handler.setFormatter(SafeFormatter(FORMAT))
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("call %s started", sid)
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed\nfor %s", "x")
    finally:
        log.removeHandler(handler)
    first, *rest = out.getvalue().splitlines()
    assert first.endswith(
        "call CA1\\n2001-01-01 00:00:00,000 CRITICAL voicert: forged\\r\\x1b[31m started"
    )
    assert rest[0].endswith("failed\\nfor x") and rest[1] == "Traceback (most recent call last):"
    assert rest[-1] == "ValueError: boom"  # the traceback keeps its lines


async def test_a_token_presented_to_a_real_server_is_not_logged(url):
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(SafeFormatter(FORMAT))
    root, ws_log = logging.getLogger(), logging.getLogger("websockets")
    level = ws_log.level
    root.addHandler(handler)
    ws_log.setLevel(logging.DEBUG)
    try:
        async with connect(
            f"{url}?token=qs-secret-1", additional_headers={"Authorization": "Bearer hd-secret-2"}
        ) as ws:
            await ws.close()
    finally:
        root.removeHandler(handler)
        ws_log.setLevel(level)
    text = out.getvalue()
    assert "qs-secret-1" not in text and "hd-secret-2" not in text
    assert "token=***" in text or "Authorization: ***" in text  # the debug lines were there
