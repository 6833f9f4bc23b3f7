"""Files written whole or not at all, by any number of processes at once.

Every file anydraft keeps (cost curves, scout winners, learned statistics, assembled,
converted and quantized models) is written under a scratch name of its own, unique to the
writer, next to the final path, and then renamed over it with `os.replace`, which is atomic
on one file system: a reader sees the old file or the new one, never half of one, and two
writers never write into the same scratch file (of several, the last rename wins).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path


@contextlib.contextmanager
def replacing(path, directory: bool = False):
    """Yield a fresh scratch path next to ``path`` (nothing there yet; with ``directory`` an
    empty directory) to write into; when the block ends without an exception it replaces ``path``,
    and otherwise it is removed. A directory at ``path`` is removed first (os.replace renames
    over an empty one only); should another writer put its own there in between, that one
    stays and this copy is dropped: both were made from the same source."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a random name rather than tempfile's: that one is created private to its owner (0600,
    # 0700), and the file or directory keeps the scratch's permissions when renamed
    scratch = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")
    if directory:
        scratch.mkdir()
    try:
        yield scratch
        if directory:
            shutil.rmtree(path, ignore_errors=True)
        try:
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
