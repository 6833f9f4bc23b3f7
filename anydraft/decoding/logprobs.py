"""Log-probabilities of the committed tokens (OpenAI's ``logprobs`` / ``top_logprobs``).

The target scores every committed token anyway: an accepted candidate at its position in the
verifying call, the step's own last token at the position after them. So the log-probabilities
a speculative step reports are read off that call's logits, through the one sampling
transform (`SamplingParams.logprobs`), exactly as plain decoding would report them: the same
logits of the same positions, only scored in one call instead of several.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..sampling import SamplingParams


@dataclass
class TokenLogprob:
    """One committed token, its log-probability, and the ``top`` most likely tokens of its
    position with theirs, most likely first (those the transform left possible only)."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


def token_logprobs(params: SamplingParams, logits: torch.Tensor, tokens: list[int],
                   top: int) -> list[TokenLogprob]:
    """The `TokenLogprob` of each of ``tokens``, ``logits`` row i scoring token i's position,
    with ``top`` (0..`sampling.MAX_TOP_LOGPROBS`) alternatives each."""
    logprobs = params.logprobs(logits[: len(tokens)])
    chosen = logprobs[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()
    if top:
        values, ids = logprobs.topk(min(top, logprobs.shape[-1]), dim=-1)
        tops = [[(i, v) for i, v in zip(row_ids, row_values, strict=True) if v > -math.inf]
                for row_ids, row_values in zip(ids.tolist(), values.tolist(), strict=True)]
    else:
        tops = [[] for _ in tokens]
    return [TokenLogprob(t, lp, alternatives)
            for t, lp, alternatives in zip(tokens, chosen, tops, strict=True)]
