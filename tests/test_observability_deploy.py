"""deploy/grafana and deploy/prometheus agree with what a live daemon exports.

Every PromQL expression in the Grafana dashboard and the alert rules is read with a small
tokenizer (brackets balanced, functions known); each metric it names must be a series of a
live /metrics (or ``up``, which Prometheus records itself), each label it matches or groups
by must be a label of those series, and each ``$labels.X`` an alert's text uses must survive
its expression's aggregation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agentpark.config import load_settings
from tests.harness import TINY, Daemon, start_daemon

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "deploy" / "grafana" / "agentpark-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"

# Series Prometheus makes itself for every target (not exported by the daemon).
SCRAPE_SERIES = {"up": {"job", "instance"}}
FUNCTIONS = {
    # aggregations
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group",
    # functions used by dashboards and rules
    "rate", "irate", "increase", "delta", "idelta", "deriv", "histogram_quantile", "abs",
    "absent", "absent_over_time", "clamp_min", "clamp_max", "avg_over_time", "max_over_time",
    "min_over_time", "sum_over_time", "time", "timestamp", "vector", "scalar", "round",
    "label_replace", "predict_linear", "changes", "resets", "sort", "sort_desc",
}  # fmt: skip
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
GRAFANA_VARS = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "$host": ".*",
}
TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')
      | (?P<number>\d+(?:\.\d+)?(?:ms|[smhdwy])?(?:\d+(?:ms|[smhdwy]))*)
      | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
      | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=,(){}\[\]:])
    )""",
    re.VERBOSE,
)


@dataclass
class Parsed:
    metrics: dict[str, set[str]] = field(default_factory=dict)  # name -> matched labels
    grouping: list[set[str]] = field(default_factory=list)  # each by (...) / on (...) list
    functions: set[str] = field(default_factory=set)


def parse_promql(expr: str) -> Parsed:
    """Metric names, matcher labels and grouping labels of a PromQL expression."""
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr.replace('"', ""), f"unknown Grafana variable in {expr!r}"
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr.rstrip()):
        match = TOKEN.match(expr, pos)
        assert match and match.end() > pos, f"cannot read {expr[pos:]!r}"
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    stack: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for kind, text in tokens:
        if kind == "op" and text in "([{":
            stack.append(text)
        elif kind == "op" and text in ")]}":
            assert stack and stack.pop() == pairs[text], f"unbalanced {text!r} in {expr!r}"
    assert not stack, f"unclosed {stack} in {expr!r}"

    parsed = Parsed()
    i = 0

    def nxt(k: int) -> str:
        return tokens[k][1] if k < len(tokens) else ""

    while i < len(tokens):
        kind, text = tokens[i]
        if kind == "op" and text == "[":
            while tokens[i][1] != "]":
                i += 1
        elif kind == "op" and text == "{":
            raise AssertionError(f"a selector without a metric name in {expr!r}")
        elif kind == "ident" and text in GROUPING:
            labels: set[str] = set()
            if nxt(i + 1) == "(":
                i += 2
                while tokens[i][1] != ")":
                    if tokens[i][0] == "ident":
                        labels.add(tokens[i][1])
                    i += 1
            parsed.grouping.append(labels)
        elif kind == "ident" and text in KEYWORDS:
            pass
        elif kind == "ident" and (nxt(i + 1) == "(" or nxt(i + 1) in ("by", "without")):
            assert text in FUNCTIONS, f"unknown function {text!r} in {expr!r}"
            parsed.functions.add(text)
        elif kind == "ident":
            matched = parsed.metrics.setdefault(text, set())
            if nxt(i + 1) == "{":
                i += 2
                while tokens[i][1] != "}":
                    if tokens[i][0] == "ident" and nxt(i + 1) in ("=", "!=", "=~", "!~"):
                        matched.add(tokens[i][1])
                    i += 1
        i += 1
    return parsed


def test_the_promql_reader_finds_names_labels_and_mistakes() -> None:
    parsed = parse_promql(
        'histogram_quantile(0.99, sum by (le, source) (rate(agentpark_x_bucket{host=~"$host",'
        ' a!="b"}[$__rate_interval]))) / on(host) group_left up{job="agentpark"} offset 5m'
    )
    assert parsed.metrics == {"agentpark_x_bucket": {"host", "a"}, "up": {"job"}}
    assert parsed.grouping == [{"le", "source"}, {"host"}, set()]
    assert parsed.functions == {"histogram_quantile", "sum", "rate"}
    for bad in ("sum(rate(x[5m])", "frobnicate(x)", 'x{a="b"', "{a='b'}"):
        with pytest.raises(AssertionError):
            parse_promql(bad)


# ---- the files ------------------------------------------------------------------------


def _panels() -> Iterator[dict[str, Any]]:
    for panel in json.loads(GRAFANA.read_text())["panels"]:
        yield panel
        yield from panel.get("panels", [])


