"""Large client messages are decoded on a worker thread, small ones where they arrive; either
way the caller gets the decoded value or the codec's own error."""

import threading

import pytest

from voicert.server import offloop


def where(data, tag=""):
    return threading.current_thread() is threading.main_thread(), len(data), tag


async def test_a_small_message_is_decoded_on_the_loops_thread():
    assert await offloop.decode(where, b"x" * 100, "t") == (True, 100, "t")


async def test_a_large_message_is_decoded_off_the_loop():
    big = "x" * offloop.OFF_LOOP_BYTES
    assert await offloop.decode(where, big) == (False, len(big), "")


async def test_the_codecs_error_reaches_the_caller_from_the_worker_thread():
    def refuse(data):
        raise ValueError("tools[0]: not a schema")

    with pytest.raises(ValueError, match="not a schema"):
        await offloop.decode(refuse, b"x" * offloop.OFF_LOOP_BYTES)
