"""docs/grafana/rigdeck.json, the Grafana dashboard over rigdeck's Prometheus series: every
PromQL expression in it (panels, annotations, variables) names only metrics and labels that
``tui.model.promexport.FAMILIES`` declares, and parses: Debian's ``promtool check rules`` reads a
rules file holding each as a recording rule. Its shape: templated job, host and user; a cluster
row, a row repeated per job and one per user."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._require import PROMTOOL_MISSING, require
from tui.model.promexport import FAMILIES

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docs" / "grafana" / "rigdeck.json"
BY_NAME = {f.name: f for f in FAMILIES}
SCRAPE_LABELS = ("instance", "job")  # what Prometheus adds to every series it scrapes
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
METRIC = re.compile(r"\brigdeck_[a-z0-9_]+\b")
LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside a collapsed row too."""
    for p in d["panels"]:
        yield p
        yield from p.get("panels") or []


def variable_query(v: dict[str, Any]) -> tuple[str, str | None]:
    """A query variable's PromQL and the label it lists: ``label_values(SELECTOR, LABEL)`` or
    ``query_result(EXPR)``."""
    q = v["query"] if isinstance(v["query"], str) else v["query"]["query"]
    if m := re.fullmatch(r"label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)", q):
        return m.group(1), m.group(2)
    if m := re.fullmatch(r"query_result\((.*)\)", q):
        return m.group(1), None
    raise AssertionError(f"variable {v['name']}: a query rigdeck's dashboard does not use: {q}")


