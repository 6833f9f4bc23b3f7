"""Turning generated token ids into text: exact bytes, whole characters, stop strings.

Text is built from each token's exact bytes (the bridge's byte view), so a token that carries
half of a multi-byte character never yields a replacement character mid-stream: the
incremental UTF-8 decoder holds the partial character back until it completes.

Each character also keeps its origin (who chose the token that completed it: "draft",
"copy" or "target", see `Generation.absorb`), so a stream can show where its text came from
(the playground, issue 23) with spans that always join to exactly the text handed out.
"""

from __future__ import annotations

import bisect
import codecs
from collections.abc import Sequence


class TextAssembler:
    """Accumulates tokens; reports stop strings; hands out safe-to-show text deltas.

    Stop strings follow the OpenAI convention: the text ends just before the stop string,
    which is not returned. Special tokens (chat markers) contribute no text.
    """

    def __init__(self, token_bytes: Sequence[bytes], special_ids=frozenset(), stop: Sequence[str] = ()):
        self._token_bytes = token_bytes
        self._special = special_ids
        self._stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""
        self._shown = 0
        self.stopped = False
        # origins as runs: characters _ends[i-1].._ends[i]-1 came from _origins[i]
        self._ends: list[int] = []
        self._origins: list[str] = []
        self._last = "target"  # the origin of the last token (bytes a flush may still turn into text)

    def add(self, token_id: int, origin: str = "target") -> bool:
        """Append one token, chosen by ``origin``; True when a stop string has just completed."""
        assert not self.stopped
        if token_id in self._special or token_id >= len(self._token_bytes):
            return False
        start, self._last = len(self._text), origin
        self._grow(self._decoder.decode(self._token_bytes[token_id]), origin)
        # the earliest match over all stops, whatever their order: with stops ["bc", "ab"],
        # "xa" + "bc" ends at "x" (the text before any stop never holds a whole one)
        found = [at for stop in self._stop
                 if (at := self._text.find(stop, max(0, start - len(stop) + 1))) >= 0]
        if found:
            self._text = self._text[:min(found)]
            self.stopped = True
            # the runs up to the one holding the last character kept, that one cut short
            keep = bisect.bisect_left(self._ends, len(self._text)) + bool(self._text)
            del self._ends[keep:], self._origins[keep:]
            if keep:
                self._ends[-1] = len(self._text)
        return self.stopped

    def _grow(self, piece: str, origin: str) -> None:
        """Append ``piece``, every character of it from ``origin``."""
        if not piece:
            return
        self._text += piece
        if self._origins and self._origins[-1] == origin:
            self._ends[-1] = len(self._text)
        else:
            self._ends.append(len(self._text))
            self._origins.append(origin)

    @property
    def text(self) -> str:
        """Everything so far (a trailing incomplete character is left out)."""
        return self._text

    def finish(self) -> str:
        """Flush: an incomplete character at the very end becomes U+FFFD."""
        if not self.stopped:  # a U+FFFD for bytes left over is the last token's
            self._grow(self._decoder.decode(b"", final=True), self._last)
        return self._text

    def delta(self, final: bool = False) -> str:
        """New text since the last call, holding back a tail that could begin a stop string."""
        return "".join(text for text, _ in self.delta_spans(final))

    def spans(self, start: int = 0, end: int | None = None) -> list[tuple[str, str]]:
        """The text from ``start`` to ``end`` as ``(text, origin)`` runs (joined: that text)."""
        end = len(self._text) if end is None else end
        out, i = [], bisect.bisect_right(self._ends, start)
        while start < end:
            stop = min(self._ends[i], end)
            out.append((self._text[start:stop], self._origins[i]))
            start, i = stop, i + 1
        return out

    def delta_spans(self, final: bool = False) -> list[tuple[str, str]]:
        """`delta` as ``(text, origin)`` runs; the same text, handed out once."""
        end = len(self._text)
        if not final and not self.stopped:
            for stop in self._stop:
                for k in range(min(len(stop) - 1, end), 0, -1):
                    if self._text.endswith(stop[:k]):
                        end = min(end, len(self._text) - k)
                        break
        end = max(end, self._shown)
        out = self.spans(self._shown, end)
        self._shown = end
        return out
