"""The chart's networkPolicy.defaultDeny reaches the operator's setting network_policy_default_deny
(KUBEINFER_NETWORK_POLICY_DEFAULT_DENY): off by default, so nothing changes for current users;
values.schema.json refuses anything but a boolean."""

from __future__ import annotations

from typing import Any

import pytest
from kubeinfer.operator.settings import Settings

from tests.unit.chart.helm_render import CHART, HELM, helm, of_component, render

pytestmark = pytest.mark.skipif(not HELM.exists(), reason="helm not built: run `make setup`")


def _env(values: dict[str, Any]) -> dict[str, str]:
    (dep,) = of_component(render(values=values), "Deployment")
    containers = dep["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in containers[0]["env"] if "value" in e}


@pytest.mark.parametrize(
    "values, rendered, setting",
    [({}, "false", False), ({"networkPolicy": {"defaultDeny": True}}, "true", True)],
)
def test_default_deny_reaches_the_operator(values: dict[str, Any], rendered: str, setting: bool) -> None:
    env = _env(values)
    assert env["KUBEINFER_NETWORK_POLICY_DEFAULT_DENY"] == rendered
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("KUBEINFER_")})
    assert settings.network_policy_default_deny is setting


@pytest.mark.parametrize("arg", ["networkPolicy.defaultDeny=sometimes", "networkPolicy.enabled=true"])
def test_schema_refuses_another_value(arg: str) -> None:
    out = helm("template", "kubeinfer", str(CHART), "--set", arg, check=False)
    assert out.returncode != 0 and "networkPolicy" in out.stderr
