"""The playground (issue 23): streamed chunks say where their text came from (`anydraft.spans`),
and the page at ``/`` shows it, tested in a real headless chromium against a real server.

The server drafts with the tiny model itself, adaptively, with prompt lookup: on a fresh server
the first request's first step probes the drafter (whose greedy drafts the target accepts: the
same model), and a repetitive prompt gets copies, so one answer shows all three origins."""

from __future__ import annotations

import json
import os
import shutil
from types import SimpleNamespace

import httpx
import pytest
import torch

from anydraft.decoding import Batch, DecodeState, Finish, Generation, TextAssembler
from anydraft.decoding.step import RowStep
from anydraft.sampling import SamplingParams
from tests.server.conftest import API_KEY
from tests.server_process import MODEL_ID, Server

TOKENS = [b"x", b"a", b"bc", b"\xc3", b"\xa9", b"<|im_end|>"]  # 5: a special token (and EOS)
REPETITIVE = "one two three four, one two three four, one two three four, one two three four, one"
ORIGINS = {"draft", "copy", "target"}
MAX_TOKENS = 120


# -- spans, without a model ------------------------------------------------------------------
def fake_generation(stops=(), max_new_tokens=50) -> Generation:
    state = DecodeState(SimpleNamespace(max_length=100), [9], SamplingParams(), torch.Generator())
    text = TextAssembler(TOKENS, frozenset({5}), stops)
    g = Generation(state, SimpleNamespace(name="fake"), max_new_tokens, frozenset({5}), text, Finish())
    g.row = SimpleNamespace()
    return g


def step(g: Generation, proposer: str, new: list[int], n_accepted: int) -> None:
    """One step of ``proposer`` that offered ``n_accepted + 1`` candidates (none: plain)."""
    assert g.ready()
    g.absorb(RowStep(new, n_accepted, n_accepted + 1 if proposer != "plain" else 0, proposer))


def test_a_token_takes_its_steps_origin_and_a_character_its_completing_token():
    g = fake_generation()
    step(g, "draft", [1, 2, 0], 2)  # "a", "bc" drafted; "x" the target's
    step(g, "copy", [3, 4, 0], 1)  # é: its first byte copied, completed by the target's byte
    step(g, "plain", [1], 0)
    piece = g.piece()
    assert piece.spans == [("abc", "draft"), ("xéxa", "target")] and piece.text == "abcxéxa"
    assert [(s["proposer"], s["offered"], s["accepted"], s["tokens"]) for s in piece.steps] == \
        [("draft", 3, 2, 3), ("copy", 2, 1, 3), ("plain", 0, 0, 1)]
    assert g.piece().text == "" and g.piece().steps == []  # each handed out once


def test_spans_follow_held_back_text_stop_strings_and_the_final_flush():
    g = fake_generation(stops=["bcx"])
    step(g, "copy", [1, 2], 1)  # "a" copied; the target's "bc" could begin the stop: held back
    assert g.piece().spans == [("a", "copy")]
    step(g, "draft", [0, 1], 1)  # a drafted "x" completes the stop: the text ends at "a"
    assert g.finish.reason == "stop" and not g.ready()
    assert g.piece().spans == [] and g.result()[1].text == "a"

    g = fake_generation(stops=["bcx"])
    step(g, "copy", [1, 2], 1)
    assert g.piece().spans == [("a", "copy")]
    step(g, "draft", [1, 0], 1)  # not the stop after all: the held-back "bc" goes out
    assert g.piece().spans == [("bc", "target"), ("a", "draft"), ("x", "target")]

    g = fake_generation(max_new_tokens=2)
    step(g, "copy", [1, 3, 0], 2)  # ends on half a character: flushed as U+FFFD, the copy's
    assert not g.ready()
    assert g.piece().spans == [("a\ufffd", "copy")]
    assert g.result() == ("", g.result()[1]) and g.result()[1].text == "a\ufffd"

    g = fake_generation()
    step(g, "draft", [1, 5, 2], 2)  # EOS (a special token: no text) ends it within the step
    assert g.finish.reason == "eos" and g.piece().spans == [("a", "draft")]


