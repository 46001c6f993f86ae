#!/usr/bin/env python3
"""Build the chart's Grafana dashboard, ``charts/kubeinfer/files/dashboards/kubeinfer.json``.

The panels and their PromQL are defined once here (:data:`PANELS`) and built into Grafana's own
dashboard model with Grafana's SDK (grafana-foundation-sdk), not written as JSON by hand. The chart
ships the JSON in a ConfigMap labelled for the Grafana sidecar (``grafana_dashboard: "1"``, the
kube-prometheus-stack default; ``monitoring.dashboards``), as KServe ships its own.

The dashboard has one row per InferenceService (a row repeated over the ``inferenceservice`` variable;
``namespace`` selects first): request rate by status code, P50/P99 against the autoscaler's target,
queue, batch size, executor or GPU utilization, replicas, the max queue delay with the autoscaler's
decisions, refused requests and errors, the response cache, and start-up (fetch, load, warmup) times.
Its series come from the runtime pods (the chart's PodMonitor) and from the operator (the chart's
ServiceMonitor: ``kubeinfer_inferenceservice_*``, ``kubeinfer_autoscaler_decisions_total``).

``tests/unit/chart/test_chart_dashboard.py`` fails when the committed JSON differs from what this
builds; ``tests/e2e`` runs every panel's queries against the node's Prometheus after real traffic and
fails on a panel without data. Regenerate with::

    .venv/bin/python hack/dashboard.py --write
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "charts" / "kubeinfer" / "files" / "dashboards" / "kubeinfer.json"
COMMAND = ".venv/bin/python hack/dashboard.py --write"
UID = "kubeinfer-inferenceservices"

#: The selector of one InferenceService's series: every runtime series carries ``namespace`` and
#: ``inferenceservice`` (the PodMonitor's relabelings), every operator state series too.
SEL = 'namespace=~"$namespace", inferenceservice=~"$inferenceservice"'
#: Grafana's rate window for the panel's resolution (at least four scrape intervals).
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel and its legend (Grafana's ``{{label}}`` templating)."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """One time-series panel: title, Grafana unit id, what it shows, its queries."""

    title: str
    unit: str
    description: str
    queries: tuple[Query, ...]


def _quantile(q: float) -> str:
    return (
        f"histogram_quantile({q}, sum by (le) "
        f"(rate(kubeinfer_request_duration_seconds_bucket{{{SEL}}}[{RATE}])))"
    )


#: The panels of each InferenceService's row, in order.
PANELS: tuple[Panel, ...] = (
    Panel(
        "Requests by status code",
        "reqps",
        "Infer responses per second by HTTP status code (gRPC counted by its HTTP equivalent).",
        (Query(f"sum by (code) (rate(kubeinfer_requests_total{{{SEL}}}[{RATE}]))", "{{code}}"),),
    ),
    Panel(
        "Latency against the target",
        "s",
        "P50 and P99 of receipt to response, all pods, and the autoscaler's targetP99.",
        (
            Query(_quantile(0.5), "P50"),
            Query(_quantile(0.99), "P99"),
            Query(f"max(kubeinfer_inferenceservice_target_p99_seconds{{{SEL}}})", "target P99"),
        ),
    ),
    Panel(
        "Queue",
        "short",
        "Requests waiting in the queues and in flight, summed over pods, and the queue's capacity "
        "(beyond it an arrival gets 429).",
        (
            Query(f"sum(kubeinfer_queue_size{{{SEL}}})", "queued"),
            Query(f"sum(kubeinfer_inflight_requests{{{SEL}}})", "in flight"),
            Query(f"sum(kubeinfer_max_queue_size{{{SEL}}})", "capacity"),
        ),
    ),
    Panel(
        "Batch size",
        "short",
        "Mean rows per executed batch, and the max batch size in force.",
        (
            Query(
                f"sum(rate(kubeinfer_batch_size_sum{{{SEL}}}[{RATE}])) "
                f"/ sum(rate(kubeinfer_batch_size_count{{{SEL}}}[{RATE}]))",
                "mean rows per batch",
            ),
            Query(f"max(kubeinfer_max_batch_size{{{SEL}}})", "max batch size"),
        ),
    ),
    Panel(
        "Executor or GPU utilization",
        "percentunit",
        "Per pod: on a GPU NVML's utilization, on CPU the fraction of time the executors ran batches.",
        (Query(f"max by (pod) (kubeinfer_device_utilization_ratio{{{SEL}}})", "{{pod}}"),),
    ),
    Panel(
        "Replicas",
        "short",
        "Pods (every version) and ready pods, and the autoscaler's bounds.",
        (
            Query(f"max(kubeinfer_inferenceservice_replicas{{{SEL}}})", "pods"),
            Query(f"max(kubeinfer_inferenceservice_ready_replicas{{{SEL}}})", "ready"),
            Query(f"max(kubeinfer_inferenceservice_min_replicas{{{SEL}}})", "min"),
            Query(f"max(kubeinfer_inferenceservice_max_replicas{{{SEL}}})", "max"),
        ),
    ),
    Panel(
        "Max queue delay and the autoscaler's decisions",
        "s",
        "The max queue delay in force per pod (seconds), and the autoscaler's decisions in the window "
        "by what they changed (count, right axis).",
        (
            Query(f"max by (pod) (kubeinfer_max_queue_delay_seconds{{{SEL}}})", "max queue delay {{pod}}"),
            Query(
                f"sum by (change) (increase(kubeinfer_autoscaler_decisions_total{{{SEL}}}[{RATE}]))",
                "decisions: {{change}}",
            ),
        ),
    ),
    Panel(
        "Refused and failed",
        "percentunit",
        "Share of responses that were 429 (the queue was full) and 5xx (a server error).",
        (
            Query(
                f'(sum(rate(kubeinfer_requests_total{{{SEL}, code="429"}}[{RATE}])) or vector(0)) '
                f"/ sum(rate(kubeinfer_requests_total{{{SEL}}}[{RATE}]))",
                "429",
            ),
            Query(
                f'(sum(rate(kubeinfer_requests_total{{{SEL}, code=~"5.."}}[{RATE}])) or vector(0)) '
                f"/ sum(rate(kubeinfer_requests_total{{{SEL}}}[{RATE}]))",
                "5xx",
            ),
        ),
    ),
    Panel(
        "Response cache",
        "ops",
        "Cache hits and misses per second, summed over pods (both 0 when the cache is off).",
        (
            Query(f"sum(rate(kubeinfer_cache_hits_total{{{SEL}}}[{RATE}]))", "hits"),
            Query(f"sum(rate(kubeinfer_cache_misses_total{{{SEL}}}[{RATE}]))", "misses"),
        ),
    ),
    Panel(
        "Start-up: fetch, load, warmup",
        "s",
        "Per pod: the model's download (absent for a model not fetched), load and warmup, seconds.",
        (
            Query(f"max by (pod) (kubeinfer_model_fetch_seconds{{{SEL}}})", "fetch {{pod}}"),
            Query(f"max by (pod) (kubeinfer_model_load_seconds{{{SEL}}})", "load {{pod}}"),
            Query(f"max by (pod) (kubeinfer_warmup_seconds{{{SEL}}})", "warmup {{pod}}"),
        ),
    ),
)

#: The Prometheus data source, chosen by the dashboard's ``datasource`` variable.
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


def _variable(name: str, label: str, query: str) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
    )


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a dict, as the SDK encodes it)."""
    board = (
        dashboard.Dashboard("kubeinfer: InferenceServices")
        .uid(UID)
        .tags(["kubeinfer", "inference"])
        .description(
            "One row per InferenceService: traffic, latency against the target, queue, batching, "
            "utilization, replicas and the autoscaler, errors, cache, start-up."
        )
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            _variable("namespace", "Namespace", "label_values(kubeinfer_requests_total, namespace)")
        )
        .with_variable(
            _variable(
                "inferenceservice",
                "InferenceService",
                'label_values(kubeinfer_requests_total{namespace=~"$namespace"}, inferenceservice)',
            )
        )
    )
    row = dashboard.Row("$inferenceservice").repeat("inferenceservice")
    for spec in PANELS:
        panel = (
            timeseries.Panel()
            .title(spec.title)
            .description(spec.description)
            .unit(spec.unit)
            .datasource(DATASOURCE)
            .height(8)
            .span(8)
        )
        for j, q in enumerate(spec.queries):
            panel = panel.with_target(
                prometheus.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(chr(ord("A") + j))
            )
        row = row.with_panel(panel)
    board = board.with_row(row)
    encoded: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return encoded


def render() -> str:
    """The JSON text of :func:`build`, as committed (sorted keys, two-space indent, final newline)."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def queries(board: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every ``(panel title, expr)`` of a dashboard JSON model (panels inside rows included)."""
    found: list[tuple[str, str]] = []

    def walk(panels: Any) -> None:
        for p in panels or []:
            for t in p.get("targets") or []:
                if t.get("expr"):
                    found.append((p.get("title", ""), t["expr"]))
            walk(p.get("panels"))

    walk(board.get("panels"))
    return found


def main(argv: list[str] | None = None) -> int:
    """``--write``: write :data:`OUT`; ``--check``: exit 1 when it differs; neither: print the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    group.add_argument("--check", action="store_true", help="exit 1 when the committed JSON is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(text)
        print(f"wrote {OUT.relative_to(ROOT)} ({len(PANELS)} panels per InferenceService)")
        return 0
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
