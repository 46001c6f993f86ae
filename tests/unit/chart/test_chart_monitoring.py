"""The chart's alert rules and Grafana dashboard: promtool checks and tests the rules as shipped, the
PrometheusRule and the dashboard ConfigMap carry exactly the files, the committed dashboard is what
hack/dashboard.py builds, and every series a rule or panel reads is one that kubeinfer exports.

The rules run against series in the runtime's and the operator's shapes in ``alerts_test.yaml``
(``promtool test rules``); tests/e2e runs every panel's queries against a real Prometheus.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from hack import dashboard
from hack.devtools.prom import PROMTOOL_BIN
from tests.unit.chart.helm_render import CHART, HELM, by_kind, render

ALERTS = CHART / "files" / "alerts.yaml"
ALERTS_TEST = Path(__file__).parent / "alerts_test.yaml"
ROOT = CHART.parents[1]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL_BIN.exists(), f"{PROMTOOL_BIN} is missing: run `make setup` (Debian's prometheus)"
    return subprocess.run(
        [str(PROMTOOL_BIN), *args], capture_output=True, text=True, timeout=60, cwd=ALERTS_TEST.parent
    )


def test_promtool_checks_the_alert_rules() -> None:
    out = promtool("check", "rules", str(ALERTS))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 7 rules found" in out.stdout


def test_promtool_unit_tests_of_the_alert_rules_pass() -> None:
    out = promtool("test", "rules", ALERTS_TEST.name)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_has_a_test() -> None:
    alerts = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    tested = {
        t["alertname"]
        for case in yaml.safe_load(ALERTS_TEST.read_text())["tests"]
        for t in case["alert_rule_test"]
    }
    assert alerts == tested


def test_the_dashboard_is_what_hack_dashboard_builds() -> None:
    committed = dashboard.OUT.read_text()
    assert committed == dashboard.render(), f"stale: run {dashboard.COMMAND}"


def test_every_panel_reads_one_InferenceService_through_the_variables() -> None:
    board = json.loads(dashboard.OUT.read_text())
    (row,) = board["panels"]
    assert row["type"] == "row" and row["repeat"] == "inferenceservice"
    found = dashboard.queries(board)
    assert len({title for title, _ in found}) == len(dashboard.PANELS)
    for title, expr in found:
        for selector in re.findall(r"kubeinfer_\w+\{([^}]*)\}", expr):
            assert (
                'namespace=~"$namespace"' in selector and 'inferenceservice=~"$inferenceservice"' in selector
            ), (
                title,
                expr,
            )


def _exported_names() -> set[str]:
    """Every metric family the runtime and the operator export (from their collectors), with the
    suffixes Prometheus adds to histograms and counters."""
    from kubeinfer.operator import metrics as operator_metrics
    from kubeinfer.runtime.metrics import RuntimeMetrics

    families = [
        *RuntimeMetrics("m").registry.collect(),
        *operator_metrics.INFERENCE_SERVICES.collect(),
        *operator_metrics.REGISTRY.collect(),
    ]
    names = {f.name for f in families if f.name.startswith("kubeinfer_")}
    return names | {n + s for n in names for s in ("_total", "_bucket", "_sum", "_count")}


def test_every_series_read_is_exported() -> None:
    exported = _exported_names()
    rules = [r["expr"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    panels = [expr for _, expr in dashboard.queries(json.loads(dashboard.OUT.read_text()))]
    for expr in rules + panels:
        for name in re.findall(r"\b(kubeinfer_[a-z0-9_]+)", expr):
            assert name in exported, (name, expr)


@pytest.mark.skipif(not HELM.exists(), reason="helm not built: run `make setup`")
def test_the_chart_ships_the_rules_and_the_dashboard_as_they_are() -> None:
    docs = render("monitoring.enabled=true", "monitoring.alerts.labels.release=prom")
    (rule,) = by_kind(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
    assert rule["metadata"]["labels"]["release"] == "prom"
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["kubeinfer.json"]) == json.loads(dashboard.OUT.read_text())
    (sm,) = by_kind(docs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True

    off = render(
        "monitoring.enabled=true", "monitoring.alerts.enabled=false", "monitoring.dashboard.enabled=false"
    )
    assert not by_kind(off, "PrometheusRule")
    assert not [d for d in by_kind(off, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    assert not by_kind(render("monitoring.enabled=false"), "PrometheusRule")
