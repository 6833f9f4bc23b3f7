"""Text -> tokens after a fixed context: the string-level step of SLEM, SLRS and TLI resync.

Tokenizers are not concatenative (encode(a + b) != encode(a) + encode(b)): a space, a
whitespace run, a contraction or a merge can bind the new text to the end of the old one.
So new bytes are always re-encoded together with a lookbehind window of the committed
tokens, and only the part after the window is kept. Committed tokens are never changed.

Invariant of every function here: the returned tokens spell exactly the bytes asked for
(``table.decode_bytes(result) == data``), including incomplete UTF-8 (single-byte tokens)
and special-token spellings; BOS/EOS are never inserted.
"""

from __future__ import annotations

from collections.abc import Sequence

from .vocab import TokenTable, token_table

FIRST_WINDOW = 8  # tokens of lookbehind tried first
MAX_WINDOW = 256  # the window stops growing here (never reached in the test corpus)


def _window_start(table: TokenTable, ctx: Sequence[int], start: int) -> int:
    """Move ``start`` right past the last special token at or after it (special tokens are
    split off before tokenization, so text never merges across them) and past tokens that
    begin with a UTF-8 continuation byte (the window must start on a character)."""
    for j in range(len(ctx) - 1, start - 1, -1):
        if ctx[j] in table.special_ids:
            start = j + 1
            break
    tb = table.token_bytes
    while start < len(ctx):
        b = tb[ctx[start]] if 0 <= ctx[start] < len(tb) else b""
        if b and 0x80 <= b[0] <= 0xBF:
            start += 1
        else:
            break
    return start


def _after(table: TokenTable, ids: list[int], skip: int, data: bytes) -> list[int]:
    """The tokens of ``ids`` after its first ``skip`` bytes, which are the window.

    If a token straddles the window's end (the canonical encoding merges old text with new),
    the committed tokens cannot change, so the straddled part of ``data`` is spelt on its own
    and the canonical tokens resume at their first boundary inside ``data``."""
    pos = 0
    tb = table.token_bytes
    for k, t in enumerate(ids):
        if pos == skip:
            return ids[k:]
        end = pos + len(tb[t])
        if end > skip:
            head = end - skip
            return table.encode_bytes(data[:head]) + ids[k + 1 :]
        pos = end
    assert pos == skip and not data, "encode_bytes must spell window + data exactly"
    return []


def continue_tokens(table, context_ids: Sequence[int], data: bytes) -> list[int]:
    """Tokens that follow ``context_ids`` and spell exactly ``data``, chosen as the tokenizer
    would tokenize context + data (only the part after the committed context is returned).

    Lookbehind is ADAPTIVE: encode (window + data) with a window of the last 8 context
    tokens, then with 16, 32, ...; stop as soon as two consecutive windows give the same
    tokens after the boundary, or the window reaches the start of the context or a special
    token (a hard boundary). Pre-tokenizer splits (byte-level BPE regexes) and BPE merges are
    local, so the first doubling almost always confirms; the property tests compare against
    encoding the whole text. Cost: O(len(data) + window), independent of the context length.
    """
    table = token_table(table)
    if not data:
        return []
    ctx = context_ids[-MAX_WINDOW:] if len(context_ids) > MAX_WINDOW else context_ids
    ctx = [int(i) for i in ctx]
    w = FIRST_WINDOW
    prev = None
    while True:
        start = _window_start(table, ctx, max(0, len(ctx) - w))
        window = table.decode_bytes(ctx[start:])
        out = _after(table, table.encode_bytes(window + data), len(window), data)
        hard = start == 0 or ctx[start - 1] in table.special_ids
        if hard or out == prev or w >= MAX_WINDOW:
            return out
        prev = out
        w *= 2


def spellable(table, data: bytes) -> bytes:
    """The part of ``data`` before the first byte that no single token of ``table`` spells
    (SmolLM2 has no token for 0x04, 0xF1, ...: a Gemma-3 drafter can draft `<0x04>`).
    `encode_bytes` can spell every byte of what is returned, so `continue_tokens` on it
    never raises `UnspellableBytes` for the data (a draft is cut there, not failed)."""
    byte_ids = token_table(table).byte_ids
    for i, b in enumerate(data):
        if byte_ids[b] is None:
            return data[:i]
    return data


def resync(
    table, context_ids: Sequence[int], draft_ids: Sequence[int], new_bytes: bytes
) -> tuple[int, list[int]]:
    """Bring a token cache back in line with committed text.

    ``context_ids``: tokens already committed (only the tail is read); ``draft_ids``: tokens
    cached after them; ``new_bytes``: the text committed after the context. Returns
    ``(n_keep, feed_ids)``: keep ``draft_ids[:n_keep]``, feed ``feed_ids``, and
    ``decode_bytes(draft_ids[:n_keep] + feed_ids) == new_bytes`` exactly.

    The kept prefix is the longest run of draft tokens whose bytes are a prefix of
    ``new_bytes``; when text follows it, its last token is re-encoded together with that
    text and kept only if the tokenizer would still produce it (so a merge across the old
    boundary, e.g. "hel" + "lo" -> "hello", is redone)."""
    table = token_table(table)
    tb = table.token_bytes
    draft = [int(i) for i in draft_ids]
    n = pos = 0
    for t in draft:
        b = tb[t] if 0 <= t < len(tb) else b""
        if not new_bytes.startswith(b, pos) or pos + len(b) > len(new_bytes):
            break
        pos += len(b)
        n += 1
    rest = new_bytes[pos:]
    if not rest:
        return n, []
    tail_ctx = [int(i) for i in context_ids[-MAX_WINDOW:]]
    if n == 0:
        return 0, continue_tokens(table, tail_ctx, rest)
    last = draft[n - 1]  # an id past the tokenizer (padded logits) spells nothing
    feed = continue_tokens(table, tail_ctx + draft[: n - 1], table.decode_bytes([last]) + rest)
    if feed and feed[0] == last:
        return n, feed[1:]
    return n - 1, feed

