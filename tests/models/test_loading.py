"""Loading a model's files: a failure names where the files are and the fix, never the model hub
for files that are here."""

import pytest

from anydraft.errors import AnydraftError
from anydraft.models import loading
from tests.helpers import tiny_llama


def test_a_damaged_converted_copy_is_blamed_not_the_hub(tmp_path, monkeypatch):
    """A GGUF's converted copy with config.json and no weights (what two servers converting at
    once could leave a reader, issue 61) was reported as "could not load ... from the model
    hub"."""
    monkeypatch.setenv("ANYDRAFT_CACHE", str(tmp_path / "cache"))  # not the real converted/
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    converted = loading.resolve(str(gguf)).converted_dir
    tiny_llama(64).config.save_pretrained(converted / "model")
    with pytest.raises(AnydraftError, match="remove that folder") as error:
        loading.load_model(str(gguf))
    assert str(converted) in str(error.value) and "hub" not in str(error.value)


def test_a_directory_without_weights_is_blamed_not_the_hub(tmp_path):
    tiny_llama(64).config.save_pretrained(tmp_path)
    with pytest.raises(AnydraftError, match="from the directory") as error:
        loading.load_model(str(tmp_path))
    assert str(tmp_path) in str(error.value) and "hub" not in str(error.value)
