"""Process set-up: the open-files limit; a host process's first word."""

import resource

import pytest

from voicert.hosting import HostFailed, HostProcess, HostStop, raise_fd_limit, say_status


def _says(msg, status):
    """A host process that says ``msg`` first, then exits."""
    say_status(status, msg)


def test_the_open_files_soft_limit_is_raised_to_the_hard_one():
    """With a soft limit of 1024 a few hundred callers exhausted it (accept() failed, /readyz
    with it); the server raises it at start."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, soft)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        before, after = raise_fd_limit(cap=4096)
        expected = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
        assert before == low and after == expected
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (expected, hard)
        assert raise_fd_limit(cap=4096) == (expected, expected)  # already there: nothing to do
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize(
    "msg, why",
    [(HostFailed("no model here"), "no model here"), (HostStop(), "it stopped before it started")],
)
def test_a_host_whose_first_word_is_not_ready_fails_its_start_with_why(msg, why):
    """A host that says it failed, or anything but ready, first: ``wait_ready`` raises a
    RuntimeError naming the host and why (never an AttributeError of the message)."""
    host = HostProcess("test host", _says, (msg,))
    try:
        with pytest.raises(RuntimeError, match=f"test host failed to start: {why}"):
            host.wait_ready(60)
    finally:
        host.proc.join(10)
