"""`Compiler` (constraints/matcher.py): llguidance's view of a tokenizer is shared by the copies
of one tokenizer (the server's workers) and never by two tokenizers that differ."""

from anydraft.constraints import Grammar
from anydraft.constraints.matcher import Compiler
from tests.methods.toys import TARGET_MERGES, TARGET_VOCAB, toy_tokenizer


def test_two_tokenizers_of_one_name_and_size_get_their_own_masks():
    import copy

    plain = toy_tokenizer(TARGET_VOCAB, TARGET_MERGES)
    swapped = TARGET_VOCAB[:1] + ["b", "a"] + TARGET_VOCAB[3:]  # ids 1 and 2 trade places
    other = toy_tokenizer(swapped, TARGET_MERGES)
    assert (plain.name_or_path, len(plain)) == (other.name_or_path, len(other))
    grammar = Grammar("regex", "a+")
    allowed = [Compiler(tok, len(TARGET_VOCAB), frozenset({0})).constraint(grammar).allowed().tolist()
               for tok in (plain, copy.deepcopy(plain), other)]
    assert allowed[0] == allowed[1] and allowed[0][1] and not allowed[0][2]
    assert allowed[2][2] and not allowed[2][1]  # "a" is id 2 there
