"""Decoders for the worker threads: one per worker, all sharing the loaded weights."""

from __future__ import annotations

import copy


def build_decoders(args) -> list:
    """``args.max_concurrency`` decoders. The first loads the models; the rest reuse its
    model objects (inference only, each with its own KV cache) and get their own copy of
    each tokenizer, since a Hugging Face tokenizer is not safe to share between threads.
    Model names are shown without local paths (`public_name`)."""
    from ..decoder import Decoder
    from ..options import decoder_options
    from .app import public_name

    first = Decoder(**decoder_options(args))
    # names appear in error messages sent to clients: no local paths in them
    first.target.name = public_name(first.target.name)
    if first.drafter is not None:
        first.drafter.name = public_name(first.drafter.name)
    decoders = [first]
    for _ in range(args.max_concurrency - 1):
        d = first.drafter
        dec = Decoder(target=first.target.model, tokenizer=copy.deepcopy(first.target.tokenizer),
                      drafter=d.model if d else None,
                      drafter_tokenizer=copy.deepcopy(d.tokenizer) if d else None, draft=first.draft)
        dec.target.name = first.target.name
        if d is not None:
            dec.drafter.name = d.name
        decoders.append(dec)
    return decoders
