"""What a decoder learned about its pair, saved to a JSON file and seeded from one, so a new
process (a restarted server, a new replica) starts warm instead of from the priors.

The adaptive policy (anydraft/planning/) learns per pair: acceptance per proposer (per draft
position), and what steps cost. Every running mean is saved as ``[total, weight]`` (its value
is total / weight; both are discounted by `Settings.forget` per observation and `Settings.fade`
per idle step), so a seeded mean is the very mean that was saved: the next observation moves
it exactly as it would have moved it in the process that wrote the file. For an acceptance
position that pair reads as ``[accepted, reached]``, discounted counts::

    {"format": "anydraft-stats", "version": 1,
     "pair": {"target":  {"model": "qwen2.5-coder-1.5b", "backend": "torch", "dtype": "float32"},
              "drafter": {"model": "smollm2-135m", "backend": "llamacpp", "dtype": ""}},
     "acceptance": [{"key": ["slem", true], "steps": 412, "idle": 0, "ratio": [9.7, 9.9],
                     "positions": [[7.1, 9.9], [5.0, 7.1], ...], "overhead": [0.02, 9.9]}, ...],
     "costs": {"machine": "3f0c...", "devices": ["cpu", "cpu"], "hugepages": true,
               "target": {"1": [0.61, 6.5], "6": [0.93, 9.9]}, "draft": [0.11, 9.9],
               "read": [0.004, 2.7], "plain_overhead": [0.01, 6.5],
               "profile": {"1": 0.060, "2": 0.064, ...}, "profile_weight": 0.0013}}

``pair`` is what the file is valid for: acceptance depends on the two models and the
numerics they run in, so a file for another pair is refused. Costs (``costs`` and each
proposer's ``overhead``, in seconds) depend on the machine too: they are seeded only on the
machine (`Machine.key`) and devices that measured them; elsewhere the acceptance alone is.
``hugepages`` says whether the process that learned them had huge pages: recorded, not
compared, as the machine's key leaves it out (a server the `anydraft` command starts has them,
a program that imports anydraft may not, and both learn on the same machine).
``profile`` is the target's cost curve as hardware/profile.py measured it (seconds per call
by tokens scored), a prior worth ``profile_weight`` calls that fades as calls are observed.
Acceptance keys are ``[method, greedy]``, and ``["copy", greedy, n]`` for prompt lookup after
an n-token match. ``drafter`` is null without a drafter (prompt lookup's statistics alone).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .atomic import write_text
from .errors import AnydraftError
from .planning.estimates import Acceptance, Costs, Estimates, Mean

FORMAT, VERSION = "anydraft-stats", 1


def pair_of(decoder) -> dict:
    """What a file's acceptance is valid for: each model, its backend and its dtype."""
    def model(loaded):
        return None if loaded is None else {"model": loaded.name, "backend": loaded.backend,
                                            "dtype": loaded.dtype}

    return {"target": model(decoder.target), "drafter": model(decoder.drafter)}


def place_of(decoder) -> dict:
    """What a file's costs are valid for, beyond the pair: this machine and the devices."""
    from .hardware.machine import this_machine

    models = (decoder.target, decoder.drafter)
    return {"machine": this_machine().key,
            "devices": [m.device.type for m in models if m is not None]}


def observations(learned: dict) -> int:
    """Steps that taught a `snapshot` something: drafting (or copying) steps."""
    return sum(entry["steps"] for entry in learned["acceptance"])


# -- to and from JSON ----------------------------------------------------------------------
def _mean(m: Mean) -> list[float]:
    return [m.total, m.weight]