def grafana_exprs() -> list[tuple[str, str]]:
    exprs = [
        (f"{panel['title']}/{target['refId']}", target["expr"])
        for panel in _panels()
        for target in panel.get("targets", [])
    ]
    dashboard = json.loads(GRAFANA.read_text())
    for var in dashboard["templating"]["list"]:
        query = var["query"]["query"]
        match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
        assert match, f"variable {var['name']}: {query!r}"
        exprs.append((f"${var['name']}", f"{match[1]}{{{match[2]}!=''}}"))
    return exprs


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


# ---- a live daemon ----------------------------------------------------------------------


@dataclass
class Exported:
    labels: dict[str, set[str]]  # sample name -> label names


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exported]:
    tmp = tmp_path_factory.mktemp("observability")
    settings = load_settings(
        None,
        state_dir=tmp / "state",
        model=TINY["model"],
        pool=TINY["pool"],
        tiers={"dram": {"capacity": 32 * 4096}, "shm": {"capacity": 0}},
        dashboard={"host_label": "deploy-check"},
    )
    daemon: Daemon = start_daemon(settings)
    try:
        c = daemon.client
        c.post("/v1/sessions", json={"session_id": "d"})
        c.post("/v1/sessions/d/generate", json={"prompt": "deploy", "max_new_tokens": 20})
        c.post("/v1/sessions/d/pause")
        c.post("/v1/sessions/d/resume")
        text = c.get("/metrics").text
    finally:
        daemon.stop()
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    yield Exported(labels)


def _check(expr: str, exported: Exported) -> Parsed:
    parsed = parse_promql(expr)
    known = {**exported.labels, **SCRAPE_SERIES}
    assert parsed.metrics, f"no metric in {expr!r}"
    available: set[str] = set()
    for name, matched in parsed.metrics.items():
        assert name in known, f"{name} is not exported by the daemon (in {expr!r})"
        assert matched <= known[name], f"{name} has no label {matched - known[name]}"
        available |= known[name]
    for labels in parsed.grouping:
        assert labels <= available, f"grouping by {labels - available}: no such label"
    return parsed


@pytest.mark.parametrize(("where", "expr"), grafana_exprs())
def test_grafana_expression_names_exported_metrics(
    where: str, expr: str, exported: Exported
) -> None:
    parsed = _check(expr, exported)
    assert any(name.startswith("agentpark_") for name in parsed.metrics), where
    if any(name.endswith("_total") for name in parsed.metrics):
        # A counter is only ever read through a rate.
        assert parsed.functions & {"rate", "increase", "irate"}, where


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: rule["alert"])
def test_alert_expression_names_exported_metrics(rule: dict[str, Any], exported: Exported) -> None:
    parsed = _check(rule["expr"], exported)
    # Labels the alert's text uses survive the expression's aggregation.
    used = set(re.findall(r"\$labels\.(\w+)", json.dumps(rule.get("annotations", {}))))
    if parsed.grouping:
        kept = set.intersection(*parsed.grouping)
    else:
        kept = set().union(*({**exported.labels, **SCRAPE_SERIES}[m] for m in parsed.metrics))
    assert used <= kept, f"{rule['alert']} names {used - kept}, which its expression drops"


# ---- what the files must cover ------------------------------------------------------------


def test_alert_rules_cover_the_failures_that_page() -> None:
    rules = {rule["alert"]: rule for rule in alert_rules()}
    needed = {
        "AgentparkDaemonDown": "up",
        "AgentparkTierNearlyFull": "agentpark_tier_used_bytes",
        "AgentparkRestoreFailures": "agentpark_restore_failures_total",
        "AgentparkRecomputeFallbacksRising": "agentpark_recompute_fallbacks_total",
    }
    for name, metric in needed.items():
        assert name in rules, f"no {name} rule"
        assert metric in parse_promql(rules[name]["expr"]).metrics
    for rule in rules.values():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in {"page", "warning"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["for"]
    assert rules["AgentparkDaemonDown"]["labels"]["severity"] == "page"


def test_grafana_dashboard_is_importable_and_covers_the_questions() -> None:
    dashboard = json.loads(GRAFANA.read_text())
    panels = list(_panels())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 30
    (source,) = dashboard["__inputs"]
    assert source["pluginId"] == "prometheus"
    ds = "${" + source["name"] + "}"
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == ds, panel["title"]
        assert panel["targets"], panel["title"]
        assert all(t["datasource"]["uid"] == ds for t in panel["targets"])
        # Every panel follows the host selector.
        assert all('host=~"$host"' in t["expr"] for t in panel["targets"]), panel["title"]
    # No two panels overlap on the 24-column grid.
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine

    def exprs_about(metric: str) -> list[str]:
        return [
            t["expr"]
            for p in panels
            for t in p.get("targets", [])
            if metric in parse_promql(t["expr"]).metrics
        ]

    assert any("by (host)" in e for e in exprs_about("agentpark_hbm_reclaimed_bytes"))
    assert any("by (state)" in e for e in exprs_about("agentpark_sessions"))
    assert exprs_about("agentpark_pause_duration_seconds_bucket")
    assert exprs_about("agentpark_resume_duration_seconds_bucket")
    assert exprs_about("agentpark_recompute_fallbacks_total")
    assert exprs_about("agentpark_transfer_seconds_total")
