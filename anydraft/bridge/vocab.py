"""One tokenizer seen as bytes: every id's exact byte contribution, plus exact encoders.

The bridge never compares token *strings*: byte-level BPE spells bytes as GPT-2 unicode
stand-ins ("Ġ" is a space), SentencePiece spells a space "▁" and unknown bytes "<0xNN>".
A `TokenTable` maps every id to the bytes it adds to the text, so two tokenizers meet on
bytes, and "text" in this package means the concatenation of those bytes.

Invariants:
  - ``decode_bytes(encode_bytes(b)) == b`` for ANY bytes ``b`` (invalid UTF-8 included).
  - ``encode`` is the tokenizer's own encoding minus BOS/EOS; ``encode_bytes`` is the same
    wherever that encoding reproduces the bytes exactly, and otherwise falls back piecewise.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_UNICODE_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD"}


class UnspellableBytes(ValueError):
    """The tokenizer has no token for a byte (SmolLM2 lacks 21 of the 256, e.g. 0x04, 0xF1):
    text containing it cannot be written in this vocabulary at all. A caller translating a
    draft treats it as a draft that cannot be proposed."""


@functools.cache
def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable stand-in character -> raw byte."""
    bs = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _walk(node):
    """Every component of a (possibly nested ``Sequence``) normalizer/pre-tokenizer/decoder."""
    if not node:
        return
    yield node
    for key in ("normalizers", "pretokenizers", "decoders"):
        for child in node.get(key) or ():
            yield from _walk(child)


@dataclass(frozen=True, eq=False)
class TokenTable:
    """Byte view of one tokenizer. Build with `token_table` (cached per tokenizer object)."""

    token_bytes: tuple[bytes, ...] = field(repr=False)
    kind: str  # "byte-bpe" | "sentencepiece" | "other"
    special_ids: frozenset[int] = field(repr=False)
    bos_id: int | None
    eos_id: int | None  # the primary EOS (the tokenizer's eos_token)
    eos_ids: frozenset[int]  # every id that ends a generation
    pad_id: int | None
    byte_ids: tuple[int | None, ...] = field(
        repr=False
    )  # byte value -> a token spelling exactly that byte
    fallback_ids: frozenset[int] = field(repr=False)  # SentencePiece "<0xNN>" tokens
    dummy_prefix: bool  # the tokenizer's own encode prepends "▁" (Llama-2 style)
    _encode: object = field(repr=False)  # tokenizer's own: (str) -> list[int]
    _encode_raw: object = field(
        repr=False
    )  # byte-faithful variant: no unicode normalizer, no dummy prefix

    def __len__(self) -> int:
        return len(self.token_bytes)

    # --- text -> ids -------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """The tokenizer's own encoding, never with BOS/EOS. Special-token strings in
        ``text`` become special tokens, as the tokenizer does. Not always byte-exact
        (e.g. Qwen applies NFC; Gemma reads a literal "▁" as a space): use `encode_bytes`
        where bytes must survive."""
        return self._encode(text)

    def encode_bytes(self, data: bytes) -> list[int]:
        """Tokens whose bytes concatenate to exactly ``data``, for any bytes.

        Valid UTF-8 runs get the tokenizer's encoding (without unicode normalization or a
        dummy prefix); invalid or incomplete bytes get single-byte tokens."""
        if not data:
            return []
        text = data.decode("utf-8", errors="surrogateescape")
        out: list[int] = []
        # Undecodable bytes come back as lone surrogates U+DC80..U+DCFF.
        for run in re.split(r"([\udc80-\udcff]+)", text):
            if not run:
                continue
            if "\udc80" <= run[0] <= "\udcff":
                out.extend(self._byte_token(ord(c) - 0xDC00) for c in run)
            else:
                out.extend(self._encode_exact(run))
        return out

    def _byte_token(self, b: int) -> int:
        tid = self.byte_ids[b]
        if tid is None:
            raise UnspellableBytes(
                f"tokenizer has no token for byte 0x{b:02X}: cannot spell these bytes exactly"
            )
        return tid

    def _encode_exact(self, text: str) -> list[int]:
        ids = self._encode_raw(text)
        want = text.encode("utf-8")
        if self.decode_bytes(ids) == want:
            return ids
        # Rare: a character the tokenizer rewrites (a literal "▁" reads as a space in
        # SentencePiece) or cannot spell. Keep the tokens before it, spell that character
        # with byte tokens, and go on after it.
        tb, keep, pos = self.token_bytes, [], 0
        for t in ids:
            if not want.startswith(tb[t], pos):
                break
            keep.append(t)
            pos += len(tb[t])
        while keep and 0x80 <= want[pos : pos + 1][0] <= 0xBF:  # back off to a character start
            pos -= len(tb[keep.pop()])
        ci = len(want[:pos].decode("utf-8"))
        head = [self._byte_token(b) for b in text[ci].encode("utf-8")]
        return keep + head + (self._encode_exact(text[ci + 1 :]) if ci + 1 < len(text) else [])

    # --- ids -> text -------------------------------------------------------------------
    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Concatenated bytes. Ids past the tokenizer's vocabulary (padded logit rows) spell nothing."""
        tb = self.token_bytes
        n = len(tb)
        return b"".join(tb[i] if 0 <= i < n else b"" for i in ids)

    def decode(self, ids: Iterable[int]) -> tuple[str, bytes]:
        """(complete text, held-back incomplete UTF-8 tail) of ``ids``; see `split_utf8`."""
        return split_utf8(self.decode_bytes(ids))


