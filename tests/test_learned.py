"""Learned statistics saved to a file and seeded from it (anydraft/learned.py): a seeded
decoder decides as the one that learned them, costs only on the machine that measured them."""

import copy
import json
from types import SimpleNamespace

import pytest
import torch

from anydraft import learned
from anydraft.decoding.stats import Stats
from anydraft.errors import AnydraftError
from anydraft.planning.estimates import Estimates
from anydraft.planning.policy import Measured, Policy


def model(name: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, backend="torch", dtype="float32", device=torch.device("cpu"))


def decoder(target="target", drafter="drafter") -> SimpleNamespace:
    """Enough of a Decoder for learned.py: its models and its estimates."""
    return SimpleNamespace(target=model(target), drafter=model(drafter), estimates=Estimates())


def request(estimates: Estimates, steps: int, draft: float, accepted: int) -> list[int]:
    """The draft lengths one request chooses, each step measuring a 0.1 s target call (any
    size), ``draft`` seconds per drafter pass, 1 ms besides, and ``accepted`` candidates kept."""
    state = SimpleNamespace(stats=Stats(), committed=[0] * 10, budget=100,
                            target=SimpleNamespace(max_length=1000))
    p = Policy(5, True, estimates, True, estimates.of("sd", True))
    ks = []
    for _ in range(steps):
        choice = p.choose(state)
        k = choice.k
        p.observe(choice, Measured(wall=0.101 + draft * k, draft=draft * k, target=0.1, calls=k,
                                   scored=1 + k, offered=k, accepted=min(accepted, k), read=0))
        ks.append(k)
    return ks


@pytest.fixture
def trained(tmp_path):
    """A decoder that learned from one request (a cheap drafter, every draft kept), and the
    file its statistics were saved to."""
    dec = decoder()
    request(dec.estimates, 30, draft=0.005, accepted=5)
    dec.estimates.of("copy", True, 2)  # prompt lookup's keys have three parts
    dec.estimates.costs.profile = {1: 0.1, 9: 0.2}  # and the profile it started from
    path = tmp_path / "stats.json"
    learned.save(dec, path)
    return dec, path


def test_a_round_trip_gives_the_same_estimates(trained):
    dec, path = trained
    seeded = decoder()
    assert learned.load(seeded, path) == f"seeded from {path} (29 observations)"  # one step was plain
    assert learned.to_json(seeded) == learned.to_json(dec)
    assert seeded.estimates.of("sd", True).a(1) == dec.estimates.of("sd", True).a(1)
    assert list(seeded.estimates.acceptance) == [("sd", True), ("copy", True, 2)]


@pytest.mark.parametrize("draft, accepted", [(0.005, 5), (0.05, 0)],
                         ids=["a good pair drafts at once", "a bad pair decodes plainly at once"])
def test_a_seeded_policy_decides_as_the_one_that_learned(tmp_path, draft, accepted):
    dec = decoder()
    request(dec.estimates, 30, draft, accepted)
    learned.save(dec, tmp_path / "stats.json")
    seeded = decoder()
    learned.load(seeded, tmp_path / "stats.json")
    warm = request(copy.deepcopy(dec.estimates), 8, draft, accepted)
    assert request(seeded.estimates, 8, draft, accepted) == warm
    # a cold policy drafts fully, then measures a plain step
    assert request(Estimates(), 2, draft, accepted) == [5, 0] != warm[:2]


def test_costs_from_another_machine_are_not_seeded(trained):
    dec, path = trained
    data = json.loads(path.read_text())
    data["costs"]["machine"] = "another"
    path.write_text(json.dumps(data))
    seeded = decoder()
    assert "from another machine or device: acceptance only" in learned.load(seeded, path)
    assert not seeded.estimates.costs.target and seeded.estimates.costs.draft.value is None
    acc, theirs = seeded.estimates.of("sd", True), dec.estimates.of("sd", True)
    assert acc.a(3) == theirs.a(3) and acc.steps == theirs.steps
    assert acc.overhead.value == 0.0 != theirs.overhead.value  # seconds: a cost


def _edit(data: dict, change) -> dict:
    change(data)
    return data


def test_costs_learned_with_huge_pages_are_seeded_without(tmp_path, started_with_hugepages):
    """A server the `anydraft` command started has huge pages, a program that imports anydraft
    may not: with the state in the machine's key, costs one learned were "from another
    machine" to the other (issue 61). The state is recorded beside them."""
    dec = decoder()
    request(dec.estimates, 30, draft=0.005, accepted=5)
    started_with_hugepages(True)
    learned.save(dec, tmp_path / "stats.json")
    started_with_hugepages(False)
    seeded = decoder()
    assert learned.load(seeded, tmp_path / "stats.json").startswith("seeded from")
    assert seeded.estimates.costs.draft.value == dec.estimates.costs.draft.value
    assert json.loads((tmp_path / "stats.json").read_text())["costs"]["hugepages"] is True


