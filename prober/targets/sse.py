"""Incremental server-sent-events decoding: bytes in, `data:` payloads out, as they complete."""

from __future__ import annotations


class SSEDecoder:
    """Feed raw bytes; collect each event's `data` (multi-line data joined by newlines)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self.events: list[str] = []
        self.invalid_utf8 = False

    def feed(self, chunk: bytes) -> list[str]:
        """Return the events completed by this chunk."""
        self._buffer += chunk
        done: list[str] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                break
            end, skip = cut
            raw, self._buffer = self._buffer[:end], self._buffer[end + skip :]
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
        self.events.extend(done)
        return done

    def close(self) -> list[str]:
        """Flush an event the server did not terminate with a blank line."""
        tail = self.feed(b"\n\n") if self._buffer or self._data else []
        return tail


def _line_end(buffer: bytes) -> tuple[int, int] | None:
    lf, cr = buffer.find(b"\n"), buffer.find(b"\r")
    if cr == -1 or (lf != -1 and lf < cr):
        return None if lf == -1 else (lf, 1)
    if cr + 1 == len(buffer):
        return None  # a CR at the end may be half of a CRLF
    return cr, 2 if buffer[cr + 1 : cr + 2] == b"\n" else 1