def split_utf8(data: bytes) -> tuple[str, bytes]:
    """Decode the complete characters of ``data``; return them and the trailing bytes of a
    character that is not finished yet (at most 3), which the caller holds back until more
    bytes arrive. Bytes that can never become valid (mid-stream garbage) show as U+FFFD;
    only the display suffers, the token bytes themselves are never altered."""
    cut = len(data)
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        if need > back:
            tail = data[-back:]
            try:  # only hold back what could still become a valid character
                tail.decode("utf-8")
            except UnicodeDecodeError as exc:
                if exc.reason == "unexpected end of data":
                    cut = len(data) - back
        break
    return data[:cut].decode("utf-8", errors="replace"), data[cut:]


def _token_bytes_from_json(tj: dict, kind: str, n: int) -> tuple[list[bytes | None], set[int]]:
    """(id -> bytes, ids of SentencePiece "<0xNN>" byte-fallback tokens)."""
    model = tj["model"]
    vocab = model.get("vocab")
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        pieces = {i: p for i, (p, _score) in enumerate(vocab)}
    else:
        pieces = {i: p for p, i in (vocab or {}).items()}
    added = {a["id"]: a["content"] for a in tj.get("added_tokens", [])}
    byte_fallback = bool(model.get("byte_fallback")) or model.get("type") == "Unigram"
    u2b = _gpt2_unicode_to_byte()
    out: list[bytes | None] = [None] * n
    fallback: set[int] = set()
    for i in range(n):
        if i in added:  # matched on raw text before the model runs: content is the text
            out[i] = added[i].encode("utf-8")
            continue
        p = pieces.get(i)
        if p is None:
            continue
        if kind == "byte-bpe":
            if all(c in u2b for c in p):
                out[i] = bytes(u2b[c] for c in p)
            else:
                out[i] = p.encode("utf-8")
        else:
            m = BYTE_FALLBACK.match(p) if byte_fallback else None
            if m:
                fallback.add(i)
            out[i] = bytes([int(m.group(1), 16)]) if m else p.replace("▁", " ").encode("utf-8")
    return out, fallback


def _raw_backend(tj: dict):
    """A copy of the backend that is byte-faithful: no unicode normalization (Qwen's NFC
    would rewrite decomposed text) and no dummy "▁" prefix (it would add a space mid-text).
    Returns (tokenizer or None when the original is already faithful, dummy_prefix)."""
    from tokenizers import Tokenizer

    tj = json.loads(json.dumps(tj))
    changed = dummy = False
    norm = tj.get("normalizer")
    if norm:
        if norm.get("type") in _UNICODE_NORMALIZERS or norm.get("type") == "Prepend":
            dummy |= norm.get("type") == "Prepend"
            tj["normalizer"] = None
            changed = True
        elif norm.get("type") == "Sequence":
            keep = []
            for n in norm["normalizers"]:
                if n.get("type") in _UNICODE_NORMALIZERS or n.get("type") == "Prepend":
                    dummy |= n.get("type") == "Prepend"
                    changed = True
                else:
                    keep.append(n)
            norm["normalizers"] = keep
    for pre in _walk(tj.get("pre_tokenizer")):
        if pre.get("type") == "Metaspace":
            scheme = pre.get(
                "prepend_scheme", "always" if pre.get("add_prefix_space", True) else "never"
            )
            if scheme != "never":
                dummy = changed = True
                pre["prepend_scheme"] = "never"
                pre.pop("add_prefix_space", None)
    return (Tokenizer.from_str(json.dumps(tj)) if changed else None), dummy