@pytest.mark.parametrize("method", ["sd", "lookup"])
def test_pieces_of_a_real_generation_join_to_its_text_and_count_its_tokens(model_dir, decoder, method):
    """The tiny model drafting for itself (sd: every greedy draft accepted) or copying from its
    prompt, at a fixed draft length (adaptive choices hang on timings): the pieces' spans join
    to the text plain greedy decoding gives, show the proposer's origin and the target's, and
    the steps add up to the generation's statistics."""
    from anydraft import Decoder
    from anydraft.config import DraftConfig

    dec = Decoder(target=str(model_dir), drafter=str(model_dir) if method == "sd" else None,
                  dtype="float32", draft=DraftConfig(method=method, adaptive=False))
    g = dec.start(REPETITIVE, 120, chat=False, temperature=0.0)
    batch, pieces = Batch(), []
    batch.join(g)
    while batch:
        batch.run_once()
        pieces.append(g.piece())
    tail, out = g.result()
    assert tail == ""
    assert all("".join(t for t, _ in p.spans) == p.text for p in pieces)
    assert "".join(p.text for p in pieces) == out.text == \
        decoder.generate(REPETITIVE, max_new_tokens=120, chat=False, temperature=0.0).text
    proposer = "draft" if method == "sd" else "copy"
    assert {o for p in pieces for _, o in p.spans} == {proposer, "target"}
    steps = [s for p in pieces for s in p.steps]
    assert {s["proposer"] for s in steps} <= {proposer, "plain"}
    assert sum(s["tokens"] for s in steps) == out.stats["new_tokens"]
    assert sum(s["accepted"] for s in steps) == out.stats["accepted"]
    assert sum(s["offered"] for s in steps) == out.stats["drafted"]


# -- the server ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def playground(model_dir, tmp_path_factory) -> Server:
    """A fresh server (its first generation is the page's): the tiny model drafting for itself,
    `auto` with adaptive drafting and prompt lookup, and an API key."""
    srv = Server(model_dir, tmp_path_factory.mktemp("playground") / "server.log",
                 "--drafter", str(model_dir), "--max-concurrency", "1", "--max-batch", "1",
                 api_key=API_KEY)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()
    assert "Traceback" not in srv.log(), srv.log()


