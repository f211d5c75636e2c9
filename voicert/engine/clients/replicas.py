"""One engine per GPU on a node (``llm.gpus: N``), behind the one :class:`Engine` interface.

Each replica is a supervised engine process pinned to its GPU, with its own KV pool and prefix
cache. :class:`Placement` (pure, no I/O) chooses the replica of each request: a conversation stays
on the replica that served it before (its prompt's prefix is cached there) while that replica is not
much busier than the least busy one; a new conversation, or one whose replica fell behind, goes to
the least busy. A replica that is down (restarting) gets no new request while another serves.

The conversation is the request's ``session_id`` (a voice session: its turns and its early
prefills), else the hash of its first two messages (chat completions from another front end: the
same system prompt and first user turn every time that conversation grows).
"""

from __future__ import annotations

import collections
import hashlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence

from voicert.core.llm import (
    EndedStream,
    Engine,
    EngineLoad,
    EngineState,
    EngineStats,
    FinishReason,
    GcPause,
    GenerationRequest,
    StepRecord,
    TokenEvent,
    final_event,
)

log = logging.getLogger(__name__)
ANONYMOUS_SESSIONS = {"", "http"}  # session ids that do not name one conversation


def conversation_key(request: GenerationRequest) -> str:
    """What keeps a conversation's requests together (see the module docstring)."""
    if request.session_id not in ANONYMOUS_SESSIONS:
        return request.session_id
    h = hashlib.blake2b(digest_size=12)
    for m in request.messages[:2]:
        h.update(m.role.encode())
        h.update(b"\0")
        h.update(m.content.encode())
        h.update(b"\0")
    return h.hexdigest()


