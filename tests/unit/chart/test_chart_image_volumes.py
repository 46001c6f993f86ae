"""The chart's imageVolumes reaches the operator's setting image_volumes (KUBEINFER_IMAGE_VOLUMES):
auto by default, true or false; values.schema.json refuses anything else."""

from __future__ import annotations

from typing import Any

import pytest
from kubeinfer.operator.settings import Settings

from tests.unit.chart.helm_render import CHART, helm, of_component, render


def _env(values: dict[str, Any]) -> dict[str, str]:
    (dep,) = of_component(render(values=values), "Deployment")
    containers = dep["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in containers[0]["env"] if "value" in e}


@pytest.mark.parametrize(
    "value, rendered, setting", [(None, "auto", None), (True, "true", True), (False, "false", False)]
)
def test_image_volumes_reach_the_operator(value: bool | None, rendered: str, setting: bool | None) -> None:
    env = _env({} if value is None else {"imageVolumes": value})
    assert env["KUBEINFER_IMAGE_VOLUMES"] == rendered
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("KUBEINFER_")})
    assert settings.image_volumes is setting


def test_schema_refuses_another_value() -> None:
    out = helm("template", "kubeinfer", str(CHART), "--set", "imageVolumes=sometimes", check=False)
    assert out.returncode != 0 and "imageVolumes" in out.stderr
