"""Sampling settings: one value object, one logits transform.

Losslessness is always stated against `SamplingParams.probs(target_logits)`: every method
forms its distributions with this one function, so "the target's processed distribution" means
the same thing everywhere. Order of the transform: logit bias, temperature, top-k, top-p,
min-p. The logit bias is keyed by TARGET token ids: a drafter of another vocabulary drafts
with it translated (methods/pairing.py `Pairing.drafter_params`), or without it, which costs
acceptance but never exactness, since every verifier forms p from the target's logits here.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .config import is_int, is_number
from .errors import AnydraftError

if TYPE_CHECKING:  # torch is imported where it is used: `anydraft --help` needs none of it
    import torch

MAX_SEED = 2**63 - 1  # a signed 64-bit integer, as OpenAI's API has it
MAX_BIAS = 100  # |logit bias|: OpenAI's range; -100 bans a token, +100 all but forces it
# entries of a logit bias: each is added to every distribution formed, drafts included, and
# OpenAI's own API takes a few hundred; this bounds the work a request can ask for
MAX_BIASED_TOKENS = 1024
MAX_TOP_LOGPROBS = 20  # alternatives per token a generation reports (`logprobs`): OpenAI's cap


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. Invalid values raise `AnydraftError` at construction. The field
    metadata is the help of the command line options (see anydraft/options.py)."""

    temperature: float = field(default=0.0, metadata={"help": "0: greedy; at most 100"})
    top_k: int = field(default=0, metadata={"help": "keep the k most likely tokens; 0: off"})
    top_p: float = field(default=1.0, metadata={
        "help": "keep the most likely tokens whose mass reaches p, in (0, 1]; 1: off"})
    min_p: float = field(default=0.0, metadata={
        "help": "drop tokens below p times the top probability, in [0, 1); 0: off"})
    seed: int | None = field(default=None, metadata={
        "help": "random seed; None: a fresh one per generation"})
    # ((target token id, bias), ...) sorted by id; a mapping {id: bias} is taken too
    logit_bias: tuple[tuple[int, float], ...] = field(default=(), metadata={
        "help": "add BIAS to the logit of target token ID before sampling, "
                f"as ID=BIAS,ID=BIAS; BIAS in [-{MAX_BIAS}, {MAX_BIAS}]"})

    def __post_init__(self):
        def bad(msg):
            raise AnydraftError(f"invalid sampling settings: {msg}")

        for name in ("temperature", "top_p", "min_p"):
            value = getattr(self, name)
            if not is_number(value):
                bad(f"{name} must be a finite number, got {value!r}")
        if self.temperature < 0:
            bad(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.temperature > 100:
            bad(f"temperature must be <= 100, got {self.temperature}")
        if not is_int(self.top_k) or self.top_k < 0:
            bad(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            bad(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if not 0 <= self.min_p < 1:
            bad(f"min_p must be in [0, 1) (0 = off), got {self.min_p}")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            bad(f"seed must be an integer in 0..2**63-1 or None, got {self.seed!r}")
        bias = self.logit_bias
        pairs = list(bias.items()) if isinstance(bias, Mapping) else bias
        if not isinstance(pairs, (list, tuple)) or not all(
                isinstance(kv, (list, tuple)) and len(kv) == 2 for kv in pairs):
            bad(f"logit_bias must map token ids to biases, got {bias!r}")
        if len(pairs) > MAX_BIASED_TOKENS:
            bad(f"logit_bias may bias at most {MAX_BIASED_TOKENS} tokens, got {len(pairs)}")
        for token, value in pairs:
            if not is_int(token) or token < 0:
                bad(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            if not is_number(value) or abs(value) > MAX_BIAS:
                bad(f"logit_bias of token {token} must be a number in [-{MAX_BIAS}, {MAX_BIAS}], "
                    f"got {value!r}")
        if len({token for token, _ in pairs}) < len(pairs):
            bad("logit_bias names a token id twice: give each id once")
        # a frozen value object: a sorted tuple compares and hashes as settings should
        object.__setattr__(self, "logit_bias", tuple(sorted((t, float(v)) for t, v in pairs)))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def check_vocabulary(self, width: int) -> None:
        """Raise `AnydraftError` unless every biased id is one of the target's ``width``
        logits (the transform itself skips ids past a narrower drafter's logits)."""
        outside = [t for t, _ in self.logit_bias if t >= width]
        if outside:
            raise AnydraftError(f"invalid sampling settings: logit_bias names token id {outside[0]}, "
                                f"but the model has ids 0..{width - 1}: use ids of its tokenizer")

    def biased(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` plus the logit bias over the last dimension (ids past it skipped)."""
        if not self.logit_bias:
            return logits
        import torch

        width = logits.shape[-1]
        ids = torch.tensor([t for t, _ in self.logit_bias if t < width], dtype=torch.long)
        values = torch.tensor([v for t, v in self.logit_bias if t < width], dtype=logits.dtype)
        logits = logits.clone()
        logits[..., ids] += values
        return logits

    def for_choice(self, index: int) -> SamplingParams:
        """The settings of completion ``index`` of several of one prompt (OpenAI's ``n``):
        completion 0 keeps the seed, each other gets a distinct one derived from it, so every
        completion is its own reproducible stream (unseeded, each draws a fresh seed anyway)."""
        if index == 0 or self.seed is None:
            return self
        digest = hashlib.sha256(f"{self.seed}:{index}".encode()).digest()
        return replace(self, seed=int.from_bytes(digest[:8], "little") >> 1)

    def generator(self) -> torch.Generator:
        """A fresh generator: seeded runs are reproducible, unseeded ones are not."""
        import torch

        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        return torch.Generator().manual_seed(seed)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed float32 distribution(s) over the last dimension of ``logits``.

        Greedy settings give the one-hot distribution of the argmax, so methods that verify by
        rejection sampling are exact for greedy too.
        """
        import torch

        logits = self._processed_logits(logits)
        if self.greedy:  # written into zeros: one_hot built int64 first (3x the bytes, then a cast)
            return torch.zeros_like(logits).scatter_(-1, first_max(logits), 1.0)
        # the top logit is moved to 0 first, so dividing by a tiny temperature cannot overflow
        # (1e-38 made every logit inf, then softmax nan): the others go to large negatives or
        # -inf, and as t -> 0 the distribution becomes the greedy one-hot exactly. A top logit
        # (or a tie with it) stays 0 even where t rounds to 0 in float32 (0 / 0 would be nan).
        # (amax: max(dim) also finds the indices, 10x slower over 151,936 logits; a temperature
        # that does not round to 0 divides 0 into 0, and the mask is then skipped: 0.17 ms)
        logits = logits - logits.amax(dim=-1, keepdim=True)
        if torch.tensor(self.temperature, dtype=logits.dtype) > 0:
            logits = logits / self.temperature
        else:
            logits = torch.where(logits == 0, 0.0, logits / self.temperature)
        if self.top_k and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, -math.inf)
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1:
            sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
            mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            # keep the smallest set of most likely tokens whose mass reaches top_p
            drop_sorted = mass_before >= self.top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            probs = probs.masked_fill(drop, 0.0)
        if self.min_p > 0:
            threshold = self.min_p * probs.max(dim=-1, keepdim=True).values
            probs = probs.masked_fill(probs < threshold, 0.0)
        return probs / probs.sum(dim=-1, keepdim=True)

    def logprobs(self, logits: torch.Tensor) -> torch.Tensor:
        """The log-probabilities a generation reports for its tokens (OpenAI's ``logprobs``):
        those of `probs`, what each token was sampled from (-inf where truncated away). Greedy
        decoding's is a one-hot, which says nothing: it reports the model's own distribution
        with the logit bias (temperature 1, nothing cut), as OpenAI does at temperature 0."""
        import torch

        if self.greedy:
            return torch.log_softmax(self._processed_logits(logits), dim=-1)
        return torch.log(self.probs(logits))

    def _processed_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """float32 (float64 stays: exhaustive tests compare to 1e-9) logits with the bias."""
        import torch

        return self.biased(logits if logits.dtype == torch.float64 else logits.float())

    def choose(self, logits: torch.Tensor, generator: torch.Generator) -> int:
        """The target's own choice for one position: argmax, or a sample of `probs`."""
        if self.greedy:
            return int(first_max(self._processed_logits(logits) if self.logit_bias else logits))
        return sample(self.probs(logits), generator)


def first_max(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1, keepdim=True)``: the index of the first of equal maxima (or of the first
    nan), through numpy where it can take ``x``: its argmax is vectorised, 0.007 ms over
    151,936 float32 logits where torch's took 0.1 ms (AMD EPYC, one thread)."""
    import numpy as np
    import torch

    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and not x.requires_grad:
        return torch.from_numpy(np.asarray(x.numpy().argmax(-1))[..., None])
    return x.argmax(-1, keepdim=True)


# Every random decision of every method goes through these two functions, so a test can
# replace the generator by one that enumerates all outcomes with their exact probabilities.
def sample(probs: torch.Tensor, generator) -> int:
    """One draw from a 1-D distribution (`inverse_cdf` of one uniform double)."""
    if hasattr(generator, "sample"):
        return generator.sample(probs)
    import torch

    return inverse_cdf(probs, float(torch.rand((), generator=generator, dtype=torch.float64)))


# tokens per block of `inverse_cdf`: a vectorised pass sums the blocks, then only one block is
# walked token by token. torch.multinomial drew an exponential per token instead (2.9 ms over
# Qwen's 151,936 on an AMD EPYC core, where this takes 0.07 ms)
SAMPLE_BLOCK = 1024


def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The token whose interval of the cumulative mass holds ``u`` times the total mass, for
    ``u`` in [0, 1): token i is drawn with probability p_i / sum(p), as by torch.multinomial,
    and a token of probability 0 never (its interval is empty). Two levels, both in float64:
    the block whose interval holds the point, then the token within that block."""
    import torch

    n = probs.shape[-1]
    full = n - n % SAMPLE_BLOCK
    sums = probs[:full].reshape(-1, SAMPLE_BLOCK).sum(-1, dtype=torch.float64)
    if full < n:
        sums = torch.cat([sums, probs[full:].sum(-1, dtype=torch.float64).view(1)])
    ends = torch.cumsum(sums, 0)
    total = float(ends[-1])
    assert total > 0 and math.isfinite(total), f"not a distribution (total mass {total})"
    point = u * total
    block = int(torch.searchsorted(ends, torch.tensor([point], dtype=torch.float64), right=True))
    if block == len(sums):  # u * total rounded up to the total: the last block with mass
        block = int(sums.nonzero()[-1])
    start = block * SAMPLE_BLOCK
    part = probs[start:start + SAMPLE_BLOCK].double()
    inside = torch.cumsum(part, 0)
    before = float(ends[block - 1]) if block else 0.0
    i = int(torch.searchsorted(inside, torch.tensor([point - before], dtype=torch.float64), right=True))
    if i == len(part):  # the block's sum and its walk rounded apart: its last token with mass
        i = int(part.nonzero()[-1])
    return start + i


def bernoulli(prob: float, generator) -> bool:
    """True with probability ``min(1, prob)``."""
    if hasattr(generator, "bernoulli"):
        return generator.bernoulli(min(1.0, prob))
    import torch

    return float(torch.rand((), generator=generator)) < prob