def expressions(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(where, PromQL, legend format) of every expression in the dashboard."""
    out = []
    for p in panels(d):
        for t in p.get("targets") or []:
            out.append((f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"], t.get("legendFormat", "")))
    for a in d["annotations"]["list"]:
        if "expr" in a:
            out.append((f"annotation {a['name']!r}", a["expr"], a.get("textFormat", "")))
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            out.append((f"variable {v['name']}", variable_query(v)[0], ""))
    return out


def promql(expr: str, names: set[str]) -> str:
    """``expr`` as Prometheus gets it from Grafana: its interval variables as a duration, each
    dashboard variable as a value."""
    expr = re.sub(r"\$\{?(__rate_interval|__interval|__range)\}?", "5m", expr)
    expr = re.sub(r"\$\{?([a-zA-Z_][a-zA-Z0-9_]*)\}?", lambda m: "x" if m.group(1) in names else m.group(0), expr)
    assert "$" not in expr, f"a variable the dashboard does not define: {expr}"
    return expr


def variable_names(d: dict[str, Any]) -> set[str]:
    return {v["name"] for v in d["templating"]["list"]}


def metric_problems(exprs: list[tuple[str, str, str]]) -> list[str]:
    """What names a metric ``promexport.FAMILIES`` does not declare, or no rigdeck metric."""
    out = []
    for where, expr, _ in exprs:
        used = set(METRIC.findall(expr)) | {name for name, _ in SELECTOR.findall(expr)}
        if used - set(BY_NAME):
            out.append(f"{where}: {sorted(used - set(BY_NAME))} not in promexport.FAMILIES")
        elif not used:
            out.append(f"{where}: no rigdeck metric in {expr}")
    return out


def label_problems(exprs: list[tuple[str, str, str]]) -> list[str]:
    """What matches, groups by or shows in its legend a label its metrics do not have."""
    out = []
    for where, expr, legend in exprs:
        labels = set(SCRAPE_LABELS).union(*(BY_NAME[m].labels for m in METRIC.findall(expr) if m in BY_NAME))
        for name, body in SELECTOR.findall(expr):
            matched = set(MATCHER.findall(body)) - {*SCRAPE_LABELS, *(BY_NAME[name].labels if name in BY_NAME else ())}
            if matched and name in BY_NAME:  # an unknown metric is metric_problems' to say
                out.append(f"{where}: {name} has no label {sorted(matched)}")
        grouped = [{g.strip() for g in m.split(",") if g.strip()} for m in GROUPING.findall(expr)]
        for g in grouped:
            if g - labels:
                out.append(f"{where}: groups by {sorted(g - labels)}, which {expr} has not")
        if grouped and re.match(r"\s*\w+\s+by\s*\(", expr):  # an aggregation keeps its by labels only
            labels = grouped[0]
        if set(LEGEND.findall(legend)) - labels:
            out.append(f"{where}: the legend {legend!r} shows {sorted(set(LEGEND.findall(legend)) - labels)}, "
                       f"which {expr} has not")
    return out


def test_every_metric_the_dashboard_queries_is_one_rigdeck_exports() -> None:
    exprs = expressions(dashboard())
    assert len(exprs) >= 40
    assert metric_problems(exprs) == []


def test_every_label_the_dashboard_matches_groups_or_shows_is_one_its_metrics_have() -> None:
    d = dashboard()
    assert label_problems(expressions(d)) == []
    for v in d["templating"]["list"]:
        if v["type"] == "query" and (listed := variable_query(v))[1] is not None:
            (metric,) = METRIC.findall(listed[0])
            assert listed[1] in (*BY_NAME[metric].labels, *SCRAPE_LABELS), v


@pytest.mark.parametrize("expr,legend,problem", [
    ('rigdeck_gpu_util{host="a"}', "", "['rigdeck_gpu_util'] not in promexport.FAMILIES"),
    ('node_load1{instance="a"}', "", "['node_load1'] not in promexport.FAMILIES"),
    ("vector(1)", "", "no rigdeck metric"),
    ('rigdeck_job_loss{rank="0"}', "", "rigdeck_job_loss has no label ['rank']"),
    ('sum by (gpu) (rigdeck_job_loss{job_id="x"})', "", "groups by ['gpu']"),
    ('sum by (host) (rigdeck_gpu_power_watts{instance="x"})', "{{gpu}}", "the legend '{{gpu}}' shows ['gpu']"),
    ('sum by (job) (rigdeck_job_loss{job_id="x"})', "{{job}}", None),  # the scrape job's label
])
def test_the_checks_find_a_name_rigdeck_does_not_export(expr: str, legend: str, problem: str | None) -> None:
    found = metric_problems([("p", expr, legend)]) + label_problems([("p", expr, legend)])
    assert (found == []) if problem is None else any(problem in f for f in found), found


def test_promtool_parses_every_expression(tmp_path: Path) -> None:
    """Each expression as a recording rule (a JSON rules file is YAML too): promtool parses it."""
    require(shutil.which("promtool"), PROMTOOL_MISSING)
    d = dashboard()
    names = variable_names(d)
    exprs = [promql(expr, names) for _, expr, _ in expressions(d)]
    rules = {"groups": [{"name": "rigdeck_dashboard",
                         "rules": [{"record": f"rigdeck_dashboard:expr_{n}", "expr": e} for n, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(json.dumps(rules, indent=1))
    done = subprocess.run([str(shutil.which("promtool")), "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and f"SUCCESS: {len(exprs)} rules found" in done.stdout, done.stdout + done.stderr
    # The judge judges: an expression that does not parse is refused, naming it.
    path.write_text(json.dumps({"groups": [{"name": "g", "rules": [
        {"record": "r", "expr": 'sum by (host rigdeck_host_up{instance=~"x"}'}]}]}))
    bad = subprocess.run([str(shutil.which("promtool")), "check", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0 and "parse error" in bad.stdout + bad.stderr, bad.stdout + bad.stderr


def test_the_dashboard_templates_job_host_and_user_with_a_row_per_job_and_per_user() -> None:
    d = dashboard()
    assert d["uid"] == "rigdeck" and d["title"] == "rigdeck" and d["schemaVersion"] >= 36
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("job_id", "host", "user"):
        assert variables[name]["type"] == "query" and variables[name]["multi"] and variables[name]["includeAll"]
        assert variables[name]["allValue"] == ".*"  # used as a regex: =~"$name"
        used = [e for _, e, _ in expressions(d) if f"${name}" in e]
        assert len(used) >= 3, f"${name} is used by {len(used)} expressions"
        assert all(re.search(rf'=~\s*"\${name}"', e) for e in used), used  # a multi value is a regex
    rows = [p for p in d["panels"] if p["type"] == "row"]
    assert [(r["title"], r.get("repeat")) for r in rows] == [
        ("Cluster", None), ("Job $job_id", "job_id"), ("User $user", "user")]
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids))
    for p in panels(d):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["targets"] and p.get("description"), p["title"]


def test_the_observability_page_links_the_dashboard() -> None:
    assert "(grafana/rigdeck.json)" in (ROOT / "docs" / "observability.md").read_text()
