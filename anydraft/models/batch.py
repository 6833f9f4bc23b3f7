"""Many sequences in one model: the batch protocol that batched decoding builds on (issue 21,
docs/architecture.md).

A `BatchSession` holds the KV caches of up to ``max_rows`` sequences (rows) of one model and
scores new tokens of several rows in ONE model call, which is where batching gains: a call's
cost grows slowly with the tokens in it where the model's cost curve is flat
(hardware/profile.py). Each row keeps its own length and rolls back on its own.

- ``add_row()``: a free row id (raises when all ``max_rows`` are taken).
- ``remove_row(row)``: forget the row; its id may be given out again.
- ``release(row)``: `remove_row` from any thread: done by the batch's own thread at its next
  ``add_row`` or ``feed_rows`` (`OwnedRows`).
- ``feed_rows({row: ids}, {row: n})``: append each row's ``ids`` and return, per row, float32
  CPU logits for its last ``n`` positions: exactly what ``Session.feed(ids, n)`` returns for
  that row alone (to float rounding, where the backend sums in another order).
- ``rollback(row, n)``, ``length(row)``.

`RowView` is one row seen as a plain `Session` (models/session.py), so everything written for
one sequence (the decoding loop, the drafter, every method) runs on a row unchanged.
`SerialBatch` runs each row in its own `Session`, one after another: exact by construction, no
faster, and the fallback of every backend without batched calls.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ..errors import AnydraftError
from .prefix import PrefixCache
from .session import close_session


class BatchSession(Protocol):
    vocab_size: int  # width of a logits row
    max_length: int  # context window of each row, in tokens
    max_rows: int
    # every position scored bit-identically whatever the call (models/exact.py); its rows'
    # prompts are then read in pieces that do not depend on the batch (planning/call.py `prefill`)
    exact: bool

    def add_row(self) -> int: ...

    def remove_row(self, row: int) -> None: ...

    def release(self, row: int) -> None: ...

    def length(self, row: int) -> int: ...

    def rollback(self, row: int, n: int) -> None: ...

    def feed_rows(self, feeds: dict[int, Sequence[int]], rows: dict[int, int]) -> dict[int, torch.Tensor]: ...


@dataclass
class Rows:
    """Where the generations of one batch run: rows of the target's `BatchSession`, and of the
    drafter's where it batches too (None: each drafter on a session of its own), so that each
    drafting pass of all rows is one drafter call (decoding/step.py)."""

    target: BatchSession
    drafter: BatchSession | None = None


def full(max_rows: int) -> AnydraftError:
    return AnydraftError(f"all {max_rows} rows of the batch are taken: wait for a row to leave")


class OwnedRows:
    """A batch is its owner's: only the thread that runs it calls it (docs/architecture.md,
    "Threads"). A `RowView` collected elsewhere (its finalizer runs on whatever thread drops
    the last reference: the server's event loop, another worker) must not cut its row out of a
    cache the owner may be decoding in at that moment, so it only queues the row here
    (``release``, safe from any thread); the owner removes the queued rows before it next adds
    a row or feeds (``reclaim``).

    The prefix cache (issue 57, docs/prefix-cache.md): a row whose generation ended may be
    kept (``keep``) with the token ids its cache holds, up to ``keep_tokens`` tokens over all
    kept rows (0: none kept); ``take_row(ids)`` gives a sequence that starts with ``ids`` the
    kept row holding the longest usable prefix of them, rolled back to it, so that it reads
    only the rest. Kept rows are given up, least recently kept first, for room or for a row."""

    keep_tokens = 0  # the owner sets it (`Decoder.new_rows`)

    def release(self, row: int) -> None:
        self.__dict__.setdefault("_released", deque()).append(row)  # one step each: thread-safe

    def reclaim(self) -> None:
        released = self.__dict__.get("_released")
        while released:
            self.remove_row(released.popleft())

    @property
    def prefixes(self) -> PrefixCache:
        """The kept rows (models/prefix.py)."""
        if "_prefixes" not in self.__dict__:
            self._prefixes = PrefixCache(self.keep_tokens, self.remove_row)
        self._prefixes.tokens = self.keep_tokens
        return self._prefixes

    def keep(self, row: int, ids: Sequence[int], usable: int) -> None:
        """``row``'s generation ended with ``ids`` in its cache (a step's tokens past what the
        output kept are cut off here), the first ``usable`` of which a later sequence may read
        as its own (decoding/loop.py `Generation.leave`): keep it if that fits, else remove it."""
        if self.length(row) > len(ids):
            self.rollback(row, len(ids))
        if not self.prefixes.put(row, ids, usable):
            self.remove_row(row)

    def take_row(self, ids: Sequence[int]) -> int:
        """A row for a sequence that starts with ``ids``: a kept row that holds a prefix of
        them (`PrefixCache.take`), rolled back to it (its `length`), or a fresh row, a kept
        one given up for it where every row is taken. Where the batch can share positions
        between rows (``copy_prefix``: llama.cpp's unified cache), a fresh row starts with the
        prefix a kept row shares with ``ids`` (a system prompt common to conversations), and
        the kept row stays for its own conversation."""
        self.reclaim()
        taken = self.prefixes.take(ids, fresh_free=self.rows_taken() < self.max_rows)
        if taken is not None:
            row, shared = taken
            self.rollback(row, shared)
            return row
        if self.rows_taken() >= self.max_rows:
            self.prefixes.give_up_oldest()
        row = self.add_row()
        source, shared = self.prefixes.best(ids)
        if shared and hasattr(self, "copy_prefix"):
            self.copy_prefix(source, row, shared)
        return row


class RowLengths(OwnedRows):
    """The row bookkeeping of a `BatchSession` whose rows are only lengths on this side (the
    KV cache, if any, is the model's): ``max_rows`` slots, ``lengths`` row -> its length."""

    max_rows: int
    lengths: dict[int, int]
    exact = False  # an exact `TorchBatch` says so

    def add_row(self) -> int:
        self.reclaim()
        if len(self.lengths) >= self.max_rows:
            raise full(self.max_rows)
        row = min(set(range(self.max_rows)) - set(self.lengths))
        self.lengths[row] = 0
        return row

    def remove_row(self, row: int) -> None:
        self.lengths.pop(row, None)

    def rows_taken(self) -> int:
        return len(self.lengths)

    def length(self, row: int) -> int:
        return self.lengths[row]

    def rollback(self, row: int, n: int) -> None:
        assert 0 <= n <= self.lengths[row], (n, self.lengths[row])
        self.lengths[row] = n


class RowView:
    """One row of a `BatchSession` as a `Session`; the row is freed when the view is closed (by
    the batch's owner) or released when it is collected (on any thread: `OwnedRows`)."""

    def __init__(self, batch: BatchSession, ids: Sequence[int] | None = None):
        """A row of ``batch``; for a sequence that starts with ``ids``, one that may hold a
        prefix of them already (`OwnedRows.take_row`: its length says how much)."""
        self.batch = self._rows = batch
        self.exact = batch.exact
        self.row = batch.add_row() if ids is None else batch.take_row(ids)
        self.vocab_size, self.max_length = batch.vocab_size, batch.max_length
        self._free = weakref.finalize(self, batch.release, self.row)

    def __len__(self) -> int:
        return self._rows.length(self.row)

    def feed(self, ids: Sequence[int], rows: int | None = None) -> torch.Tensor:
        return self._rows.feed_rows({self.row: ids}, {self.row: len(ids) if rows is None else rows})[self.row]

    def rollback(self, n: int) -> None:
        self._rows.rollback(self.row, n)

    def close(self) -> None:
        """Free the row now (the batch's owner calls this: `Generation.leave`)."""
        if self._free.detach() is not None:
            self._rows.remove_row(self.row)

    def keep(self, ids: Sequence[int], usable: int) -> None:
        """Close, keeping the row's cache for a later sequence where the batch keeps any
        (`OwnedRows.keep`; ``ids``: what the cache holds)."""
        if self._free.detach() is not None:
            self._rows.keep(self.row, ids, usable)


class OwnRow(RowView):
    """A sequence of its own (``batch`` None) kept as the one row of a `BatchSession` of its own:
    a session that scores exactly as that batch's rows do (an exact torch session,
    models/exact.py)."""

    def __init__(self, rows: BatchSession):
        super().__init__(rows)
        self.batch = None


class SerialBatch(OwnedRows):
    """A `BatchSession` whose rows are sessions of their own, fed one after another."""

    def __init__(self, new_session: Callable[[], object], max_rows: int, exact: bool = False):
        if max_rows < 1:
            raise AnydraftError(f"a batch needs at least one row (got max_rows={max_rows})")
        self.new_session, self.max_rows, self.exact = new_session, max_rows, exact
        self.sessions: dict[int, object] = {}
        probe = new_session()  # the width and window every row shares
        self.vocab_size, self.max_length = probe.vocab_size, probe.max_length
        self._spare = [probe]

    def add_row(self) -> int:
        self.reclaim()
        if len(self.sessions) >= self.max_rows:
            raise full(self.max_rows)
        row = min(set(range(self.max_rows)) - set(self.sessions))
        self.sessions[row] = self._spare.pop() if self._spare else self.new_session()
        return row

    def remove_row(self, row: int) -> None:
        close_session(self.sessions.pop(row, None))

    def rows_taken(self) -> int:
        return len(self.sessions)

    def length(self, row: int) -> int:
        return len(self.sessions[row])

    def rollback(self, row: int, n: int) -> None:
        self.sessions[row].rollback(n)

    def feed_rows(self, feeds: dict[int, Sequence[int]], rows: dict[int, int]) -> dict[int, torch.Tensor]:
        self.reclaim()
        return {row: self.sessions[row].feed(ids, rows[row]) for row, ids in feeds.items()}
