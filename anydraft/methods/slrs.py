"""`slrs`: string-level rejection sampling, byte by byte, with the drafter's full vocabulary.

After Timor et al. (ICML 2025), "SLRS". The paper accepts a target token t with probability
min(1, p(t)/psi(t)), psi(t) = probability that the drafter's string starts with text(t), summed
over every drafter spelling. Because several target tokens can be prefixes of one drafted
string, psi is not a distribution over target tokens; we use an equivalent construction that
works byte by byte and needs no spelling lattice at all.

Derivation
----------
Write each target token as a walk down the trie of target token byte strings: at node x
(the bytes of the token so far) the target's processed distribution p_i induces

    P(child b | x) = M(x+b) / M(x),   P(END | x) = E(x) / M(x),

M(y) = p-mass of tokens whose bytes start with y, E(x) = mass of tokens whose bytes are x.
At the root there are also EOS (the EOS ids) and SPECIAL (every other id, e.g. chat markers).
Walking the trie with these conditionals samples t ~ p_i exactly.

The drafter proposes these outcomes. It samples tokens d_1..d_k (q_j = its processed
distribution) and we reveal the drafted string one byte at a time, together with one latent
fact: where each drafter token ends. Given the history H (tokens d_<j, the bytes r of d_j so
far, and that d_j has not ended at r), the next byte is distributed as

    Q(b | H) = Mq_j(r+b) / (Mq_j(r) - Eq_j(r))          (r != "")
    Q(b | H) = Mq_j(b),  Q(EOS | H) = q_j(EOS),  Q(NOMATCH | H) = rest   (r == "")

with Mq, Eq the same masses under q_j. Every quantity comes from distributions on the path
the drafter actually sampled: no extra drafter forward pass, no lattice (the lattice cap of
the paper's form is never needed). A drafted byte maps to a trie outcome deterministically
(maximal munch): b if x+b is a trie node, else END (the byte then starts the next target
token). So Q over outcomes is exact: Q(b) for children, Q(END) = mass of non-children (and
EOS inside a token), Q(EOS) at the root.

At each outcome: accept o with probability min(1, P(o)/Q(o)); on rejection draw from the
residual max(0, P - Q)/Z and stop. This is speculative sampling at every byte, conditional on
the full history H, so each outcome is emitted with probability exactly P(o | emitted
bytes) whatever H is; marginalising over H, every emitted token is distributed exactly as
p_i. Two details keep it exact:
- After END is accepted, the byte that caused it is reused as the first proposal of the next
  token; the acceptance event depended only on "b is not a child of x", so its distribution
  is Q restricted to the non-children, renormalised.
- Tokens with identical bytes: END at x picks among the ids spelling x in proportion to p_i.
  If the pick, or any emitted token, differs from the candidate the target scored, the
  target's next distribution is unknown and the step stops (still exact).
When the drafted string runs out inside token i, the rest of the token is drawn from p_i
restricted to tokens starting with the accepted bytes: plain target sampling.
A logit bias (target ids) is in every p_i (`SamplingParams.probs` of the target's logits);
the q_j are whatever the drafter drew from (its own ids' share of the bias,
`Pairing.drafter_params`), and the argument holds for any q_j.

Greedy decoding degrades to exact match (`slem`). Correctness is proven by exhaustive
enumeration in tests/methods/test_exhaustive.py.
"""

from __future__ import annotations

import bisect
import functools

import numpy as np
import torch

from ..planning.cost import room
from ..sampling import bernoulli, sample
from .pairing import Pairing
from .slem import StringLevelExactMatch
from .verify import Proposal, sample_residual

END, EOS, SPECIAL, NOMATCH = 256, 257, 258, 259
OUTCOMES = 260


# the most tokens under a prefix that `ByteTrie.child_spans` counts one by one (a count costs
# about a tenth of a search of the trie, which takes ~17 steps)
LINEAR_CHILDREN = 1024


