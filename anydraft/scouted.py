"""What `anydraft scout` (anydraft/scout/) chose for a target: its winner, saved per target and
machine, and ``drafter="auto"``, which reads it (decoder.py).

A winner holds on the machine that measured it (another machine's cost curves differ), so it
lives in ``$ANYDRAFT_CACHE/scout/<machine key>/``, one file per target, next to the cost
curves it was predicted from. Whether huge pages were on is a field of the record
(``hugepages``), not part of the key: `anydraft scout` runs with them, a program that imports
anydraft may not, and it reads the same winner (`Machine.key`).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path

from .atomic import cache_dir, write_text
from .errors import AnydraftError


def _target_key(target: str) -> str:
    """The target's identity: its files (as the cost curves key it), not the name it was given."""
    from .models.loading import resolve

    source = resolve(target)
    return source.cache_key or source.path


def path_for(target: str) -> Path:
    from .hardware import this_machine

    digest = hashlib.sha256(_target_key(target).encode()).hexdigest()[:16]
    return cache_dir() / "scout" / this_machine().key / f"{digest}.json"


def save(target: str, choice: dict) -> Path:
    """Write ``choice`` (drafter, drafter_backend, method, ...) as the winner for ``target``."""
    from .hardware import this_machine

    path = path_for(target)
    machine = this_machine()
    record = {"target": target, "target_key": _target_key(target), "machine": machine.lines(),
              "hugepages": machine.hugepages, "date": datetime.date.today().isoformat(), **choice}
    write_text(path, json.dumps(record, indent=1) + "\n")
    return path


def load(target: str) -> tuple[dict, Path]:
    """The saved winner for ``target`` on this machine and its file; a clear error without one."""
    path = path_for(target)
    if not path.is_file():
        raise AnydraftError(f"no scout result for {target}: run `anydraft scout --target {target}`")
    return json.loads(path.read_text()), path


def auto_drafter(target, drafter_backend: str | None, progress=None) -> tuple[str | None, str | None]:
    """``(drafter, drafter backend)`` for ``drafter="auto"``: the scout's winner for ``target``
    on this machine (drafter None: plain decoding or prompt lookup won). A backend the caller
    chose stays."""
    if not isinstance(target, str):
        raise AnydraftError('drafter="auto" needs the target by name (a catalog name, hub id, '
                            "directory or .gguf): the scout's choice is saved per target")
    record, path = load(target)
    drafter = record.get("drafter")
    if progress:
        what = (f"{drafter} on {record['drafter_backend']}" if drafter else
                f"none ({'plain decoding' if record['method'] == 'ar' else record['method']} won)")
        progress(f"drafter auto: {what}, chosen by anydraft scout on {record['date']} ({path})")
    return drafter, (drafter_backend or record.get("drafter_backend")) if drafter else drafter_backend
