"""The scout's run: every candidate measured while the budget lasts, the best three confirmed
beside plain decoding, a ranking with the reason each loser lost.

The budget is spent in order of promise: prompt lookup (no model to load), then each drafter
and backend with the method `auto` would use, then the other methods. Before each measurement
the scout estimates its cost from what the earlier ones took, and skips it (saying so) when it
would not leave time for the confirm runs; the confirm runs stop between prompts likewise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..bench.bound import verify_costs
from ..config import DraftConfig
from ..errors import AnydraftError
from .measure import DRAFTER_METHODS, Candidate, best_k, measured, predict, run_prompts, warm_up

CONFIRM = 3  # candidates confirmed beside plain decoding
PLAIN_SLACK = 1.3  # prompt reads and per-step overheads on top of T(1) per token
MIN_RUNS = 4  # one candidate: measured (up to ~2 plain runs' time), confirmed beside plain (2 more)
LOAD_GUESS = {"llamacpp": 5.0, "ik": 5.0, "torch": 30.0}  # seconds to load a drafter, until one was timed
SLOWEST = 0.25  # a confirm run is priced at most this much slower than plain decoding


@dataclass
class ScoutSettings:
    target: str
    drafters: list[str]
    backends: list[str]  # the drafters' backends to try
    methods: list[str]  # those allowed: sd, slem, tli, slrs, lookup
    target_backend: str = "auto"
    dtype: str = "auto"
    device: str = "cpu"
    num_draft_tokens: int = 5  # the fixed k of the measuring runs, the longest k predicted
    max_new_tokens: int = 32
    budget: float = 300.0
    notes: list[str] = field(default_factory=list)


class Clock:
    """Seconds spent and left of the budget."""

    def __init__(self, budget: float):
        self.budget, self.start = budget, time.perf_counter()

    def spent(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget - self.spent()


def plain_estimate(prompts: list[dict], tokens: int, plain_step: float) -> float:
    """Seconds plain decoding takes for ``tokens`` new tokens on each prompt, roughly."""
    return len(prompts) * tokens * plain_step * PLAIN_SLACK


def check_budget(settings: ScoutSettings, clock: Clock, plain: float, plain_step: float, n: int) -> None:
    """Refuse a budget that cannot measure and confirm even one candidate."""
    need = clock.spent() + MIN_RUNS * plain
    if settings.budget < need:
        raise AnydraftError(
            f"--budget {settings.budget:.0f}s is too small: one candidate needs about {need:.0f} s "
            f"here ({clock.spent():.0f} s to load {settings.target}, then measured and confirmed "
            f"beside plain decoding on {n} prompts x {settings.max_new_tokens} tokens at "
            f"{plain_step * 1e3:.0f} ms a token): give --budget {int(need) + 1}s or more, or "
            "fewer --n / --max-new-tokens")


def candidates(settings: ScoutSettings, target_tok, say) -> list[tuple[Candidate, dict]]:
    """(candidate, facts about its pair) in the order they are measured (see the module doc)."""
    from ..bridge import intersect, same_tokenizer, token_table
    from ..models.auto import gguf_engines
    from ..models.loading import load_tokenizer

    first, rest = [], []
    if "lookup" in settings.methods:
        first.append((Candidate("lookup"), {}))
    for name in settings.drafters:
        tok = load_tokenizer(name)
        same = same_tokenizer(target_tok, tok)
        facts = {"same_tokenizer": same}
        if not same:
            t, d = token_table(target_tok), token_table(tok)
            facts["overlap"] = intersect(t, d).size / len(t)  # share of the target's vocabulary
        methods = [m for m in DRAFTER_METHODS[same] if m in settings.methods]
        if not methods:
            settings.notes.append(f"{name}: none of --methods applies (its tokenizer is "
                                  f"{'the same as' if same else 'not'} the target's: "
                                  f"{', '.join(DRAFTER_METHODS[same])})")
        for backend in settings.backends:
            if backend != "torch" and backend not in gguf_engines(name):
                settings.notes.append(f"{name} on {backend} skipped: it needs a GGUF model and "
                                      f"its engine installed (pip install 'anydraft[{backend}]')")
                continue
            for i, method in enumerate(methods):
                (rest if i else first).append((Candidate(method, name, backend), facts))
    for note in settings.notes:
        say(f"note: {note}")
    return first + rest


class Scout:
    """One scout run over ``prompts`` (see `run`); ``say`` prints progress."""

    def __init__(self, settings: ScoutSettings, prompts: list[dict], say):
        self.settings, self.prompts, self.say = settings, prompts, say
        self.clock = Clock(settings.budget)
        self.drafters: dict[tuple, object] = {}  # (name, backend) -> LoadedModel
        self.loads: dict[str, float] = {}  # backend -> longest drafter load seen
        self.runs: list[float] = []  # seconds of each measuring run

    def run(self) -> dict:
        from ..models.auto import curve_of
        from ..models.backends import load
        from ..models.loading import load_tokenizer

        s, say = self.settings, self.say
        self.tok = load_tokenizer(s.target)
        self.chat = bool(getattr(self.tok, "chat_template", None))
        self.target = load(s.target, s.target_backend, self.tok, s.dtype, s.device, say)
        curve = curve_of(s.target, self.target, self.target.backend, say)
        self.step, self.verify = curve[1], verify_costs(curve, s.num_draft_tokens)
        self.plain = plain_estimate(self.prompts, s.max_new_tokens, self.step)
        check_budget(s, self.clock, self.plain, self.step, len(self.prompts))
        say(f"scout: {s.target} on {self.target.path}, {self.step * 1e3:.0f} ms a plain step; "
            f"{len(self.prompts)} prompts x {s.max_new_tokens} tokens at k = {s.num_draft_tokens}, "
            f"budget {s.budget:.0f} s ({self.clock.spent():.0f} s spent loading)")
        rows = [self.measure(c, facts) for c, facts in candidates(s, self.tok, say)]
        confirmed = self.confirm(rows)
        return {"target_backend": self.target.backend, "target_dtype": self.target.dtype,
                "plain_step": self.step, "curve": curve, "verify_costs": self.verify,
                "rows": rows, "confirmed": confirmed, "seconds": self.clock.spent()}

    # -- measuring -------------------------------------------------------------------------
    def estimate(self, c: Candidate) -> float:
        """Seconds measuring ``c`` should take: the slowest run so far (before any: two plain
        runs), plus loading its drafter if not loaded yet."""
        run = max(self.runs, default=2 * self.plain)
        if c.drafter is None or (c.drafter, c.backend) in self.drafters:
            return run
        return run + self.loads.get(c.backend, LOAD_GUESS[c.backend])

    def reserve(self) -> float:
        """Seconds kept for the confirm runs: plain decoding and CONFIRM candidates on every prompt."""
        return (1 + CONFIRM) * self.plain

    def measure(self, c: Candidate, facts: dict) -> dict:
        row = {"candidate": c, **facts, "status": "measured", "k": None, "predicted": None,
               "by_k": None, "measured": None, "identical": None}
        need, left = self.estimate(c), self.clock.left() - self.reserve()
        if need > left:
            row["status"] = (f"not measured: the budget ran out (needs about {need:.0f} s, "
                             f"{max(left, 0):.0f} s left beside the confirm runs)")
            self.say(f"{c.label}: {row['status']}")
            return row
        try:
            decoder = self.decoder(c, self.settings.num_draft_tokens)
            start = time.perf_counter()
            warm_up(decoder, c.method, self.prompts[0], self.chat)
            outs = run_prompts(decoder, c.method, self.prompts, self.settings.max_new_tokens, self.chat)
        except AnydraftError as exc:  # a pair a method cannot run
            row["status"] = f"failed: {exc}"
            self.say(f"{c.label}: {row['status']}")
            return row
        self.runs.append(time.perf_counter() - start)
        m = measured([o["stats"] for o in outs], self.step)
        k, speedup = best_k(m, self.verify)
        row.update(measurement=m, k=k, predicted=speedup,
                   by_k=[predict(m.a, j, m.c, v, m.o, m.q) for j, v in enumerate(self.verify, 1)]
                   if m.a is not None and m.q else None)
        self.say(f"{c.label}: a {_fmt(m.a)}, c {m.c:.3f}, overhead {m.o:.3f}, drafting share "
                 f"{m.q:.2f} -> predicted {speedup:.2f}x at k = {k} ({self.runs[-1]:.1f} s)")
        return row

    def decoder(self, c: Candidate, k: int):
        """A greedy decoder for ``c`` at a fixed draft length ``k`` (models loaded once)."""
        from ..decoder import Decoder
        from ..models.backends import load

        draft = DraftConfig(num_draft_tokens=max(k, 1), adaptive=False)
        common = dict(tokenizer=self.tok, backend=self.target.backend, device=self.settings.device,
                      draft=draft, dtype=self.target.dtype or "auto")
        if c.drafter is None:
            return Decoder(target=self.target.model, **common)
        key = (c.drafter, c.backend)
        if key not in self.drafters:
            start = time.perf_counter()
            self.drafters[key] = load(c.drafter, c.backend, None, "auto", self.settings.device,
                                      self.say, role="drafter")
            self.loads[c.backend] = max(self.loads.get(c.backend, 0.0), time.perf_counter() - start)
        d = self.drafters[key]
        return Decoder(target=self.target.model, drafter=d.model, drafter_tokenizer=d.tokenizer,
                       drafter_backend=c.backend, **common)

    # -- confirming ------------------------------------------------------------------------
    def confirm(self, rows: list[dict]) -> int:
        """Run the CONFIRM best predicted candidates at their best k beside plain decoding,
        prompt by prompt (every second prompt in reverse order, so drift favours none), while
        the budget lasts; each row gets ``measured`` (its tokens per second over plain
        decoding's, pooled) and ``identical`` (prompts whose output is plain decoding's). The
        number of prompts confirmed."""
        best = sorted((r for r in rows if r["predicted"] is not None), key=lambda r: -r["predicted"])
        best = best[:CONFIRM]
        if not best:
            return 0
        plain = self.decoder(Candidate("ar"), 1)
        runs = [(None, plain)] + [(r, self.decoder(r["candidate"], r["k"])) for r in best]
        per_prompt = self.plain / len(self.prompts) * (
            1 + sum(1 / max(r["predicted"], SLOWEST) for r in best))
        totals = {id(r): [0.0, 0, 0] for r, _ in runs}  # seconds, tokens, identical
        done = 0
        for i, p in enumerate(self.prompts):
            if per_prompt > self.clock.left():
                self.say(f"confirm runs stop after {done} of {len(self.prompts)} prompts: the "
                         "budget ran out")
                break
            start, ar = time.perf_counter(), None
            for r, dec in runs if i % 2 == 0 else runs[::-1]:
                out = run_prompts(dec, "ar" if r is None else r["candidate"].method, [p],
                                  self.settings.max_new_tokens, self.chat)[0]
                t = totals[id(r)]
                t[0] += out["stats"]["seconds"]
                t[1] += out["stats"]["new_tokens"]
                if r is None:
                    ar = out["token_ids"]
                else:
                    r.setdefault("_outputs", []).append(out["token_ids"])
            for r in best:
                totals[id(r)][2] += r["_outputs"].pop() == ar
            per_prompt = time.perf_counter() - start
            done += 1
        plain_rate = totals[id(None)][1] / totals[id(None)][0] if done else 0.0
        for r in best:
            r.pop("_outputs", None)
            seconds, tokens, same = totals[id(r)]
            if done and seconds > 0:
                r["measured"] = tokens / seconds / plain_rate
                r["identical"] = f"{same}/{done}"
                self.say(f"{r['candidate'].label} at k = {r['k']}: {r['measured']:.2f}x plain "
                         f"decoding (predicted {r['predicted']:.2f}x), output identical on "
                         f"{same}/{done} prompts")
        return done


def _fmt(v, spec=".3f") -> str:
    return "–" if v is None else f"{v:{spec}}"
