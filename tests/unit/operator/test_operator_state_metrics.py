"""The operator's per-InferenceService state metrics (kubeinfer.operator.metrics): what a body says,
what a scrape shows, what a deletion removes, how decisions are counted."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from kubeinfer.operator import metrics
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "minilm.yaml"


def body(name: str = "minilm", namespace: str = "ml") -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    obj["metadata"].update(name=name, namespace=namespace)
    obj["status"] = {
        "replicas": 3,
        "readyReplicas": 2,
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "ReadyReplicas", "message": "2 of 3"},
            {"type": "AutoscalingActive", "status": "False", "reason": "StaleMetrics", "message": "old"},
        ],
    }
    return obj


def samples(
    collector: metrics.InferenceServiceCollector,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted(labels.items()))


def test_a_scrape_shows_the_conditions_replicas_and_autoscaling_bounds_as_stored() -> None:
    collector = metrics.InferenceServiceCollector()
    collector.observe(body())
    got = samples(collector)
    svc = {"namespace": "ml", "inferenceservice": "minilm"}
    assert got == {
        key(
            "kubeinfer_inferenceservice_condition", **svc, type="Ready", status="True", reason="ReadyReplicas"
        ): 1,
        key(
            "kubeinfer_inferenceservice_condition",
            **svc,
            type="AutoscalingActive",
            status="False",
            reason="StaleMetrics",
        ): 1,
        key("kubeinfer_inferenceservice_replicas", **svc): 3,
        key("kubeinfer_inferenceservice_ready_replicas", **svc): 2,
        key("kubeinfer_inferenceservice_target_p99_seconds", **svc): 0.1,
        key("kubeinfer_inferenceservice_min_replicas", **svc): 1,
        key("kubeinfer_inferenceservice_max_replicas", **svc): 3,
    }


def test_a_later_body_replaces_the_earlier_and_a_deletion_removes_it() -> None:
    collector = metrics.InferenceServiceCollector()
    collector.observe(body())
    collector.observe(body("other"))
    later = body()
    later["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "ModelFetchFailed"}]
    later["status"]["readyReplicas"] = 0
    collector.observe(later)
    got = samples(collector)
    svc = {"namespace": "ml", "inferenceservice": "minilm"}
    assert got[key("kubeinfer_inferenceservice_ready_replicas", **svc)] == 0
    conditions = [
        k
        for k in got
        if k[0] == "kubeinfer_inferenceservice_condition" and ("inferenceservice", "minilm") in k[1]
    ]
    assert conditions == [
        key(
            "kubeinfer_inferenceservice_condition",
            **svc,
            type="Ready",
            status="False",
            reason="ModelFetchFailed",
        )
    ]
    collector.forget("ml", "minilm")
    assert {dict(labels)["inferenceservice"] for _, labels in samples(collector)} == {"other"}


def test_without_autoscaling_or_with_an_invalid_spec_only_the_status_is_shown() -> None:
    collector = metrics.InferenceServiceCollector()
    off = body("off")
    off["spec"]["autoscaling"]["enabled"] = False
    bad = body("bad")
    bad["spec"]["autoscaling"]["targetP99"] = "soon"
    bad["status"] = {"conditions": [{"type": "Ready", "status": "False", "reason": "InvalidSpec"}, "junk"]}
    collector.observe(off)
    collector.observe(bad)
    names = {(n, dict(labels)["inferenceservice"]) for n, labels in samples(collector)}
    assert ("kubeinfer_inferenceservice_target_p99_seconds", "off") not in names
    assert ("kubeinfer_inferenceservice_replicas", "off") in names
    assert (
        names & {(f"kubeinfer_inferenceservice_{n}", "bad") for n in ("replicas", "target_p99_seconds")}
        == set()
    )
    assert ("kubeinfer_inferenceservice_condition", "bad") in names


def test_decisions_are_counted_by_what_they_changed_and_forgotten_with_the_service() -> None:
    def count(change: str) -> float | None:
        return metrics.REGISTRY.get_sample_value(
            "kubeinfer_autoscaler_decisions_total",
            {"namespace": "d", "inferenceservice": "s", "change": change},
        )

    metrics.count_decision("d", "s", replicas_before=2, replicas_after=3, max_queue_delay_changed=True)
    metrics.count_decision("d", "s", replicas_before=3, replicas_after=1, max_queue_delay_changed=False)
    metrics.count_decision("d", "s", replicas_before=1, replicas_after=1, max_queue_delay_changed=True)
    assert (count("scale_up"), count("scale_down"), count("max_queue_delay")) == (1, 1, 2)
    metrics.InferenceServiceCollector().forget("d", "s")
    assert (count("scale_up"), count("scale_down"), count("max_queue_delay")) == (None, None, None)


def test_the_example_body_is_not_modified() -> None:
    original = body()
    observed = copy.deepcopy(original)
    metrics.InferenceServiceCollector().observe(observed)
    assert observed == original