def _number(value, what: str) -> float:
    """``value`` as a float, refused (ValueError) unless finite and >= 0: every saved number
    is a discounted count or seconds, and a negative weight or an inf made every request of a
    server seeded with it fail (issue 42)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    return float(value)


def _read_mean(pair) -> Mean:
    if not isinstance(pair, list) or len(pair) != 2:
        raise ValueError(f"a mean must be [total, weight], got {pair!r}")
    total, weight = (_number(x, f"each number of the mean {pair!r}") for x in pair)
    if weight > 0 and not math.isfinite(total / weight):
        raise ValueError(f"the mean {pair!r} has no finite value (total / weight)")
    mean = Mean()
    mean.total, mean.weight = total, weight
    return mean


def snapshot(estimates: Estimates) -> dict:
    """What ``estimates`` learned as the file holds it (its ``acceptance`` and its ``costs``
    but the place): new lists and dicts of numbers, which the steps that go on changing
    ``estimates`` leave alone. Cheap (20 us on a 2-core Xeon) for a server's worker to take
    between steps, so its statistics are saved whole whatever it is doing (server/scheduler.py)."""
    c = estimates.costs
    return {
        "acceptance": [{"key": list(key), "steps": acc.steps, "idle": acc.idle,
                        "ratio": _mean(acc.ratio), "positions": [_mean(p) for p in acc.positions],
                        "overhead": _mean(acc.overhead)}
                       for key, acc in estimates.acceptance.items()],
        "costs": {"target": {str(n): _mean(m) for n, m in c.target.items()},
                  "draft": _mean(c.draft), "read": _mean(c.read),
                  "plain_overhead": _mean(c.plain_overhead),
                  "profile": {str(n): s for n, s in c.profile.items()},
                  "profile_weight": c.profile_weight},
    }


def to_json(decoder, learned: dict | None = None) -> dict:
    """The file of ``learned`` (a `snapshot`; None: of ``decoder``'s estimates now), for
    ``decoder``'s pair on this machine."""
    from .hardware.machine import this_machine

    learned = snapshot(decoder.estimates) if learned is None else learned
    return {"format": FORMAT, "version": VERSION, "pair": pair_of(decoder),
            "acceptance": learned["acceptance"],
            "costs": {**place_of(decoder), "hugepages": this_machine().hugepages,
                      **learned["costs"]}}


def _acceptance(entry: dict, costs: bool) -> Acceptance:
    acc = Acceptance()
    acc.steps, acc.idle = (int(_number(entry[k], k)) for k in ("steps", "idle"))
    acc.ratio = _read_mean(entry["ratio"])
    acc.positions = [_read_mean(p) for p in entry["positions"]]
    if costs:
        acc.overhead = _read_mean(entry["overhead"])
    return acc


def _costs(data: dict) -> Costs:
    return Costs(target={int(n): _read_mean(m) for n, m in data["target"].items()},
                 draft=_read_mean(data["draft"]), read=_read_mean(data["read"]),
                 plain_overhead=_read_mean(data["plain_overhead"]),
                 profile={int(n): _number(s, "a profile point") for n, s in data["profile"].items()},
                 profile_weight=_number(data["profile_weight"], "profile_weight"))


# -- files ---------------------------------------------------------------------------------
def save(decoder, path, learned: dict | None = None) -> None:
    """Write ``decoder``'s learned statistics (``learned``, a `snapshot` of them; None: as they
    are now) to ``path`` atomically (a temporary file in the same folder, then renamed over
    it): a reader never sees half a file, and of several writers the last one wins. Its
    permissions follow the umask, as any file the user writes (`atomic.replacing`)."""
    write_text(path, json.dumps(to_json(decoder, learned), indent=1))


def read(path) -> dict:
    """The parsed file, its format and version checked (AnydraftError naming the fix)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise AnydraftError(f"stats file {path} not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AnydraftError(f"stats file {path} is not a readable JSON file ({exc}): "
                            "delete it, or pass a file written by save_stats / serve --stats") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise AnydraftError(f"{path} is not an anydraft stats file: pass a file written by "
                            "save_stats / serve --stats")
    if data.get("version") != VERSION:
        raise AnydraftError(f"stats file {path} is version {data.get('version')!r}, and this "
                            f"anydraft reads version {VERSION}: delete it (serve --stats writes "
                            "a new one at shutdown)")
    return data


def _describe(pair: dict) -> str:
    def one(m):
        return f"{m['model']} ({m['backend']}{' ' + m['dtype'] if m['dtype'] else ''})"

    return one(pair["target"]) + (f" with drafter {one(pair['drafter'])}" if pair["drafter"] else
                                  " without a drafter")


def load(decoder, path) -> str:
    """Replace ``decoder``'s estimates with those saved in ``path``; what was seeded, in words.
    Refuses a file for another pair; seeds the costs only where they were measured here
    (elsewhere the decoder keeps its own: its profile, `Costs.profile`)."""
    data = read(path)
    pair = pair_of(decoder)
    if data.get("pair") != pair:
        try:
            theirs = _describe(data["pair"])
        except (KeyError, TypeError):
            theirs = "another pair"
        raise AnydraftError(f"stats file {path} was written for {theirs}, not for "
                            f"{_describe(pair)}: use a stats file written for this pair, or "
                            "delete it")
    try:
        costs = {k: data["costs"][k] for k in ("machine", "devices")} == place_of(decoder)
        acceptance = {tuple(entry["key"]): _acceptance(entry, costs) for entry in data["acceptance"]}
        learned = Estimates(_costs(data["costs"]) if costs else decoder.estimates.costs, acceptance)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise AnydraftError(f"stats file {path} is malformed ({type(exc).__name__}: {exc}): "
                            "delete it, or pass a file written by save_stats / serve --stats") from None
    decoder.estimates.costs, decoder.estimates.acceptance = learned.costs, learned.acceptance
    seen = observations(snapshot(learned))
    if costs:
        return f"seeded from {path} ({seen} observations)"
    return f"costs in {path} are from another machine or device: acceptance only ({seen} observations)"
