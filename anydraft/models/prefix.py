"""`PrefixCache`: KV caches kept after their generation ended, keyed by the token ids each holds,
so that a later sequence that starts alike reads only the rest (issue 57, docs/prefix-cache.md).

A chat client resends the whole conversation each turn: turn N's prompt starts with turn N-1's
prompt and answer, which the cache of turn N-1's row or session holds already. Kept caches are
whole rows of a batch (models/batch.py `OwnedRows`) or sessions of their own (`Decoder`'s, for
requests outside a batch); one is handed to the sequence whose ids share the longest usable
prefix with what it holds (llama-server reuses its slots so), rolled back to that prefix.

The budget counts tokens, each kept cache at what it holds (a llama.cpp session: its whole
context, allocated at its creation); the least recently kept are given up first, for room or
for a fresh cache where every one is taken.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

# the default budget: this share of the machine's memory, at most MAX_DEFAULT_MB. A
# conversation's turn holds a few thousand tokens (Qwen2.5-1.5B: 28 KB each, ~100 MB a turn of
# 3,500 tokens), so 1 GiB keeps about ten clients' last turns; on a llama.cpp batch the rows'
# caches are allocated with the batch, and keeping them costs no more memory
DEFAULT_SHARE = 1 / 16
MAX_DEFAULT_MB = 1024


def default_prefix_cache_mb() -> float:
    """The prefix cache's MiB where none is given: `DEFAULT_SHARE` of this machine's memory,
    at most `MAX_DEFAULT_MB`."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # no such query here: the cap
        return MAX_DEFAULT_MB
    return min(MAX_DEFAULT_MB, total / 2**20 * DEFAULT_SHARE)


@dataclass
class Kept:
    ids: list[int]  # the tokens the cache holds
    usable: int  # how many of them a later sequence may read as its own
    cost: int  # tokens it counts against the budget


class PrefixCache:
    """Kept caches (``handle`` -> `Kept`), at most ``tokens`` of them; ``drop(handle)`` frees
    one given up. Used by one thread (the cache's owner) at a time."""

    def __init__(self, tokens: int, drop: Callable[[Hashable], None]):
        self.tokens, self.drop = tokens, drop
        self.kept: OrderedDict[Hashable, Kept] = OrderedDict()  # least recently kept first

    def put(self, handle, ids: Sequence[int], usable: int, cost: int | None = None) -> bool:
        """Keep ``handle``, whose cache holds ``ids``, the first ``usable`` of which a later
        sequence may read as its own; False (not kept: the caller frees it) where it is worth
        nothing or does not fit the budget alone."""
        usable, cost = min(usable, len(ids)), len(ids) if cost is None else cost
        if usable <= 0 or cost > self.tokens:
            return False
        self.kept[handle] = Kept(list(ids), usable, cost)
        while sum(k.cost for k in self.kept.values()) > self.tokens:
            self.give_up_oldest()
        return True

    def take(self, ids: Sequence[int], fresh_free: bool) -> tuple[object, int] | None:
        """The kept cache to run a sequence that starts with ``ids`` on, and how many of them
        it holds already (at least one token is left to read), taken out of the cache; the
        caller rolls it back to them. One whose usable prefix shares the most tokens with
        ``ids``, where that keeps at least half of what it held (a shorter match would throw
        away a cache that a longer one may want later: while ``fresh_free``, a fresh cache is
        taken instead). None: take a fresh cache (`give_up_oldest` makes room where needed)."""
        best, shared = self.best(ids)
        if best is None or (fresh_free and 2 * shared < len(self.kept[best].ids)):
            return None
        del self.kept[best]
        return best, shared

    def best(self, ids: Sequence[int]) -> tuple[object, int]:
        """The kept cache whose usable prefix shares the most tokens with ``ids`` (at least one
        of them left to read) and how many, left in the cache; (None, 0) where none shares any."""
        best, shared = None, 0
        for handle, kept in self.kept.items():
            n = min(common_prefix(kept.ids, ids), kept.usable, len(ids) - 1)
            if n > shared:
                best, shared = handle, n
        return best, shared

    def give_up_oldest(self) -> bool:
        """Free the least recently kept cache; False where none is kept."""
        if not self.kept:
            return False
        handle, _ = self.kept.popitem(last=False)
        self.drop(handle)
        return True

    def clear(self) -> None:
        while self.give_up_oldest():
            pass


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens ``a`` and ``b`` share from their start."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
