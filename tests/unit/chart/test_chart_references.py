"""The chart's secretReferences.allowed and serviceAccountReferences.allowed reach the operator's
settings (KUBEINFER_SECRET_REFERENCES_ALLOWED, KUBEINFER_SERVICE_ACCOUNT_REFERENCES_ALLOWED): any by
default, a list of patterns, or none; values.schema.json refuses a pattern helm would split."""

from __future__ import annotations

from typing import Any

from kubeinfer.operator.settings import Settings

from tests.unit.chart.helm_render import CHART, helm, of_component, render


def _settings(values: dict[str, Any]) -> Settings:
    (dep,) = of_component(render(values=values), "Deployment")
    env = {
        e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e
    }
    return Settings.from_env({k: v for k, v in env.items() if k.startswith("KUBEINFER_")})


def test_default_allows_any_secret_and_service_account() -> None:
    settings = _settings({})
    assert settings.secret_references_allowed == ["*"]
    assert settings.service_account_references_allowed == ["*"]


def test_patterns_and_none_reach_the_operator() -> None:
    settings = _settings(
        {
            "secretReferences": {"allowed": ["model-*", "team-a/hf-token"]},
            "serviceAccountReferences": {"allowed": []},
        }
    )
    assert settings.secret_references_allowed == ["model-*", "team-a/hf-token"]
    assert settings.service_account_references_allowed == []


def test_schema_refuses_a_pattern_with_a_comma() -> None:
    out = helm("template", "kubeinfer", str(CHART), "--set", "secretReferences.allowed={a\\,b}", check=False)
    assert out.returncode != 0 and "secretReferences" in out.stderr