class Placement:
    """Chooses a replica per request; remembers up to ``max_conversations`` conversations (the
    least recently seen are forgotten). ``slack``: how many more open requests than the least busy
    replica a conversation's replica may have and still keep it (at least, and a quarter of the
    least busy one's load)."""

    def __init__(
        self, replicas: int, slack: int = 4, max_conversations: int = 65536, affinity: bool = True
    ) -> None:
        self.replicas = replicas
        self.affinity = affinity  # False: always the least busy (benchmarks: what affinity buys)
        self.slack = slack
        self.max_conversations = max_conversations
        self._home: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._next = 0  # round robin among equally loaded replicas
        self.kept = 0  # placements on the conversation's own replica
        self.moved = 0  # conversations sent elsewhere because their replica was busy or down

    def pick(self, key: str, loads: Sequence[int], usable: Sequence[bool]) -> int:
        """The replica for a request of conversation ``key``, given each replica's open requests
        and whether it takes new ones; -1 when none does."""
        candidates = [i for i in range(self.replicas) if usable[i]]
        if not candidates:
            return -1
        least = min(candidates, key=lambda i: (loads[i], (i - self._next) % self.replicas))
        home = self._home.get(key) if self.affinity else None
        if (
            home is not None
            and usable[home]
            and loads[home] - loads[least] <= max(self.slack, loads[least] // 4)
        ):
            self.kept += 1
            self._home.move_to_end(key)
            return home
        if home is not None:
            self.moved += 1
        self._next = (least + 1) % self.replicas
        self._home[key] = least
        self._home.move_to_end(key)
        while len(self._home) > self.max_conversations:
            self._home.popitem(last=False)
        return least


class ReplicaEngine:
    """The :class:`~voicert.core.llm.Engine` contract over several engines (supervised engine
    processes, one per GPU). ``submit`` and ``cancel`` are called from the event loop."""

    on_failure: Callable[[str], None] | None = None  # each replica has its own supervisor

    def __init__(self, replicas: Sequence[Engine], placement: Placement | None = None) -> None:
        self.replicas = list(replicas)
        self.placement = placement or Placement(len(replicas))
        self._lock = threading.RLock()  # the counters below (re-entrant: a dropped stream's
        # __del__ may run inside a locked section of the same thread)
        self._open = [0] * len(replicas)  # requests placed on each and not yet ended
        self._where: dict[str, int] = {}  # open request id -> its replica
        self.on_give_up: Callable[[str], None] | None = None  # set by the server: all are down
        for i, replica in enumerate(replicas):
            replica.on_give_up = self._gave_up_callback(i)

    # ------------------------------------------------------------ health

    @property
    def state(self) -> EngineState:
        states = [r.state for r in self.replicas]
        if EngineState.SERVING in states:
            return EngineState.SERVING
        if all(s is EngineState.FAILED for s in states):
            return EngineState.FAILED
        return EngineState.RESTARTING

    @property
    def healthy(self) -> bool:
        """At least one replica serves."""
        return self.state is EngineState.SERVING

    @property
    def last_failure(self) -> str | None:
        fails = [
            f"replica {i}: {r.last_failure}" for i, r in enumerate(self.replicas) if r.last_failure
        ]
        return "; ".join(fails) or None

    def _gave_up_callback(self, index: int) -> Callable[[str], None]:
        def gave_up(why: str) -> None:
            if self.state is EngineState.FAILED:
                if self.on_give_up is not None:
                    self.on_give_up(f"every engine replica failed; last: replica {index}: {why}")
            else:
                log.critical(
                    "engine replica %d (GPU %d) is down for good (%s); the others go on serving",
                    index,
                    index,
                    why,
                )

        return gave_up

    # ------------------------------------------------------------ the Engine interface

    def submit(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        serving = [r.state is EngineState.SERVING for r in self.replicas]
        usable = (
            serving
            if any(serving)
            else [  # none serves: wait on one that restarts
                r.state is EngineState.RESTARTING for r in self.replicas
            ]
        )
        with self._lock:
            index = self.placement.pick(conversation_key(request), self._open, usable)
            if index < 0:
                return EndedStream(
                    final_event(
                        FinishReason.ERROR,
                        f"engine unavailable: no replica serves ({self.last_failure})",
                    )
                )
            self._open[index] += 1
            self._where[request.request_id] = index
        return _Tracked(self, request.request_id, index, self.replicas[index].submit(request))

    def _ended(self, request_id: str, index: int) -> None:
        with self._lock:
            if self._where.pop(request_id, None) is not None:
                self._open[index] -= 1

    def cancel(self, request_id: str) -> None:
        with self._lock:
            index = self._where.get(request_id)
        if index is not None:
            self.replicas[index].cancel(request_id)

    def stats(self) -> EngineStats:
        parts = [r.stats() for r in self.replicas]
        out = EngineStats(
            sum(p.active for p in parts),
            sum(p.submitted for p in parts),
            sum(p.finished for p in parts),
            sum(p.cancelled for p in parts),
            sum(p.tokens for p in parts),
        )
        extras = [p.extra or {} for p in parts]
        out.extra = {
            "engine_up": float(self.healthy),
            "engine_restarts": sum(e.get("engine_restarts", 0.0) for e in extras),
            "replicas_serving": float(sum(e.get("engine_up", 1.0) for e in extras)),
            "placement_kept": float(self.placement.kept),
            "placement_moved": float(self.placement.moved),
        }
        hits = [e["prefix_hit_ratio"] for e in extras if "prefix_hit_ratio" in e]
        if hits:
            out.extra["prefix_hit_ratio"] = sum(hits) / len(hits)
        for i, p in enumerate(parts):
            out.extra[f"replica{i}_active"] = float(p.active)
        return out

    def open_requests(self) -> list[int]:
        """Requests placed on each replica and not yet ended."""
        with self._lock:
            return list(self._open)

    def drain_steps(self) -> list[StepRecord]:
        return [s for r in self.replicas for s in r.drain_steps()]

    def drain_gc(self) -> list[GcPause]:
        return [g for r in self.replicas for g in r.drain_gc()]

    @property
    def scores(self) -> bool:
        return all(r.scores for r in self.replicas)

    def live_requests(self) -> set[str]:
        return set().union(*(r.live_requests() for r in self.replicas))

    def load(self) -> EngineLoad | None:
        """Waiting and running summed over the replicas that publish a load (the cache figures
        are per replica: see ``stats``)."""
        loads = [x for x in (r.load() for r in self.replicas) if x is not None]
        if not loads:
            return None
        return EngineLoad(sum(x.waiting for x in loads), sum(x.running for x in loads))

    @property
    def pid(self) -> int:
        return self.replicas[0].pid

    def warmup(self) -> None:
        for r in self.replicas:
            r.warmup()

    def close(self) -> None:
        for r in self.replicas:
            r.close()


class _Tracked:
    """A replica's stream that tells the ReplicaEngine when it has ended (its final event, or the
    consumer dropping it)."""

    __slots__ = ("done", "index", "inner", "owner", "request_id")

    def __init__(self, owner: ReplicaEngine, request_id: str, index: int, inner) -> None:
        self.owner, self.request_id, self.index, self.inner = owner, request_id, index, inner
        self.done = False

    def __aiter__(self) -> _Tracked:
        return self

    async def __anext__(self) -> TokenEvent:
        if self.done:
            raise StopAsyncIteration
        try:
            event = await self.inner.__anext__()
        except BaseException:
            self._end()
            raise
        if event.finish_reason is not None:
            self._end()
        return event

    def _end(self) -> None:
        if not self.done:
            self.done = True
            self.owner._ended(self.request_id, self.index)

    def __del__(self) -> None:  # dropped before its end (the caller always cancels first)
        if not self.done:
            self.owner._ended(self.request_id, self.index)