class ByteTrie:
    """Token ids sorted by their bytes: every "bytes start with y" set is one index range."""

    def __init__(self, table):
        self.table = table
        ids = [i for i, b in enumerate(table.token_bytes) if b and i not in table.special_ids]
        ids.sort(key=lambda i: table.token_bytes[i])
        self.order = torch.tensor(ids, dtype=torch.long)
        self.order_array = self.order.numpy()
        self.keys = [table.token_bytes[i] for i in ids]
        self.eos = torch.tensor(sorted(table.eos_ids), dtype=torch.long)

    @functools.lru_cache(maxsize=4)  # noqa: B019
    def other(self, width: int) -> torch.Tensor:
        """Ids of a ``width``-wide distribution that are neither trie tokens nor EOS."""
        inside = torch.zeros(width, dtype=torch.bool)
        inside[self.order] = True
        inside[self.eos] = True
        return (~inside).nonzero().flatten()

    @functools.lru_cache(maxsize=1 << 16)  # noqa: B019 - one trie per tokenizer, kept alive
    def span(self, prefix: bytes) -> tuple[int, int]:
        """Index range of the tokens whose bytes start with ``prefix``."""
        lo = bisect.bisect_left(self.keys, prefix)
        stem = prefix.rstrip(b"\xff")
        hi = len(self.keys) if not stem else bisect.bisect_left(
            self.keys, stem[:-1] + bytes([stem[-1] + 1]), lo)
        return lo, hi

    @functools.lru_cache(maxsize=1 << 16)  # noqa: B019
    def exact(self, text: bytes) -> tuple[int, int]:
        """Index range of the tokens whose bytes are exactly ``text``."""
        lo = bisect.bisect_left(self.keys, text)
        return lo, bisect.bisect_right(self.keys, text, lo)

    @functools.lru_cache(maxsize=1 << 16)  # noqa: B019
    def child_spans(self, prefix: bytes) -> tuple[np.ndarray, np.ndarray]:
        """For b in 0..255: index range of tokens starting with prefix + b. They tile
        ``span(prefix)`` after the token spelling ``prefix`` itself, in the order of b, so each
        range ends where the next starts: a few tokens are counted by their next byte, many are
        cut by one search per byte inside the span (2 x 256 searches of the whole trie took 3 ms
        a prefix, and most prefixes of a draft are new)."""
        lo, hi = self.span(prefix)
        first = bisect.bisect_right(self.keys, prefix, lo, hi)  # past the token spelling prefix
        if hi - first <= LINEAR_CHILDREN:
            counts = [0] * 256
            at = len(prefix)
            for key in self.keys[first:hi]:
                counts[key[at]] += 1
            starts = first + np.concatenate([[0], np.cumsum(counts[:-1])])
        else:
            keys = self.keys
            starts = np.array([bisect.bisect_left(keys, prefix + bytes([b]), first, hi) for b in range(256)])
        return starts, np.append(starts[1:], hi)


# A range mass below this share of the prefix sum it is read from is summed directly: the
# difference of two prefix sums loses the digits of a tiny mass (1 + 1e-20 - 1 == 0), and a
# zero where the mass is positive gives 0/0 in a conditional and NaN in a draw
CANCELLATION = 1e-6


class Masses:
    """Prefix sums of one distribution in trie order: any range mass in O(1) (exactly summed
    where the prefix sums would cancel: a positive mass never reads as 0)."""

    def __init__(self, trie: ByteTrie, probs: torch.Tensor):
        self.trie = trie
        probs = probs.double()
        short = len(trie.table.token_bytes) - len(probs)
        self.probs = torch.cat([probs, probs.new_zeros(short)]) if short > 0 else probs
        # written in place (two fewer copies of the vocabulary a distribution)
        n = len(trie.order)
        self.sorted = np.empty(n + 1)
        np.take(self.probs.numpy(), trie.order_array, out=self.sorted[:n])
        self.sorted[n] = 0.0  # reduceat's end index
        self.cum = np.empty(n + 1)
        self.cum[0] = 0.0
        np.cumsum(self.sorted[:n], out=self.cum[1:])
        self.eos = float(self.probs[trie.eos].sum())
        self.other = float(self.probs[trie.other(len(self.probs))].sum())

    def range(self, lo, hi) -> float:
        mass = self.cum[hi] - self.cum[lo]
        if mass <= CANCELLATION * self.cum[hi] and hi > lo:
            mass = float(self.sorted[lo:hi].sum())
        return mass

    def children(self, prefix: bytes) -> np.ndarray:
        """The 256 masses of prefix + b, b = 0..255 (disjoint, ascending ranges)."""
        lo, hi = self.trie.child_spans(prefix)
        mass = self.cum[hi] - self.cum[lo]
        fix = (mass <= CANCELLATION * self.cum[hi]) & (hi > lo)
        if fix.any():
            bounds = np.stack([lo[fix], hi[fix]], axis=1).ravel()
            mass[fix] = np.add.reduceat(self.sorted, bounds)[::2]
        return mass

    def ids_in(self, lo: int, hi: int) -> torch.Tensor:
        return self.trie.order[lo:hi]


