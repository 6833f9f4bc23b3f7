"""`Replay`: a benchmark-only proposer that drafts at a known acceptance.

Random weights (models/synthetic/) accept nothing, so a synthetic pair alone cannot say what a
method would gain at a real drafter's acceptance. `Replay` wraps a drafter method (sd, slem,
tli, slrs) and replaces what its drafter drafted by a replay of the target's own greedy
continuation (from a first plain pass), each drafter token independently replaced with
probability 1 - a by another one (doctor/device_check.py `generate_replayed` runs one). Everything else is the real method's: the drafter
model still runs every pass it would (its cost counts; its tokens are discarded), the
cross-vocabulary methods hand the drafter's tokenization of the replayed text to their real
translation, and the candidates go through the real verifier, so the output is still plain
decoding's, token for token (tests/methods/test_replay.py).

Greedy only: the reference is a greedy continuation. Results are labelled "replay a=...".
"""

from __future__ import annotations

import numpy as np

from ..errors import AnydraftError
from .pairing import DrafterMethod

# what a replaced token becomes: the first of these the reference token does not start with
# (an ASCII symbol every tokenizer spells alone and shares: tli can draft it too)
REPLACEMENTS = ("~", "#")
# bytes of the reference re-encoded per replayed token where a draft starts inside a drafter
# token of the whole reference (a window, not the rest of the text: a step stays cheap)
WINDOW_BYTES = 32


def label(a: float) -> str:
    return f"replay a={a:g}"


class Replay(DrafterMethod):
    """``inner``'s proposals with its drafter's tokens replaced by the replay of ``reference``
    (the target's greedy continuation, target ids) at acceptance ``a``."""

    def __init__(self, inner: DrafterMethod, reference: list[int], a: float, seed: int = 0):
        if not isinstance(inner, DrafterMethod):
            raise AnydraftError("replay wraps a drafter method: use sd, slem, tli or slrs")
        if not 0.0 <= a <= 1.0:
            raise AnydraftError(f"replay acceptance a must be in [0, 1], got {a}")
        super().__init__(inner.pairing)
        self.inner, self.a = inner, a
        # a name of its own: what adaptive drafting learns of replays stays apart from the method's
        self.name, self.same_ids = f"{inner.name} ({label(a)})", inner.same_ids
        pairing = inner.pairing
        ttable = pairing.target_table
        self.dtable = ttable if inner.same_ids else pairing.drafter_table
        self.reference = list(reference)
        # byte offset of each target token boundary in the continuation
        self.offsets = [len(ttable.decode_bytes(self.reference[:j])) for j in range(len(self.reference) + 1)]
        self.text = ttable.decode_bytes(self.reference)
        if inner.same_ids:
            self.tokens, starts = self.reference, self.offsets[:-1]
        else:
            self.tokens = self.dtable.encode(self.text.decode("utf-8", errors="replace"))
            lengths = [len(self.dtable.token_bytes[t]) for t in self.tokens]
            starts = list(np.cumsum([0, *lengths[:-1]]))
        self.at = {int(o): i for i, o in enumerate(starts)}  # drafter token starting at a byte
        # per byte offset of a drafted token: kept (u < a) or replaced
        self.uniform = np.random.default_rng(seed).random(len(self.text) + 1)
        alternatives = [self.dtable.encode(s) for s in REPLACEMENTS]
        self.alternatives = [(s.encode(), ids[0]) for s, ids in zip(REPLACEMENTS, alternatives, strict=True)
                             if len(ids) == 1 and self._draftable(ids[0])]
        if not self.alternatives:
            raise AnydraftError("replay found no replacement token this drafter can draft")
        self.prompt_length = 0
        self.drafter = None

    def start(self, state):
        if not state.params.greedy:
            raise AnydraftError("replay replays a greedy continuation: use greedy decoding")
        self.prompt_length = len(state.committed)
        row = self.pairing.start(state, self)
        self.drafter = row.drafter
        return row

    def draft_args(self, state) -> tuple:
        return self.inner.draft_args(state)

    def finish(self, state, drafts: list[int], qs: list):
        replayed = self.replay(state, len(drafts))
        # the drafter reads the replayed tokens as its own: its cache holds its model's at those
        # positions, which cost the same to compute and are never read for their values
        self.drafter.drafts = replayed
        return self.inner.finish(state, replayed, qs[:len(replayed)])

    def verify(self, state, proposal, logits):
        return self.inner.verify(state, proposal, logits)

    def replay(self, state, n: int) -> list[int]:
        """Up to ``n`` drafter tokens continuing the committed text along the reference."""
        done = len(state.committed) - self.prompt_length
        if done >= len(self.reference) or state.committed[self.prompt_length:] != self.reference[:done]:
            return []  # past the reference (or off it: then nothing is proposed)
        start = self.offsets[done]
        out, offset = [], start
        while len(out) < n and offset < len(self.text):
            token = self._token_at(offset)
            if token is None:
                break
            size = len(self.dtable.token_bytes[token])
            kept = self.uniform[offset] < self.a and self._draftable(token)
            out.append(token if kept else self._another(self.dtable.token_bytes[token]))
            offset += size
        return out

    def _token_at(self, offset: int) -> int | None:
        """The drafter token that spells the reference from byte ``offset`` on."""
        i = self.at.get(offset)
        if i is not None:
            return self.tokens[i]
        window = self.text[offset:offset + WINDOW_BYTES].decode("utf-8", errors="ignore")
        ids = self.dtable.encode(window) if window else []
        return ids[0] if ids and self.dtable.token_bytes[ids[0]] else None

    def _draftable(self, token: int) -> bool:
        """Whether the inner method's drafter could draft ``token`` (tli: inside the shared map)."""
        mask = getattr(self.inner, "map", None)
        return mask is None or bool(mask.drafter_mask[token])

    def _another(self, spelling: bytes) -> int:
        return next(t for s, t in self.alternatives if not spelling.startswith(s))
