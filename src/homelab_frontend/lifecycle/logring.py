"""A child's stdout and stderr, kept bounded: the last lines, each cut to a maximum length.

A server that loops printing must not grow the gateway's memory, and a line without a newline
(a progress bar) must not either: a partial line is capped like a whole one.
"""

from __future__ import annotations

from collections import deque

MAX_LINES = 2000
MAX_LINE_BYTES = 4096


class LogRing:
    def __init__(self, max_lines: int = MAX_LINES, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.lines: deque[str] = deque(maxlen=max_lines)
        self.max_line_bytes = max_line_bytes
        self._partial = bytearray()
        self.total_lines = 0  # ever written, for `?since=`-style readers and the tests

    def feed(self, data: bytes) -> None:
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                room = self.max_line_bytes - len(self._partial)
                if room > 0:
                    self._partial += data[start:start + room]
                return
            room = self.max_line_bytes - len(self._partial)
            if room > 0:
                self._partial += data[start:min(nl, start + room)]
            self._push()
            start = nl + 1

    def _push(self) -> None:
        line = self._partial.decode("utf-8", errors="replace").rstrip("\r")
        self._partial.clear()
        self.lines.append(line)
        self.total_lines += 1

    def mark(self, text: str) -> None:
        """A line of the gateway's own (`-- started pid 123`), between the child's lines."""
        if self._partial:
            self._push()
        self.lines.append(text)
        self.total_lines += 1

    def close(self) -> None:
        if self._partial:
            self._push()

    def tail(self, n: int) -> list[str]:
        if n <= 0:
            return []
        lines = list(self.lines)
        if self._partial:
            lines.append(self._partial.decode("utf-8", errors="replace"))
        return lines[-n:]
