"""Token-level intersection of two vocabularies (TLI): which drafter ids ARE target ids.

Two ids match when they spell identical bytes (so "Ġthe", "▁the" and " the" meet).
Special tokens never match by spelling ("<|im_end|>" may be text to one tokenizer and a
control token to the other); they map by role only: drafter EOS -> target EOS, BOS -> BOS.

The map is one-to-one: where several ids of one side spell the same bytes (SentencePiece
"A" and "<0x41>", Gemma's added "\\n" and "<0x0A>"), only the id the tokenizer itself emits
takes part (then the lowest id). So the restricted proposal q'(d) is directly q'(t) for
t = drafter_to_target[d]; no probability mass has to be summed across ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .vocab import TokenTable, same_tokenizer, token_table


@dataclass(frozen=True, eq=False)
class VocabIntersection:
    """``drafter_to_target[d]`` is the target id of drafter id d, or -1 (length: drafter
    vocab size incl. padded logit rows); ``target_to_drafter`` likewise; ``drafter_mask`` and
    ``target_mask`` mark mapped ids; ``size`` is the number of mapped pairs."""

    drafter_to_target: torch.Tensor  # int64 [drafter_vocab_size]
    target_to_drafter: torch.Tensor  # int64 [target_vocab_size]
    drafter_mask: torch.Tensor  # bool [drafter_vocab_size]
    target_mask: torch.Tensor  # bool [target_vocab_size]
    size: int
    identity: bool  # same vocabulary: every id maps to itself


def _by_bytes(table: TokenTable) -> dict[bytes, int]:
    """bytes -> the one non-special id chosen to stand for them."""
    groups: dict[bytes, list[int]] = {}
    for i, b in enumerate(table.token_bytes):
        if b and i not in table.special_ids:
            groups.setdefault(b, []).append(i)
    out = {}
    for b, ids in groups.items():
        if len(ids) == 1:
            out[b] = ids[0]
            continue
        try:
            emitted = table.encode_bytes(b)
        except ValueError:
            emitted = []
        canonical = emitted[0] if len(emitted) == 1 and emitted[0] in ids else None
        out[b] = min(ids, key=lambda i: (i != canonical, i in table.fallback_ids, i))
    return out


def intersect(
    target,
    drafter,
    target_vocab_size: int | None = None,
    drafter_vocab_size: int | None = None,
) -> VocabIntersection:
    """Build the intersection of two tokenizers (or `TokenTable`s). Vocab sizes default to
    the tokenizers' lengths; pass the models' logit widths. A wider width (padding) adds
    unmapped ids; a narrower one (a tokenizer longer than the model's vocabulary) leaves the
    ids past it unmapped, since the model can neither draft nor score them. The tensors are
    as long as the longer of width and tokenizer, so any id of either indexes them."""
    t, d = token_table(target), token_table(drafter)
    nt = max(target_vocab_size or 0, len(t))
    nd = max(drafter_vocab_size or 0, len(d))
    d2t = torch.full((nd,), -1, dtype=torch.long)
    t2d = torch.full((nt,), -1, dtype=torch.long)
    identity = same_tokenizer(t, d)
    t_width = target_vocab_size or len(t)  # ids the models have logits for
    d_width = drafter_vocab_size or len(d)
    if identity:
        n = min(len(t), len(d), t_width, d_width)
        ar = torch.arange(n)
        d2t[:n] = ar
        t2d[:n] = ar
    else:
        tmap = _by_bytes(t)
        pairs = [(di, tmap[b]) for b, di in _by_bytes(d).items()
                 if b in tmap and di < d_width and tmap[b] < t_width]
        used_d, used_t = {p[0] for p in pairs}, {p[1] for p in pairs}
        for d_role, t_role in ((d.eos_id, t.eos_id), (d.bos_id, t.bos_id)):
            if (
                d_role is not None
                and t_role is not None
                and d_role < d_width
                and t_role < t_width
                and d_role not in used_d
                and t_role not in used_t
            ):
                pairs.append((d_role, t_role))
                used_d.add(d_role)
                used_t.add(t_role)
        if pairs:
            di, ti = torch.tensor(pairs, dtype=torch.long).T
            d2t[di] = ti
            t2d[ti] = di
    return VocabIntersection(
        drafter_to_target=d2t,
        target_to_drafter=t2d,
        drafter_mask=d2t >= 0,
        target_mask=t2d >= 0,
        size=int((d2t >= 0).sum()),
        identity=identity,
    )
