"""A growing 16 kHz sample buffer addressed by absolute sample position."""

from __future__ import annotations

import numpy as np


class AudioBuffer:
    """Appends chunks; slices by absolute sample index; forgets samples before a position."""

    def __init__(self) -> None:
        self._data = np.zeros(0, np.float32)
        self.base = 0  # absolute index of self._data[0]

    @property
    def end(self) -> int:
        """Absolute index one past the last sample."""
        return self.base + self._data.size

    def append(self, x: np.ndarray) -> None:
        self._data = np.concatenate([self._data, x.astype(np.float32, copy=False)])

    def slice(self, start: int, stop: int) -> np.ndarray:
        """Samples [start, stop) clamped to what is still held. [N]"""
        a = max(start, self.base) - self.base
        b = max(min(stop, self.end), self.base) - self.base
        return self._data[a:b].copy()

    def trim_before(self, pos: int) -> None:
        """Drop samples before absolute index ``pos``."""
        cut = min(max(pos - self.base, 0), self._data.size)
        if cut:
            self._data = self._data[cut:]
            self.base += cut
