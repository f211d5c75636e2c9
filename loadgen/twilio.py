"""The Twilio Media Streams call simulator (``loadgen/phone.py`` with ``--provider twilio``).

``python -m loadgen.twilio ws://127.0.0.1:8765/twilio question.wav [more.wav ...]``
"""

from __future__ import annotations

import functools

from loadgen.phone import PhoneCall, main

TwilioCall = functools.partial(PhoneCall, provider="twilio")

if __name__ == "__main__":
    raise SystemExit(main(provider="twilio"))
