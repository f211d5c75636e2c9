"""Endpointing: turns per-window speech probabilities into speech start / stop decisions.

Pure state machine over audio time (window indices); no clocks, no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from voicert.config import VadConfig

WINDOW_MS = 32


class EventKind(enum.Enum):
    SPEECH_STARTED = "speech_started"
    ENDPOINT = "endpoint"  # speech stopped: trailing silence reached min_silence_ms, or max length


@dataclass(frozen=True, slots=True)
class EndpointEvent:
    kind: EventKind
    window: int  # index of the window the decision refers to (start: first voiced window)
    forced: bool = False  # endpoint because the utterance hit max_utterance_s


@dataclass(frozen=True, slots=True)
class WindowResult:
    voiced: bool  # this window counts as speech
    event: EndpointEvent | None


class Endpointer:
    """Feed one probability per 32 ms window, in order, with :meth:`step`."""

    def __init__(self, cfg: VadConfig) -> None:
        self.cfg = cfg
        self.in_speech = False
        self.window = -1
        self._run_start = -1  # first window of the current voiced run (before speech starts)
        self._run_len = 0
        self.speech_start = -1
        self.last_voiced = -1

    @property
    def silence_ms(self) -> int:
        """Silence since the last voiced window, as of the last window stepped."""
        return (self.window - self.last_voiced) * WINDOW_MS

    def step(self, prob: float) -> WindowResult:
        self.window += 1
        w = self.window
        voiced = prob >= self.cfg.threshold
        silent = prob < self.cfg.neg_threshold
        if not self.in_speech:
            if voiced:
                if self._run_len == 0:
                    self._run_start = w
                self._run_len += 1
                self.last_voiced = w
                if self._run_len * WINDOW_MS >= max(self.cfg.min_speech_ms, WINDOW_MS):
                    self.in_speech = True
                    self.speech_start = self._run_start
                    return WindowResult(
                        True, EndpointEvent(EventKind.SPEECH_STARTED, self._run_start)
                    )
            elif silent:
                self._run_len = 0
            return WindowResult(voiced, None)
        if voiced:
            self.last_voiced = w
        too_long = (w - self.speech_start + 1) * WINDOW_MS >= self.cfg.max_utterance_s * 1000
        if too_long or (silent and self.silence_ms >= self.cfg.min_silence_ms):
            self.reset()
            return WindowResult(voiced, EndpointEvent(EventKind.ENDPOINT, w, forced=too_long))
        return WindowResult(voiced, None)

    def reset(self) -> None:
        """Back to waiting for speech (after an endpoint or a manual commit)."""
        self.in_speech = False
        self._run_len = 0
        self.speech_start = -1
