"""What exact scoring (models/exact.py, issue 41) costs on a path of this machine, and the choice
``exact="auto"`` makes from it.

The cost is the largest slowdown of any call exact scoring makes against the same call without
it: each size a step scores (1 to 9 tokens) after a short context, and a plain one-token step
after a long one (where a llama.cpp exact step runs on one thread). A decode made of such calls
costs at most that much more, whatever the policy drafts: a bound, not an average, so a path
where only long drafts cost stays off. Measured by ``anydraft doctor`` for a target, once per
machine, and cached beside the cost curves (hardware/profile.py, which times the calls); never
measured behind a user's back: where it was not measured, ``auto`` is off and says how to measure it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..hardware import profile
from .auto import model_key

# issue 41's rule: exact scoring is on by default where it costs at most this share here
AUTO_COST = 0.03
SIZES = (1, 2, 3, 4, 5, 9)  # a plain step up to a draft of 8 and its bonus token
# a context past the 256 cells after which llama.cpp's exact one-token steps run on one thread
# (models/llamacpp.py SPLIT_KEYS), as in a long chat
LONG_CONTEXT = 512
# each call is timed this many times, exact and plain taking turns (more than the cost
# curves' 3: a ratio of two noisy medians decides here, and the largest of seven)
REPEATS = 5


@dataclass(frozen=True)
class Choice:
    """What ``exact="auto"`` chose for a target and why (printed by doctor, /health, the bench)."""

    on: bool
    why: str
    cost: float | None = None  # the measured cost (0.04: calls up to 4% slower); None: not measured

    def describe(self) -> str:
        return f"exact auto: {'on' if self.on else 'off'} ({self.why})"


def measure(loaded) -> dict:
    """``{"cost": largest slowdown, "ratios": {call: exact seconds / plain seconds}}`` of
    ``loaded`` (a model that can score exactly), calls named "M" (M tokens after
    profile.CONTEXT) and "1@LONG_CONTEXT". The same weights serve both sides."""
    sides = {"plain": loaded, "exact": replace(loaded, exact=True)}
    short = profile.measure(sides, SIZES, REPEATS)
    long = profile.measure(sides, (1,), REPEATS, context_length=LONG_CONTEXT)
    ratios = {str(m): short["exact"][m] / short["plain"][m] for m in SIZES}
    ratios[f"1@{LONG_CONTEXT}"] = long["exact"][1] / long["plain"][1]
    return {"cost": max(0.0, max(ratios.values()) - 1),
            "ratios": {call: round(r, 3) for call, r in ratios.items()}}


def cached(spec: str, backend: str, dtype: str, device: str) -> dict | None:
    """`measure`'s result for ``spec`` on a path (llama.cpp's dtype: "gguf"), where this
    machine measured it before (`measure_and_save`), else None."""
    return profile.entry(model_key(spec, backend, dtype, device), "exact")


def _key(spec: str, loaded) -> str:
    return model_key(spec, loaded.backend, loaded.dtype or "gguf", loaded.device.type)


def measure_and_save(spec: str, loaded, progress=None) -> dict | None:
    """`measure` ``loaded`` (loaded from ``spec``), cached where the machine is quiet; None
    where its path cannot score exactly."""
    if loaded.exact_problem():
        return None
    if progress:
        progress(f"measuring what exact scoring costs for {spec} ({loaded.path}; once per machine)")
    found = measure(loaded)
    if not profile.busy():
        profile.store(_key(spec, loaded), found, "exact")
    return found


def choose(spec: str | None, loaded, rows: int = 1) -> Choice:
    """``exact="auto"`` for a target ``loaded`` from ``spec`` (None: a model object) serving up
    to ``rows`` rows a call: on where this machine measured its cost at most `AUTO_COST`."""
    if spec is None:
        return Choice(False, "a model object: its cost is not measured (`anydraft doctor` measures "
                             "a catalog name or file)")
    problem = loaded.exact_problem()
    if problem:
        return Choice(False, f"not available: the target {problem}")
    if rows > 1 and loaded.backend == "llamacpp":
        return Choice(False, "an exact llama.cpp batch runs its rows one after another")
    found = profile.entry(_key(spec, loaded), "exact")
    if found is None:
        return Choice(False, f"its cost on {loaded.path} is not measured here: "
                             f"`anydraft doctor --target {spec}` measures it")
    cost = found["cost"]
    verdict = "at most" if cost <= AUTO_COST else "over"
    return Choice(cost <= AUTO_COST, f"calls up to {cost:.1%} slower on {loaded.path} here, "
                                     f"{verdict} {AUTO_COST:.0%}", cost)
