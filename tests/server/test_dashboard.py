"""docs/grafana-dashboard.json: every query names series (and labels) the server exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.server.test_vllm_metrics import exported

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana-dashboard.json"
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")
LABEL_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|ignoring|on|without)\s*\(([^)]*)\)")
# every series is written with braces (each panel filters by $model), so `SELECTOR` finds them
# all; a name of ours without them would slip past the check, so it is refused on its own
BARE_NAME = re.compile(r"\b(?:anydraft_|vllm:)[a-zA-Z0-9_:]*\b(?!\{)")


def queries(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["query"]["query"] if isinstance(var["query"], dict) else var["query"])
    return exprs


def series_of(expr: str) -> list[tuple[str, set[str]]]:
    """(series name, label names matched) of every selector in ``expr``; label_values(NAME, L)
    selects NAME and needs its label L."""
    found = [(name, set(LABEL_MATCHER.findall(body))) for name, body in SELECTOR.findall(expr)]
    found += [(name, {label}) for name, label in
              re.findall(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*(\w+)\s*\)", expr)]
    return found


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def test_the_dashboard_graphs_what_the_issue_asks(dashboard):
    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("per draft position", "tokens per target call", "tokens per second", "queue",
                  "latency"):
        assert topic in titles, (topic, titles)
    assert any("histogram_quantile(0.99" in q for q in queries(dashboard))


def test_every_query_names_a_series_the_server_exports(dashboard):
    series = exported()
    exprs = queries(dashboard)
    assert len(exprs) >= 10
    for expr in exprs:
        used = series_of(expr)
        assert used, f"no series found in {expr!r}"
        stripped = SELECTOR.sub("", re.sub(r"label_values\([^)]*\)", "", expr))
        assert not BARE_NAME.findall(stripped), f"{expr!r}: write every series as name{{...}}"
        labels_here = set()
        for name, labels in used:
            assert name in series, f"{expr!r} reads {name}, which the server does not export"
            missing = labels - series[name]
            assert not missing, f"{expr!r}: {name} has no label {missing}"
            labels_here |= series[name]
        for group in GROUPING.findall(expr):
            for label in filter(None, (g.strip() for g in group.split(","))):
                assert label in labels_here, f"{expr!r} groups by {label}, which its series lack"


def test_the_check_catches_a_wrong_name():
    """The test above can fail: a misspelt series, or a label the series lacks, is caught."""
    series = exported()
    (name, _), = series_of('rate(anydraft_drafted_token_total{model=~"$model"}[5m])')
    assert name not in series
    (name, labels), = series_of('anydraft_queue_waiting{endpoint="/v1/completions"}')
    assert name in series and labels - series[name] == {"endpoint"}
