"""The drafter model as a proposer, with its KV cache kept in sync with the committed text.

The drafter always reads the committed text in ITS OWN tokens (``ids``). Its session holds
a prefix of ``ids`` followed by the draft tokens of the last step. After the target commits,
`commit` (cross-vocabulary: through the bridge, by bytes; same vocabulary: by ids) keeps the
still-valid prefix of the cache, crops the rest and queues the tokens to feed. The whole
sequence is never re-fed. The decoding step (decoding/step.py) calls `propose` and `commit`.

Cross vocabulary, the text committed after a step that did not draft is kept unread
(``unread``, the bytes of each commit) until a draft, or a question only the exact count of
the drafter's tokens answers, needs it (`sync`): then each commit is read exactly as it would
have been at once, one after the other, so ``ids`` are the same tokens either way. A method
that decodes plainly for many steps (`auto` where drafting cannot pay) skips that work
until it drafts, and all of it for the text after its last draft.

A drafter whose tokenizer is longer than its logits (tokens added, embeddings not resized)
has no embedding for the ids past them: it reads such a token as its bytes, one byte token
each (`readable`), and not at all where it cannot spell them so. Only the drafter's view of
the text changes; the target verifies every proposal, so the output stays the target's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..bridge import UnspellableBytes
from ..bridge.translate import resync
from ..models.session import Session
from ..planning.settings import PREFILL_CHUNK
from ..sampling import first_max, sample

# commits kept unread at most (`Drafter.sync`): one that catches up replays this many commits'
# re-encodings at once (~0.1-0.3 ms each on a CPU, tens of ms at most: a plain step or two of
# a CPU target, once per this many steps), and a generation that never drafts again skips its
# last up to this many (issue 45: answers of 64-128 tokens, decoded plainly after one probe)
MAX_UNREAD = 256


def drive(passes, feed: Callable[[list[int]], torch.Tensor]):
    """Run a `Drafter.draft_passes` generator to its end, ``feed`` answering each of its feeds
    with the logits after them; what it returns."""
    try:
        ids = next(passes)
        while True:
            ids = passes.send(feed(ids))
    except StopIteration as end:
        return end.value


class Drafter:
    def __init__(self, session: Session, table, ids: list[int], stats, target_table=None,
                 head: int = 0, context: int = 0, cancel: Callable[[], str | None] | None = None,
                 width: int | None = None):
        self.session = session
        self.table = table  # drafter TokenTable
        self.target_table = target_table  # None: the drafter reads the target's own ids
        self.width = width  # the drafter's logits width (None: it reads every id)
        head_ids = self.readable(ids[:head])
        self._ids = head_ids + self.readable(ids[head:])  # committed text in drafter tokens, but `unread`
        self.unread: list[bytes] = []  # bytes of commits not read yet, in order (cross vocabulary)
        head = len(head_ids)
        self.stats = stats
        self.head, self.context = head, context  # context 0: read every backlog whole
        self.cancel = cancel  # asked between the chunks of a long backlog (None: read it at once)
        self.drafts: list[int] = []  # drafted after `ids` at the last step
        self.caught_up = 0  # tokens of the committed text the last `propose` had to feed first

    @property
    def ids(self) -> list[int]:
        """The committed text in drafter tokens (everything committed read: `sync`)."""
        self.sync()
        return self._ids

    def propose(self, k: int, to_probs: Callable[[torch.Tensor], torch.Tensor | None],
                greedy: bool, generator: torch.Generator, confidence: float,
                stop_ids: frozenset[int] = frozenset(), read: int = 0,
                ) -> tuple[list[int], list[torch.Tensor]]:
        """Draft up to ``k`` tokens on this drafter's own session; return them and the
        distribution each was drawn from (`draft_passes`, which says how)."""
        with self.stats.timed("draft"):
            return drive(self.draft_passes(k, to_probs, greedy, generator, confidence, stop_ids, read),
                         self._feed)

    def _feed(self, ids: list[int]) -> torch.Tensor:
        start = time.perf_counter()
        logits = self.session.feed(ids, rows=1)[-1]
        self.stats.drafter_model_seconds += time.perf_counter() - start
        return logits

    def draft_passes(self, k: int, to_probs: Callable[[torch.Tensor], torch.Tensor | None],
                     greedy: bool, generator: torch.Generator, confidence: float,
                     stop_ids: frozenset[int] = frozenset(), read: int = 0):
        """Draft up to ``k`` tokens, as a generator: it yields the ids to feed the drafter's
        session next and is sent the logits after them (`propose` feeds them one call at a
        time; a batch of drafters, decoding/step.py `draft_together`, feeds every row's in one
        call); it returns the drafts and the distribution each was drawn from.

        Before drafting, a backlog longer than ``read`` tokens (0: the drafter's context) is
        cut to its last ``read`` (`trim`). With ``cancel``, a backlog longer than a chunk (the
        prompt) is read in chunks as the target's prompt is; a cancel while reading drafts
        nothing, and the loop ends before the next step.

        ``to_probs`` turns drafter logits into the proposal distribution (``None``: nothing
        can be proposed here). Greedy drafting takes the argmax of that distribution.
        Drafting stops early after a token in ``stop_ids`` (EOS), or before a position where
        the drafter's own top probability (softmax of its raw logits) is below ``confidence``.
        """
        tokens: list[int] = []
        dists: list[torch.Tensor] = []
        # a draft reads the unread text (decoding/step.py has it read before it times the step);
        # no draft needs it only for the rollback below, which it cannot change while the
        # cache is behind what was read already
        if k or len(self.session) >= len(self._ids):
            self.sync()
        if not self._ids:  # it could read none of the text: nothing to draft from
            k = 0
        elif len(self.session) == len(self._ids):  # no logits for the next position: redo the last
            self.session.rollback(len(self._ids) - 1)
        if k:
            self.trim(read or self.context)
        k = max(0, min(k, self.session.max_length - len(self._ids) - 1))
        feed = self._ids[len(self.session):]
        self.caught_up = len(feed) if k else 0
        if k and self.cancel is not None and len(feed) > PREFILL_CHUNK:
            while len(feed) > PREFILL_CHUNK:  # a chunk at a time; the rest with the first pass
                if self.cancel():
                    k = self.caught_up = 0
                    break
                chunk, feed = feed[:PREFILL_CHUNK], feed[PREFILL_CHUNK:]
                yield chunk
        for _ in range(k):
            logits = yield feed
            self.stats.drafter_calls += 1
            if confidence > 0 and float(torch.softmax(logits, -1).max()) < confidence:
                break
            q = to_probs(logits)
            if q is None:
                break
            token = int(first_max(q)) if greedy else sample(q, generator)
            tokens.append(token)
            dists.append(q)
            if token in stop_ids:
                break
            feed = [token]
        self.drafts = tokens
        return tokens, dists

    @property
    def batch(self):
        """The drafter `BatchSession` its session is a row of (None: a session of its own)."""
        return self.session.batch

    def _too_long(self, context: int) -> bool:
        return 0 < context < len(self._ids) - max(len(self.session), self.head)

    def trim(self, context: int) -> None:
        """Keep only the last ``context`` tokens of a longer backlog (after the head, BOS): the
        next draft reads just those, its cache restarted after the head."""
        if self._too_long(context):
            self.session.rollback(min(self.head, len(self.session)))
            self._ids = self._ids[:self.head] + self._ids[-context:]

    @property
    def behind(self) -> int:
        """Committed tokens the next draft reads first (after `trim` to the context window)."""
        self.sync()
        return self._behind_read()

    def behind_up_to(self, most: int) -> int:
        """``min(behind, most)`` (``most`` 0: `behind`), reading the unread text only where the
        answer needs it: what was read already may be ``most`` tokens behind alone (reading
        more only appends tokens, and `behind` never falls as ``ids`` grow)."""
        if most and self.unread and self._behind_read() >= most:
            return most
        return min(self.behind, most) if most else self.behind

    def _behind_read(self) -> int:
        """`behind` as far as ``ids`` were read."""
        if self._too_long(self.context):
            return self.context + max(0, self.head - len(self.session))
        return len(self._ids) - len(self.session)

    def commit(self, new: list[int], kept: int) -> None:
        """The target committed ``new`` (target ids), the first ``kept`` of them this drafter's
        own drafts (same vocabulary; 0 when another proposer drafted): read them (cross
        vocabulary after a step it did not draft: later, `sync`)."""
        if self.target_table is None:
            self._commit(kept, new[kept:])
        elif self.drafts:  # its drafts in the cache: what of them stays valid is known now
            assert not self.unread, "a draft reads the unread text first"
            self._sync_text(self.target_table.decode_bytes(new))
        else:
            self.unread.append(self.target_table.decode_bytes(new))
            if len(self.unread) >= MAX_UNREAD:
                self.sync()

    def sync(self) -> None:
        """Read the unread commits, each as `commit` would have read it at once: the same
        tokens in ``ids`` (a commit's tokens depend on the tokens before them, `resync`)."""
        unread, self.unread = self.unread, []
        for data in unread:
            self._sync_text(data)

    def _sync_text(self, new_bytes: bytes) -> None:
        """Cross vocabulary: ``new_bytes`` were committed after the text of ``ids``."""
        with self.stats.timed("translate"):
            try:
                n_keep, feed = resync(self.table, self._ids, self.drafts, new_bytes)
            except UnspellableBytes:
                # a byte the drafter's vocabulary cannot spell: show the drafter U+FFFD instead
                # (nothing, where it cannot spell that either; a target's special token such
                # as "<|im_end|>" may be such text). Only the drafter's view of the text
                # changes; the output stays the target's.
                byte_ids = self.table.byte_ids

                def spells(c: str) -> bool:
                    return all(byte_ids[b] is not None for b in c.encode())

                mark = "\ufffd" if spells("\ufffd") else ""
                shown = "".join(c if spells(c) else mark
                                for c in new_bytes.decode("utf-8", errors="replace"))
                try:
                    n_keep, feed = resync(self.table, self._ids, self.drafts, shown.encode())
                except UnspellableBytes:  # the drafter's own tail re-encodes unspellably
                    n_keep, feed = 0, []
        self._commit(n_keep, feed)

    def readable(self, ids: list[int]) -> list[int]:
        """``ids`` with each id past the drafter's logits width spelt in byte tokens, or left
        out where a byte has no token inside the width (drafts are always inside it)."""
        width = self.width
        if width is None or all(t < width for t in ids):
            return ids
        byte_ids, tb, out = self.table.byte_ids, self.table.token_bytes, []
        for t in ids:
            if t < width:
                out.append(t)
                continue
            spelt = [byte_ids[b] for b in (tb[t] if t < len(tb) else b"")]
            if all(b is not None and b < width for b in spelt):
                out.extend(spelt)
        return out

    def _commit(self, n_keep: int, feed: list[int]) -> None:
        base = len(self._ids)
        self._ids.extend(self.drafts[:n_keep])
        self._ids.extend(self.readable(feed))
        # the cache may hold ids[:base] + drafts[:k-1]; keep only what is still valid (after a
        # step that did not draft it holds no more: no call, where a backend's is not free)
        keep = base + n_keep
        if len(self.session) > keep:
            self.session.rollback(keep)
        self.drafts = []
