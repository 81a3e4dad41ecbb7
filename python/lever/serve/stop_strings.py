"""Stop strings over streamed text: `StopScanner` passes text through and
holds back only what could be the start of a stop string, so that a stream
never shows text that a stop string later cuts off.  Lengths are characters."""

from __future__ import annotations


class StopScanner:
    """Feed generated text with `push`; each call returns the text that is
    safe to show.  Once a stop string appears, `stopped` is True and the text
    before it is the last returned (the stop string itself is never shown);
    `flush` returns what was held back when generation ends otherwise."""

    def __init__(self, stops: tuple[str, ...] = ()):
        self.stops = tuple(stops)
        self.pending = ""
        self.stopped = False

    def push(self, text: str) -> str:
        if self.stopped or not text:
            return ""
        if not self.stops:
            return text
        self.pending += text
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self.pending = self.pending[:cut], ""
            return out
        safe = len(self.pending) - self._partial_len()
        out, self.pending = self.pending[:safe], self.pending[safe:]
        return out

    def _partial_len(self) -> int:
        """Characters at the end of `pending` that begin some stop string."""
        longest = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.pending)), longest, -1):
                if self.pending.endswith(s[:k]):
                    longest = k
                    break
        return longest

    def flush(self) -> str:
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out