@pytest.mark.parametrize("text, error", [
    ("{not json", "not a readable JSON file"),
    ('{"format": "something else"}', "not an anydraft stats file"),
    (lambda d: _edit(d, lambda d: d.update(version=99)), "version 99, and this anydraft reads version 1"),
    (lambda d: _edit(d, lambda d: d["acceptance"][0].pop("positions")), "malformed .*positions"),
    (lambda d: _edit(d, lambda d: d["costs"].update(draft="fast")), "malformed"),
    (lambda d: _edit(d, lambda d: d["pair"]["target"].update(model="other")),
     r"written for other \(torch float32\) with drafter drafter .* not for target .*: use a "
     "stats file written for this pair, or delete it"),
    # issue 42: these were seeded, and then every request of the server failed
    (lambda d: _edit(d, lambda d: d["acceptance"][0].update(ratio=[1e308, -5.0])),
     r"stats file .*stats.json is malformed .*-5.0.* finite number >= 0.*: delete it"),
    (lambda d: _edit(d, lambda d: d["acceptance"][0]["positions"].append([1e308, 1e-300])),
     "no finite value"),
    (lambda d: _edit(d, lambda d: d["costs"].update(draft=[1.0, float("inf")])), "finite number"),
    (lambda d: _edit(d, lambda d: d["costs"].update(profile_weight=float("nan"))), "profile_weight"),
    (lambda d: _edit(d, lambda d: d["acceptance"][0].update(steps=-3)), "steps must be"),
    (lambda d: _edit(d, lambda d: d["acceptance"][0].update(steps=1e400)), "steps must be"),
], ids=["not json", "another format", "another version", "a part missing", "a bad value",
        "another pair", "a negative weight", "an infinite mean", "an infinity", "a nan",
        "negative steps", "infinite steps"])
def test_a_bad_file_is_refused_with_the_fix(trained, text, error):
    _, path = trained
    path.write_text(text if isinstance(text, str) else json.dumps(text(json.loads(path.read_text()))))
    before = learned.to_json(seeded := decoder())
    with pytest.raises(AnydraftError, match=error):
        learned.load(seeded, path)
    assert learned.to_json(seeded) == before  # nothing half-seeded


def test_the_file_follows_the_umask(tmp_path):
    """Issue 42: it was written 0600 whatever the umask (a temporary file's mode)."""
    import os

    old = os.umask(0o022)
    try:
        learned.save(decoder(), tmp_path / "stats.json")
    finally:
        os.umask(old)
    assert (tmp_path / "stats.json").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["stats.json"]  # no partial file left


def test_a_missing_file_says_so(tmp_path):
    with pytest.raises(AnydraftError, match="not found"):
        learned.load(decoder(), tmp_path / "none.json")


def test_greedy_output_is_plain_decodings_with_seeded_stats(tmp_path):
    from anydraft import Decoder
    from tests.helpers import byte_tokenizer, tiny_llama

    tok, target = byte_tokenizer(), tiny_llama(len(byte_tokenizer()))
    first = Decoder(target=target, tokenizer=tok, drafter=target, drafter_tokenizer=tok)
    first.generate("hello world", max_new_tokens=12)
    first.save_stats(tmp_path / "stats.json")
    dec = Decoder(target=target, tokenizer=tok, drafter=target, drafter_tokenizer=tok)
    assert dec.load_stats(tmp_path / "stats.json").startswith("seeded from")
    out = dec.generate("the quick brown fox", max_new_tokens=16)
    assert out.stats["drafted"] > 0
    assert out.token_ids == dec.generate("the quick brown fox", max_new_tokens=16, method="ar").token_ids


def test_a_decoder_starts_from_the_profile_cached_for_its_exact_path(tmp_path, monkeypatch):
    """The target's cost curve measured on this machine (hardware/profile.py) for the same
    model, backend, dtype and device seeds the policy; another dtype's does not, and loading
    a stats file from another machine keeps it."""
    from anydraft import Decoder
    from anydraft.hardware import profile
    from anydraft.models.auto import model_key
    from tests.helpers import byte_tokenizer, tiny_llama

    monkeypatch.setenv("ANYDRAFT_CACHE", str(tmp_path / "cache"))
    tok = byte_tokenizer()
    tiny_llama(len(tok)).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    spec, curve = str(tmp_path / "m"), {1: 0.01, 2: 0.011, 5: 0.015}
    profile.save(model_key(spec, "torch", "bfloat16", "cpu"), curve)
    assert Decoder(target=spec, dtype="float32", device="cpu").estimates.costs.profile == {}
    profile.save(model_key(spec, "torch", "float32", "cpu"), curve)
    dec = Decoder(target=spec, dtype="float32", device="cpu")
    assert dec.estimates.costs.profile == curve
    dec.save_stats(tmp_path / "stats.json")
    data = json.loads((tmp_path / "stats.json").read_text())
    data["costs"].update(machine="another", profile={"1": 9.0})
    (tmp_path / "stats.json").write_text(json.dumps(data))
    dec.load_stats(tmp_path / "stats.json")
    assert dec.estimates.costs.profile == curve