def completion(srv: Server, **extra) -> httpx.Response:
    body = {"model": MODEL_ID, "prompt": REPETITIVE, "temperature": 0, "max_tokens": MAX_TOKENS, **extra}
    return httpx.post(srv.base + "/v1/completions", json=body, headers=srv.headers, timeout=120)


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium, headless, driven by its own chromium-driver (`make test` installs
    both; elsewhere the test is skipped without them, in CI it fails)."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromedriver are missing: apt-get install chromium chromium-driver")
        pytest.skip("needs Debian's chromium and chromium-driver (make test installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,900", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    drv = webdriver.Chrome(options=options, service=Service(driver))
    try:
        yield drv
    finally:
        drv.quit()


def test_the_page_streams_every_origin_compares_with_plain_and_shows_errors(playground, browser, tmp_path):
    """Runs first on its fresh server (see the module's docstring): the key is asked for once,
    the colored spans equal the API's completion for the same greedy request and show all three
    origins, plain decoding gives the same text, and a bad setting shows the server's message."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    page, wait = browser, WebDriverWait(browser, 180)
    page.get(playground.base + "/")
    wait.until(lambda d: d.find_element(By.ID, "key-form").is_displayed())
    page.find_element(By.ID, "key").send_keys(API_KEY)
    page.find_element(By.ID, "key-ok").click()
    wait.until(lambda d: d.find_element(By.ID, "m-method").text == "auto")
    assert not page.find_element(By.ID, "key-form").is_displayed()
    assert page.execute_script("return window.localStorage.length + document.cookie.length") == 0

    def run(prompt: str, temperature: str, compare: bool) -> None:
        page.execute_script("document.getElementById('prompt').value = arguments[0]", prompt)
        Select(page.find_element(By.ID, "endpoint")).select_by_value("completion")
        for field, value in (("temperature", temperature), ("max-tokens", str(MAX_TOKENS))):
            page.find_element(By.ID, field).clear()
            page.find_element(By.ID, field).send_keys(value)
        if page.find_element(By.ID, "compare").is_selected() != compare:
            page.find_element(By.ID, "compare").click()
        page.execute_script("document.body.dataset.state = ''")
        page.find_element(By.ID, "run").click()
        wait.until(lambda d: d.execute_script("return document.body.dataset.state") == "done")

    def spans(panel: str) -> list:
        return page.execute_script(
            "return [...document.querySelectorAll(arguments[0] + ' .text span')]"
            ".map(s => [s.textContent, s.dataset.origin])", f"#out-{panel}")

    expected = None
    for _ in range(3):  # which proposer a step takes follows measured costs: on a busy machine
        run(REPETITIVE, "0", compare=True)  # a run may not copy; every run must be exact
        assert not page.find_element(By.ID, "error").is_displayed()
        shown = spans("main")
        expected = expected or completion(playground).json()["choices"][0]["text"]
        assert "".join(text for text, _ in shown) == expected
        assert page.find_elements(By.CSS_SELECTOR, "#out-main .timeline .bar")
        assert "tokens/s" in page.find_element(By.CSS_SELECTOR, "#out-main .stats").text
        plain = spans("plain")  # lossless: plain decoding writes the same, all of it the target's
        assert "".join(text for text, _ in plain) == expected and {o for _, o in plain} == {"target"}
        if {origin for _, origin in shown} == ORIGINS:
            break
    assert {origin for _, origin in shown} == ORIGINS, shown
    page.save_screenshot(os.environ.get("ANYDRAFT_PLAYGROUND_SCREENSHOT") or str(tmp_path / "playground.png"))

    run("hello", "-1", compare=False)
    message = completion(playground, temperature=-1).json()["error"]["message"]
    assert page.find_element(By.ID, "error").text == message and "temperature" in message


def test_the_page_needs_no_key_but_the_api_does(playground):
    r = httpx.get(playground.base + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert "http://" not in r.text and "https://" not in r.text  # offline
    # its script is a file of its own: the policy runs no inline script (issue 42)
    assert '<script src="/playground.js"></script>' in r.text and "<script>" not in r.text
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "script-src 'unsafe-inline'" not in csp
    js = httpx.get(playground.base + "/playground.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert js.headers["x-content-type-options"] == "nosniff" and "apiKey" in js.text
    assert httpx.head(playground.base + "/").status_code == 200
    assert httpx.get(playground.base + "/v1/models").status_code == 401
    assert httpx.get(playground.base + "/", headers={"Host": "evil.example"}).status_code == 400


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_every_chunk_carries_spans_that_join_to_its_text(playground, chat):
    body = {"model": MODEL_ID, "temperature": 0, "max_tokens": 60, "stream": True}
    if chat:
        body["messages"] = [{"role": "user", "content": REPETITIVE}]
    else:
        body["prompt"] = REPETITIVE
    path = "/v1/chat/completions" if chat else "/v1/completions"
    chunks = []
    with httpx.stream("POST", playground.base + path, json=body, headers=playground.headers,
                      timeout=120) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    texts, steps = [], []
    for c in chunks:
        choice = c["choices"][0]
        text = (choice["delta"].get("content") or "") if chat else choice["text"]
        if text:
            assert "".join(s["text"] for s in c["anydraft"]["spans"]) == text
            assert {s["origin"] for s in c["anydraft"]["spans"]} <= ORIGINS
        steps += c.get("anydraft", {}).get("steps", [])
        texts.append(text)
    final = chunks[-1]
    assert final["choices"][0]["finish_reason"] and final["anydraft"]["method"]
    assert sum(s["tokens"] for s in steps) == final["usage"]["completion_tokens"]
    body.pop("stream")
    whole = httpx.post(playground.base + path, json=body, headers=playground.headers, timeout=120).json()
    answer = whole["choices"][0]["message"]["content"] if chat else whole["choices"][0]["text"]
    assert "".join(texts) == answer


def test_plain_decoding_per_request_is_validated(playground):
    r = completion(playground, anydraft_method="sd")
    assert r.status_code == 400 and r.json()["error"]["param"] == "anydraft_method"
    plain = completion(playground, anydraft_method="ar", stream=True)
    assert plain.status_code == 200
    steps = [s for line in plain.text.splitlines() if line.startswith("data: {")
             for s in json.loads(line[6:]).get("anydraft", {}).get("steps", [])]
    assert steps and {s["proposer"] for s in steps} == {"plain"}
