"""methods/slrs.py's `ByteTrie` on real tokenizers."""

import random

import pytest

from anydraft.bridge import token_table
from anydraft.methods.slrs import LINEAR_CHILDREN, ByteTrie
from anydraft.models.loading import load_tokenizer
from tests.models.test_synthetic import require_tokenizers


@pytest.mark.parametrize("spec", ["null:qwen2.5-0.5b", "null:smollm2-135m"])
def test_child_spans_are_the_spans_of_each_next_byte(spec):
    """`ByteTrie.child_spans` cuts a prefix's span by its next byte (counted or searched):
    the same ranges as searching the whole trie for prefix + b, for every b."""
    require_tokenizers(spec)
    trie = ByteTrie(token_table(load_tokenizer(spec)))
    rng = random.Random(0)
    prefixes = {b"", b" ", b"\xff", b"\xef\xbf", b" the", b"e"}
    prefixes |= {trie.keys[rng.randrange(len(trie.keys))][:n] for n in (1, 2, 3) for _ in range(40)}
    sizes = set()
    for prefix in prefixes:
        spans = [trie.span(prefix + bytes([b])) for b in range(256)]
        lo, hi = trie.child_spans(prefix)
        assert lo.tolist() == [s[0] for s in spans] and hi.tolist() == [s[1] for s in spans], prefix
        sizes.add(trie.span(prefix)[1] - trie.span(prefix)[0] > LINEAR_CHILDREN)
    assert sizes == {True, False}  # both ways of cutting were checked
