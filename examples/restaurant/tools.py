"""The restaurant line's three tools: check availability, book, cancel.

Plain Python functions; voicert makes each one's JSON schema from its type hints and its
description from its docstring's first paragraph (``tools.functions`` in config.yaml). They run on
a worker thread, never on the server's event loop. The bookings live in memory in this process:
an example, not a reservation system.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Annotated

from msgspec import Meta

SEATS_PER_SLOT = 20
OPENING = (12, 22)  # noon to 10 pm: bookings start on the hour or half hour in between

Time = Annotated[
    str, Meta(pattern=r"^([01]?[0-9]|2[0-3]):[0-5][0-9]$", description="24-hour time, like 19:30")
]
People = Annotated[int, Meta(ge=1, le=12, description="how many people")]


@dataclass
class Restaurant:
    seats: int = SEATS_PER_SLOT
    bookings: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # id -> (time, people,
    # name)
    lock: threading.Lock = field(default_factory=threading.Lock)
    next_id: int = 1000

    def free_at(self, time: str) -> int:
        return self.seats - sum(p for t, p, _ in self.bookings.values() if t == time)

    def check_availability(self, people: People, time: Time) -> dict:
        """Check whether a table for a number of people is free at a time today."""
        problem = _slot_problem(time)
        if problem:
            return {"available": False, "reason": problem}
        with self.lock:
            free = self.free_at(_norm(time))
        return {"available": free >= people, "time": _norm(time), "seats_left": max(free, 0)}

    def book_table(
        self,
        people: People,
        time: Time,
        name: Annotated[str, Meta(max_length=40, description="the guest's name")],
    ) -> dict:
        """Book a table for a number of people at a time today, under a name."""
        problem = _slot_problem(time)
        if problem:
            return {"booked": False, "reason": problem}
        with self.lock:
            if self.free_at(_norm(time)) < people:
                return {"booked": False, "reason": f"no table for {people} at {_norm(time)}"}
            booking_id = f"B{self.next_id}"
            self.next_id += 1
            self.bookings[booking_id] = (_norm(time), people, name)
        return {"booked": True, "booking_id": booking_id, "time": _norm(time), "people": people}

    def cancel_booking(
        self, booking_id: Annotated[str, Meta(pattern=r"^B[0-9]{4}$", description="like B1000")]
    ) -> dict:
        """Cancel a booking by its id."""
        with self.lock:
            found = self.bookings.pop(booking_id, None)
        return {"cancelled": found is not None, "booking_id": booking_id}


def _norm(time: str) -> str:
    h, m = time.split(":")
    return f"{int(h):02d}:{m}"


def _slot_problem(time: str) -> str | None:
    if not re.fullmatch(r"([01]?[0-9]|2[0-3]):[0-5][0-9]", time):
        return f"{time!r} is not a time like 19:30"
    h, m = (int(x) for x in time.split(":"))
    if not OPENING[0] <= h < OPENING[1] or m not in (0, 30):
        return "we take bookings on the hour or half hour from 12:00 to 21:30"
    return None


# The server imports these three names (tools.functions: examples/restaurant/tools.py:book_table...)
_RESTAURANT = Restaurant()
check_availability = _RESTAURANT.check_availability
book_table = _RESTAURANT.book_table
cancel_booking = _RESTAURANT.cancel_booking