class StringLevelRejectionSampling(StringLevelExactMatch):
    name = "slrs"

    def __init__(self, pairing: Pairing):
        super().__init__(pairing)
        self.target_trie = _trie(pairing.target_table)
        self.drafter_trie = _trie(pairing.drafter_table)

    def finish(self, state, drafts: list[int], qs: list) -> Proposal:
        if state.params.greedy:
            return super().finish(state, drafts, qs)
        with state.stats.timed("translate"):
            candidates = self.pairing.scorable(self._munch(drafts))[: room(state)]
        return Proposal(candidates, qs, drafts)

    def verify(self, state, proposal: Proposal, logits: torch.Tensor) -> tuple[int, int]:
        if state.params.greedy:
            return super().verify(state, proposal, logits)
        with state.stats.timed("translate"):
            new, n = self._walk(proposal.drafts, proposal.qs, proposal.candidates,
                                state.params.probs(logits), state.generator)
        assert new[:n] == proposal.candidates[:n] and len(new) == n + 1
        return n, new[-1]

    # -- the drafted string as proposal events ---------------------------------------------
    def _proposals(self, drafts, qs):
        """Yield (Q over byte/EOS/NOMATCH outcomes as a 260-vector, proposed outcome)."""
        dtable, trie = self.pairing.drafter_table, self.drafter_trie
        for d, q in zip(drafts, qs, strict=True):
            m = Masses(trie, q)
            tb = dtable.token_bytes[d] if d < len(dtable.token_bytes) else b""
            if d in dtable.eos_ids:
                outcome_seq = [EOS]
            elif not tb or d in dtable.special_ids:
                outcome_seq = [NOMATCH]
            else:
                outcome_seq = list(tb)
            r = b""
            for k, outcome in enumerate(outcome_seq):
                dist = np.zeros(OUTCOMES)
                if k == 0:
                    dist[:256] = m.children(b"")
                    dist[EOS] = m.eos
                    dist[NOMATCH] = m.other
                else:
                    # Mq(r) - Eq(r) is the mass of the tokens strictly longer than r: in trie
                    # order they follow those spelling exactly r. One range, never a difference
                    # of two, which can cancel to 0 (0/0) when q(d) is tiny next to q(r)
                    dist[:256] = m.children(r) / m.range(trie.exact(r)[1], trie.span(r)[1])
                yield dist, outcome
                if outcome < 256:
                    r += bytes([outcome])

    def _munch(self, drafts) -> list[int]:
        """The target tokens the walk commits if every outcome is accepted (maximal munch)."""
        dtable, trie = self.pairing.drafter_table, self.target_trie
        out, x = [], b""
        for d in drafts:
            if d in dtable.eos_ids:
                if x:
                    if (tok := self._canonical(x)) is None:
                        return out
                    out.append(tok)
                if self.pairing.target_eos is not None:  # a target without EOS: none to offer
                    out.append(self.pairing.target_eos)
                return out
            tb = dtable.token_bytes[d] if d < len(dtable.token_bytes) else b""
            if not tb or d in dtable.special_ids:
                return out
            for b in tb:
                lo, hi = trie.span(x + bytes([b]))
                if hi > lo:
                    x += bytes([b])
                    continue
                if (tok := self._canonical(x)) is None:
                    return out
                out.append(tok)
                x = bytes([b])
                if trie.span(x)[1] == trie.span(x)[0]:
                    return out
        return out

    def _canonical(self, text: bytes) -> int | None:
        lo, hi = self.target_trie.exact(text)
        if hi == lo:
            return None
        ids = self.target_trie.order[lo:hi].tolist()
        own = self.pairing.target_table.encode_bytes(text)
        return own[0] if len(own) == 1 and own[0] in ids else min(ids)

    # -- verification ---------------------------------------------------------------------
    def _walk(self, drafts, qs, candidates, p_rows, gen) -> tuple[list[int], int]:
        """Byte-level speculative sampling; returns (committed tokens, accepted candidates)."""
        trie = self.target_trie
        out: list[int] = []
        i, x = 0, b""
        masses = Masses(trie, p_rows[0])
        restrict = None  # outcomes the carried byte is known to lie in (after an END)
        proposals = self._proposals(drafts, qs)
        pending = None
        while True:
            if pending is None:
                pending = next(proposals, None)
                if pending is None:  # the draft ran out: finish the token from p_i
                    out.append(self._sample_prefix(masses, x, gen))
                    return out, _agreed(out, candidates)
            q_dist, outcome = pending
            if restrict is not None:
                q_dist = np.where(restrict, q_dist, 0.0)
                q_dist = q_dist / q_dist.sum()
            p_out = self._target_outcomes(masses, x)
            child = np.subtract(*self.target_trie.child_spans(x)[::-1]) > 0
            q_out, o = _map_outcomes(q_dist, outcome, child, x)
            if not bernoulli(p_out[o] / q_out[o], gen):
                o = sample_residual(torch.from_numpy(p_out), torch.from_numpy(q_out), gen)
                out.append(self._emit(masses, x, o, gen))
                return out, _agreed(out, candidates)
            if o < 256:  # continue the token
                x += bytes([o])
                pending, restrict = None, None
                continue
            token = self._emit(masses, x, o, gen)
            out.append(token)
            if o == EOS or i >= len(candidates) or token != candidates[i]:
                return out, _agreed(out, candidates)
            i += 1
            masses = Masses(trie, p_rows[i])
            # END: the byte that caused it starts the next token, known to be a non-child
            restrict = np.zeros(OUTCOMES, dtype=bool)
            restrict[:256] = ~child
            restrict[EOS] = True
            x = b""

    def _target_outcomes(self, m: Masses, x: bytes) -> np.ndarray:
        dist = np.zeros(OUTCOMES)
        if x:
            total = m.range(*self.target_trie.span(x))
            dist[:256] = m.children(x) / total
            dist[END] = m.range(*self.target_trie.exact(x)) / total
        else:
            total = m.cum[-1] + m.eos + m.other
            dist[:256] = m.children(b"") / total
            dist[EOS] = m.eos / total
            dist[SPECIAL] = m.other / total
        return dist

    def _emit(self, m: Masses, x: bytes, o: int, gen) -> int:
        """Draw the token an outcome stands for, from p restricted to that outcome."""
        if o == EOS:
            ids = self.target_trie.eos
        elif o == SPECIAL:
            ids = self.target_trie.other(len(m.probs))
        elif o == END:
            ids = m.ids_in(*self.target_trie.exact(x))
        else:
            return self._sample_prefix(m, x + bytes([o]), gen)
        return _draw(m.probs, ids, gen)

    def _sample_prefix(self, m: Masses, x: bytes, gen) -> int:
        if not x:
            return sample(m.probs / m.probs.sum(), gen)
        return _draw(m.probs, m.ids_in(*self.target_trie.span(x)), gen)