# Role tokens that end a turn in common chat formats: EOS-like wherever they exist.
_EOS_SPELLINGS = ("<|im_end|>", "<|endoftext|>", "<eos>", "<end_of_turn>", "<|eot_id|>", "</s>")


def build_token_table(tokenizer) -> TokenTable:
    """Build the table from the tokenizer's own structure (tokenizer.json), not per-id decode."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    n = len(tokenizer)
    added_decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special = {i for i, t in added_decoder.items() if getattr(t, "special", False)}
    special |= {i for i in getattr(tokenizer, "all_special_ids", []) if i is not None}
    raw = None
    dummy = False
    if backend is not None:
        tj = json.loads(backend.to_str())
        types = {
            c.get("type") for part in ("decoder", "pre_tokenizer") for c in _walk(tj.get(part))
        }
        dec_types = {c.get("type") for c in _walk(tj.get("decoder"))}
        if "ByteLevel" in dec_types or ("ByteLevel" in types and not dec_types - {"ByteLevel"}):
            kind = "byte-bpe"
        elif dec_types & {"Metaspace", "ByteFallback"} or (
            "Replace" in dec_types and "▁" in json.dumps(tj.get("decoder"))
        ):
            kind = "sentencepiece"
        else:
            kind = "other"
        special |= {a["id"] for a in tj.get("added_tokens", []) if a.get("special")}
        n = max(n, backend.get_vocab_size(with_added_tokens=True))
        tb, fallback = (
            _token_bytes_from_json(tj, kind, n) if kind != "other" else ([None] * n, set())
        )
        raw, dummy = _raw_backend(tj)

        def encode(text: str, _b=backend) -> list[int]:
            return _b.encode(text, add_special_tokens=False).ids

        encode_raw = encode
        if raw is not None:

            def encode_raw(text: str, _b=raw) -> list[int]:
                return _b.encode(text, add_special_tokens=False).ids
    else:
        kind = "other"
        tb, fallback = [None] * n, set()

        def encode(text: str, _t=tokenizer) -> list[int]:
            return list(_t.encode(text, add_special_tokens=False))

        encode_raw = encode
    for i, b in enumerate(tb):
        if b is None:  # structure unknown for this id: the tokenizer's decode is all we have
            tb[i] = tokenizer.decode(
                [i], skip_special_tokens=False, clean_up_tokenization_spaces=False
            ).encode("utf-8")
    byte_ids: list[int | None] = [None] * 256
    for i, b in enumerate(tb):
        if len(b) == 1 and i not in special:
            cur = byte_ids[b[0]]
            # Prefer the token the tokenizer itself emits ("A" over "<0x41>").
            if cur is None or (cur in fallback and i not in fallback):
                byte_ids[b[0]] = i

    by_spelling = {getattr(t, "content", str(t)): i for i, t in added_decoder.items()}
    eos_id = getattr(tokenizer, "eos_token_id", None)
    eos = {eos_id} if eos_id is not None else set()
    eos |= {
        by_spelling[s] for s in _EOS_SPELLINGS if s in by_spelling and by_spelling[s] in special
    }
    return TokenTable(
        token_bytes=tuple(tb),
        kind=kind,
        special_ids=frozenset(special),
        bos_id=getattr(tokenizer, "bos_token_id", None),
        eos_id=eos_id,
        eos_ids=frozenset(eos),
        pad_id=getattr(tokenizer, "pad_token_id", None),
        byte_ids=tuple(byte_ids),
        fallback_ids=frozenset(fallback),
        dummy_prefix=dummy,
        _encode=encode,
        _encode_raw=encode_raw,
    )


_CACHE: dict[int, tuple[object, TokenTable]] = {}


def token_table(tokenizer) -> TokenTable:
    """The cached `TokenTable` of ``tokenizer`` (keyed on the object; the cache holds a
    reference so the id cannot be reused by another tokenizer)."""
    if isinstance(tokenizer, TokenTable):
        return tokenizer
    hit = _CACHE.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    table = build_token_table(tokenizer)
    _CACHE[id(tokenizer)] = (tokenizer, table)
    return table


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers share one vocabulary: same id -> bytes and same special ids.
    Decided on the vocabularies themselves, never on ``vocab_size`` (padded logits differ)."""
    ta, tb = token_table(a), token_table(b)
    return ta is tb or (ta.token_bytes == tb.token_bytes and ta.special_ids == tb.special_ids)

