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


# a batch may make each of its rows wait this much longer per step than a row alone
BATCH_LATENCY = 1.5
MAX_AUTO_BATCH = 16


def choose_max_batch(decoder, args) -> int:
    """``--max-batch``, with 'auto' resolved from the target's measured cost curve
    (hardware/profile.py, cached per machine): the most rows B <= 16 whose one-token-each call
    T(B) costs at most `BATCH_LATENCY` x T(1), so batching raises throughput by up to B / 1.5
    while each row's step slows by at most 1.5x. Where the curve is steep (scoring B tokens
    costs about B calls) that is 1: requests queue as without batching. Also 1 with several
    workers (they would share the cores) and for a backend that cannot batch."""
    if args.max_batch != "auto":
        return args.max_batch
    target = decoder.target
    if args.max_concurrency > 1 or not target.batches:
        return 1
    import numpy as np

    from ..hardware.profile import curve_of
    from ..options import progress

    curve = curve_of(args.target, target, target.backend, progress=progress)
    sizes = sorted(curve)
    cost = np.interp(range(1, MAX_AUTO_BATCH + 1), sizes, [curve[m] for m in sizes])
    return int(np.flatnonzero(cost <= BATCH_LATENCY * curve[1]).max()) + 1

