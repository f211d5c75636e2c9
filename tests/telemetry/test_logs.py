"""The process's logging: chatty libraries stay at warnings whatever ``log.level`` says."""

import logging

import pytest

from voicert.telemetry.logs import QUIET, setup_logging


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
