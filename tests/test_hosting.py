"""Process set-up: the open-files limit."""

import resource

from voicert.hosting import raise_fd_limit


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
