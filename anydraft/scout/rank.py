"""The ranking: the winner (the fastest confirmed candidate, or plain decoding when none beat
it), then the others, each with the reason it lost.

A loser's reason is the number that, swapped for the winner's, would raise its predicted
speedup most: acceptance (with the share of the target's vocabulary the drafter spells, for a
drafter of another tokenizer), the drafter's cost, or the translation overhead. Against plain
decoding, the first suspect is the target's cost curve: where verifying k drafts costs nearly k
plain steps, no drafter can pay.
"""

from __future__ import annotations

import dataclasses

from .measure import Candidate, Measured, predict

PLAIN = Candidate("ar")
CLOSE = 1.02  # a swap that gains less than this explains nothing


def best_over_k(m: Measured, verify: list[float], **swap) -> float:
    """The best predicted speedup over k with some of ``m``'s numbers swapped."""
    m = dataclasses.replace(m, **swap)
    return max(predict(m.a, k, m.c, v, m.o, m.q) for k, v in enumerate(verify, 1))


def winner(rows: list[dict]) -> dict | None:
    """The confirmed row with the best measured speedup, if it beats plain decoding."""
    confirmed = [r for r in rows if r["measured"] is not None]
    best = max(confirmed, key=lambda r: r["measured"], default=None)
    return best if best is not None and best["measured"] > 1.0 else None


def plain_row(confirmed: bool) -> dict:
    return {"candidate": PLAIN, "status": "measured", "k": 0, "predicted": 1.0,
            "measured": 1.0 if confirmed else None, "identical": None}


def reason(row: dict, win: dict | None, verify: list[float]) -> str:
    """Why ``row`` lost to ``win`` (None: to plain decoding)."""
    if row["status"] != "measured":
        return row["status"]
    if row["candidate"] == PLAIN:
        return f"{win['candidate'].label} is faster"
    m = row.get("measurement")
    if m is None or m.a is None:
        return "drafted nothing on these prompts"
    score = "measured" if row["measured"] is not None else "predicted"
    mine = row[score]
    theirs = 1.0 if win is None else (win[score] if win[score] is not None else win["predicted"])
    head = f"{score} {mine:.2f}x vs {theirs:.2f}x: "
    if win is None:
        k = max(row["k"], 1)
        if best_over_k(m, verify, c=0.0, o=0.0) < 1.0:
            return head + (f"the target's cost curve (verifying {k} draft{'s' * (k > 1)} costs "
                           f"{verify[k - 1]:.2f} plain steps)")
        w = dataclasses.replace(m, a=1.0, c=0.0, o=0.0)
    else:
        w = win["measurement"]
    gains = {
        "acceptance": best_over_k(m, verify, a=w.a) if w.a is not None else 0.0,
        "cost": best_over_k(m, verify, c=w.c),
        "overhead": best_over_k(m, verify, o=w.o),
    }
    why = max(gains, key=gains.get)
    if gains[why] < CLOSE * row["predicted"]:
        return head + "close; lost in the confirm run" if score == "measured" else head + "close"
    # against plain decoding the yardstick is a perfect, free drafter: no number to compare
    def vs(mine: float, theirs: float, spec: str) -> str:
        return f"{mine:{spec}}" + ("" if win is None else f" vs {theirs:{spec}}")

    if why == "acceptance":
        share = row.get("overlap")
        return head + f"acceptance a {vs(m.a, w.a, '.2f')}" + (
            "" if share is None else f" (vocabulary overlap {share:.0%} of the target's)")
    if why == "cost":
        return head + f"drafter cost c {vs(m.c, w.c, '.3f')} per token"
    return head + f"translation overhead {vs(m.o, w.o, '.3f')} steps per draft"


def ranked(rows: list[dict], confirmed: bool, verify: list[float]) -> tuple[list[dict], dict | None]:
    """(rows with plain decoding added, best first, each with ``why``; the winning row or None
    when plain decoding wins)."""
    win = winner(rows)
    rows = rows + [plain_row(confirmed)]

    def order(r):
        if r is win or (win is None and r["candidate"] == PLAIN):
            return (0, 0.0)
        if r["measured"] is not None:
            return (1, -r["measured"])
        if r["predicted"] is not None:
            return (2, -r["predicted"])
        return (3, 0.0)

    rows.sort(key=order)
    for r in rows:
        r["why"] = "winner" if order(r)[0] == 0 else reason(r, win, verify)
    return rows, win
