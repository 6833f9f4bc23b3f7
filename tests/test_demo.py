"""`anydraft demo` explains a slowdown instead of only showing it."""

from types import SimpleNamespace

from anydraft import demo
from anydraft.models import auto


def test_a_slowdown_is_explained_from_the_measured_curve(monkeypatch):
    monkeypatch.setattr(auto, "curve_of", lambda spec, loaded, backend: {1: 0.056, 9: 0.482})
    target = SimpleNamespace(backend="llamacpp", path="llama.cpp (GGUF)")
    line = demo.why_slower("qwen2.5-coder-1.5b", target, 1, 3)
    assert "on 1 of 3 prompts" in line and "llama.cpp (GGUF)" in line
    assert "9 tokens for 8.6x the cost of one" in line and "anydraft doctor" in line
