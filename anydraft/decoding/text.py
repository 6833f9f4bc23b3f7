"""Turning generated token ids into text: exact bytes, whole characters, stop strings.

Text is built from each token's exact bytes (the bridge's byte view), so a token that carries
half of a multi-byte character never yields a replacement character mid-stream: the
incremental UTF-8 decoder holds the partial character back until it completes.
"""

from __future__ import annotations

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

    def add(self, token_id: int) -> bool:
        """Append one token; True when a stop string has just completed."""
        assert not self.stopped
        if token_id in self._special or token_id >= len(self._token_bytes):
            return False
        start = len(self._text)
        self._text += self._decoder.decode(self._token_bytes[token_id])
        # the earliest match over all stops, whatever their order: with stops ["bc", "ab"],
        # "xa" + "bc" ends at "x" (the text before any stop never holds a whole one)
        found = [at for stop in self._stop
                 if (at := self._text.find(stop, max(0, start - len(stop) + 1))) >= 0]
        if found:
            self._text = self._text[:min(found)]
            self.stopped = True
        return self.stopped

    @property
    def text(self) -> str:
        """Everything so far (a trailing incomplete character is left out)."""
        return self._text

    def finish(self) -> str:
        """Flush: an incomplete character at the very end becomes U+FFFD."""
        if not self.stopped:
            self._text += self._decoder.decode(b"", final=True)
        return self._text

    def delta(self, final: bool = False) -> str:
        """New text since the last call, holding back a tail that could begin a stop string."""
        end = len(self._text)
        if not final and not self.stopped:
            for stop in self._stop:
                for k in range(min(len(stop) - 1, end), 0, -1):
                    if self._text.endswith(stop[:k]):
                        end = min(end, len(self._text) - k)
                        break
        end = max(end, self._shown)
        out = self._text[self._shown : end]
        self._shown = end
        return out
