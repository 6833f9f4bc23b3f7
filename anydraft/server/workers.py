"""Decoders for the worker threads: one per worker, all sharing the loaded weights."""

from __future__ import annotations

import copy
import sys


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build_decoders(args) -> list:
    """``args.max_concurrency`` decoders. The first loads the models; the rest reuse its
    model objects (inference only, each with its own KV cache) and get their own copy of
    each tokenizer, since a Hugging Face tokenizer is not safe to share between threads."""
    from ..decoder import Decoder

    common = dict(method=args.method, num_draft_tokens=args.num_draft_tokens,
                  draft_confidence=args.draft_confidence, adaptive=not args.fixed_k,
                  drafter_context=args.drafter_context)
    first = Decoder(target=args.target, drafter=args.drafter, dtype=args.dtype,
                    drafter_dtype=args.drafter_dtype, backend=args.target_backend,
                    drafter_backend=args.drafter_backend, progress=_progress, **common)
    decoders = [first]
    for _ in range(args.max_concurrency - 1):
        d = first.drafter
        dec = Decoder(target=first.target.model, tokenizer=copy.deepcopy(first.target.tokenizer),
                      drafter=d.model if d else None,
                      drafter_tokenizer=copy.deepcopy(d.tokenizer) if d else None, **common)
        dec.target.name = first.target.name
        if d is not None:
            dec.drafter.name = d.name
        decoders.append(dec)
    return decoders