def _map_outcomes(q_dist: np.ndarray, outcome: int, child: np.ndarray, x: bytes):
    """Drafter outcomes -> trie outcomes at node x (maximal munch over the trie's children
    ``child``, a 256-bool mask); returns (Q over trie outcomes, the proposed outcome)."""
    q = np.zeros(OUTCOMES)
    q[:256] = np.where(child, q_dist[:256], 0.0)
    q[NOMATCH] = q_dist[NOMATCH]
    non_child = q_dist[:256][~child].sum()
    if x:
        q[END] = non_child + q_dist[EOS]
        o = outcome if outcome < 256 and child[outcome] else (NOMATCH if outcome == NOMATCH else END)
    else:
        q[EOS] = q_dist[EOS]
        q[NOMATCH] += non_child  # a first byte no target token starts with
        o = outcome if (outcome < 256 and child[outcome]) or outcome == EOS else NOMATCH
    return q, o


def _draw(probs: torch.Tensor, ids: torch.Tensor, gen) -> int:
    if len(ids) == 1:
        return int(ids[0])
    w = probs[ids]
    return int(ids[sample(w / w.sum(), gen)])


def _agreed(out: list[int], candidates: list[int]) -> int:
    n = 0
    while n < len(out) - 1 and n < len(candidates) and out[n] == candidates[n]:
        n += 1
    return n


@functools.lru_cache(maxsize=8)
def _trie(table) -> ByteTrie:
    return ByteTrie(table)
