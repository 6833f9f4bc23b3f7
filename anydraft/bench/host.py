"""Host time in `anydraft bench`: the wall time outside the models' calls, and what it is made of.

A speculative step pays for anydraft's own work (policy, drafting bookkeeping, translation,
verification, sampling) beside the models'. On a CPU that is lost in the models' time; on a GPU
whose 7B step takes 5-10 ms it is not. Each run's host time is its wall time minus the time
inside the target's and the drafter's calls (`Stats.host_seconds`); with null models
(models/null.py), whose calls cost microseconds, nearly all of a run is host time.

Per target call: host seconds / target calls. Per drafted token: what a method's host time
per call adds to plain decoding's on the same prompt, divided by the tokens it drafted per call.
"""

from __future__ import annotations

from .bound import median


def host_fields(stats: dict, ar_stats: dict) -> dict:
    """A bench row's host numbers from its run's and plain decoding's `Stats.as_dict`."""
    calls, drafted = stats.get("target_calls") or 0, stats.get("drafted") or 0
    per_call = stats["host_seconds"] / calls if calls else None
    ar_calls = ar_stats.get("target_calls") or 0
    ar_per_call = ar_stats["host_seconds"] / ar_calls if ar_calls else None
    per_drafted = None
    if drafted and per_call is not None and ar_per_call is not None:
        per_drafted = (per_call - ar_per_call) * calls / drafted
    return {"host_seconds": stats["host_seconds"], "host_ms_per_call": _ms(per_call),
            "host_ms_per_drafted": _ms(per_drafted)}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def host_lines(groups: dict) -> list[str]:
    """The summary's host table: ``groups`` is label -> rows (report.group_rows)."""

    lines = ["## Host time (wall minus the models' calls)", "",
             "| method | host ms / target call | host ms / drafted token | host share of wall |",
             "|---|---|---|---|"]
    for key, rows in groups.items():
        wall = sum(r["seconds"] for r in rows)
        share = sum(r.get("host_seconds") or 0.0 for r in rows) / wall if wall else None
        cells = [" ".join(key), _fmt(median(r.get("host_ms_per_call") for r in rows)),
                 _fmt(median(r.get("host_ms_per_drafted") for r in rows)),
                 "–" if share is None else f"{share:.1%}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}"


def synthetic_models(settings) -> list[str]:
    """What each synthetic or null model of a bench is, in words (models/synthetic/)."""
    from ..models import synthetic

    return [synthetic.describe(spec) for spec in [settings.target, *settings.drafters]
            if synthetic.is_spec(spec)]
