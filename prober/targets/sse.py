"""Incremental server-sent-events decoding: bytes in, `data:` payloads out, as they complete."""

from __future__ import annotations


class SSEDecoder:
    """Feed raw bytes; collect each event's `data` (multi-line data joined by newlines).

    Each byte is searched once and the consumed lines are dropped once per chunk, so a hostile stream of one
    endless line (or of many tiny ones) costs time in proportion to its length, not to its square."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._searched = 0  # bytes of the buffer known to hold no line end
        self._data: list[str] = []
        self.events: list[str] = []
        self.invalid_utf8 = False

    def feed(self, chunk: bytes) -> list[str]:
        """Return the events completed by this chunk."""
        buffer = self._buffer
        buffer += chunk
        done: list[str] = []
        at = 0
        while (cut := _line_end(buffer, self._searched)) is not None:
            end, skip = cut
            self._line(bytes(buffer[at:end]), done)
            at = self._searched = end + skip
        # No line end yet, or a CR at the end that may be half of a CRLF: search again from there.
        self._searched = buffer.find(b"\r", self._searched) if buffer.endswith(b"\r") else len(buffer)
        del buffer[:at]
        self._searched -= at
        self.events.extend(done)
        return done

    def _line(self, raw: bytes, done: list[str]) -> None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.invalid_utf8 = True
            line = raw.decode("utf-8", "replace")
        if not line:
            if self._data:
                done.append("\n".join(self._data))
                self._data = []
        elif line.startswith("data:"):
            self._data.append(line[5:].removeprefix(" "))
        # comments (":") and other fields (event, id, retry) carry nothing an answer needs

    def close(self) -> list[str]:
        """Flush an event the server did not terminate with a blank line."""
        tail = self.feed(b"\n\n") if self._buffer or self._data else []
        return tail


def _line_end(buffer: bytearray, start: int) -> tuple[int, int] | None:
    """Where the first line from `start` ends and how long its end is; both finds stop at the first LF, so
    every byte is searched a bounded number of times."""
    lf = buffer.find(b"\n", start)
    cr = buffer.find(b"\r", start, len(buffer) if lf == -1 else lf)
    if cr == -1:
        return None if lf == -1 else (lf, 1)
    if cr + 1 == len(buffer):
        return None
    return cr, 2 if buffer[cr + 1] == 10 else 1
