"""What the bridge sees in a (target, drafter) pair: `anydraft pair TARGET DRAFTER`."""

from __future__ import annotations

from .intersection import intersect
from .vocab import TokenTable, same_tokenizer, token_table

# Small, varied sample for the round-trip check: prose, code, whitespace, scripts, emoji.
SAMPLE_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += x[i];\n}",
    "  leading spaces,\ttabs\n\n\nand blank lines  ",
    "Numbers: 3.14159, 1,000,000 and 2024-06-01.",
    "Don't stop; we'll see what they've done.",
    "日本語の文章と中文句子。",
    "Emoji 🙂👍🏽 and flags 🇫🇷.",
    "مرحبا بالعالم — שלום עולם",
    "Café, naïve, résumé; e\u0301 (combining).",
    "<|im_start|>user\nHi<|im_end|>",
    "Σ x² ≤ ∞ → λ·μ",
)


def _role(table: TokenTable, tid: int | None) -> str | None:
    return None if tid is None else f"{table.token_bytes[tid].decode('utf-8', 'replace')} ({tid})"


def canonical_fraction(table: TokenTable, texts=SAMPLE_TEXTS) -> float:
    """Share of ``texts`` whose encoding survives decode -> encode unchanged, bytes included."""
    ok = 0
    for text in texts:
        ids = table.encode(text)
        data = table.decode_bytes(ids)
        ok += data == text.encode("utf-8") and table.encode(data.decode("utf-8", "replace")) == ids
    return ok / len(texts)


def pair_report(target_tokenizer, drafter_tokenizer) -> dict:
    """Facts about a pair as plain JSON-able values (fractions in 0..1)."""
    t, d = token_table(target_tokenizer), token_table(drafter_tokenizer)
    inter = intersect(t, d)
    d2t = inter.drafter_to_target

    def mapped(did):
        return None if did is None or did >= len(d2t) or d2t[did] < 0 else int(d2t[did])

    return {
        "same_tokenizer": same_tokenizer(t, d),
        "target_kind": t.kind,
        "drafter_kind": d.kind,
        "target_vocab": len(t),
        "drafter_vocab": len(d),
        "overlap": inter.size,
        "overlap_of_target": inter.size / len(t),
        "overlap_of_drafter": inter.size / len(d),
        "target_eos": _role(t, t.eos_id),
        "drafter_eos": _role(d, d.eos_id),
        "target_eos_ids": sorted(t.eos_ids),
        "drafter_eos_ids": sorted(d.eos_ids),
        "target_bos": _role(t, t.bos_id),
        "drafter_bos": _role(d, d.bos_id),
        "eos_maps_to": mapped(d.eos_id),
        "bos_maps_to": mapped(d.bos_id),
        "target_special": len(t.special_ids),
        "drafter_special": len(d.special_ids),
        "target_canonical": canonical_fraction(t),
        "drafter_canonical": canonical_fraction(d),
    }


def format_pair_report(r: dict) -> str:
    """A readable two-column table of `pair_report`'s dict."""
    rows = [
        ("same tokenizer", "yes" if r["same_tokenizer"] else "no", ""),
        ("kind", r["target_kind"], r["drafter_kind"]),
        ("vocabulary", f"{r['target_vocab']:,}", f"{r['drafter_vocab']:,}"),
        (
            "shared tokens",
            f"{r['overlap']:,} ({r['overlap_of_target']:.1%})",
            f"({r['overlap_of_drafter']:.1%})",
        ),
        ("special tokens", str(r["target_special"]), str(r["drafter_special"])),
        ("bos", str(r["target_bos"]), str(r["drafter_bos"])),
        ("eos", str(r["target_eos"]), str(r["drafter_eos"])),
        ("eos ids", str(r["target_eos_ids"]), str(r["drafter_eos_ids"])),
        ("drafter eos/bos -> target", "", f"{r['eos_maps_to']} / {r['bos_maps_to']}"),
        ("round-trip canonical", f"{r['target_canonical']:.0%}", f"{r['drafter_canonical']:.0%}"),
    ]
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len("target"), *(len(b) for _, b, _ in rows))
    lines = [f"{'':<{w0}}  {'target':<{w1}}  drafter"]
    lines += [f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
    return "\n".join(lines)
