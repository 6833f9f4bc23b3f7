"""Where anydraft keeps its files (`cache_dir`), each written whole or not at all, by any number of
processes at once.

Every file anydraft keeps (cost curves, scout winners, learned statistics, assembled,
converted and quantized models) is written under a scratch name of its own, unique to the
writer, next to the final path, and then renamed into place, which is atomic on one file
system: a reader sees the old file or the new one, never half of one, and two writers never
write into the same scratch file. Of several writers of a file the last rename wins; of
several writers of a directory (a model converted once, made from one source whoever makes it)
the first stays, since replacing a directory is a removal and a rename, and a reader between
the two would find a half-removed model.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path


def cache_dir() -> Path:
    """Root of everything anydraft writes: ``$ANYDRAFT_CACHE`` or ``~/.cache/anydraft``."""
    return Path(os.environ.get("ANYDRAFT_CACHE", Path.home() / ".cache" / "anydraft"))


@contextlib.contextmanager
def replacing(path, directory: bool = False):
    """Yield a fresh scratch path next to ``path`` (nothing there yet; with ``directory`` an
    empty directory) to write into; when the block ends without an exception it is renamed to
    ``path``, and otherwise it is removed. A file replaces the file there. A directory takes
    ``path`` only where nothing (or an empty directory) is there: where another writer's copy
    is, that one stays and this one is dropped, so once a directory is at ``path`` it stays
    whole for every reader (issue 61: two servers converting one GGUF at once, the second
    removing the first's weights under a reader). A directory left broken at ``path`` by
    other means stays too: its reader must say to remove it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a random name rather than tempfile's: that one is created private to its owner (0600,
    # 0700), and the file or directory keeps the scratch's permissions when renamed
    scratch = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")
    if directory:
        scratch.mkdir()
    try:
        yield scratch
        try:
            # rename(2) puts a directory over an empty one only: atomic "rename if absent"
            os.replace(scratch, path)
        except OSError:
            if not (directory and path.is_dir()):
                raise
    finally:
        if directory:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            scratch.unlink(missing_ok=True)


def write_text(path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (`replacing`)."""
    with replacing(path) as scratch:
        scratch.write_text(text)
