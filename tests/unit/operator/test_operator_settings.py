"""Operator settings: environment variables, then command-line flags."""

from __future__ import annotations

import pydantic
import pytest
from kubeinfer.operator.settings import Settings


def test_defaults_and_env() -> None:
    s = Settings.from_env({})
    assert s.namespaces == [] and s.peering == "kubeinfer" and s.autoscale_interval_seconds == 15.0
    assert 1 <= s.peering_priority <= 32767
    env = {
        "KUBEINFER_NAMESPACES": "a, b,",
        "KUBEINFER_PEERING": "",
        "KUBEINFER_LOG_FORMAT": "json",
        "KUBEINFER_METRICS_PORT": "9100",
        "KUBEINFER_PROMETHEUS_INSECURE_SKIP_VERIFY": "true",
        "KUBECONFIG": "/tmp/kc",
    }
    s = Settings.from_env(env)
    assert s.namespaces == ["a", "b"]
    assert s.peering == "" and s.log_format == "json" and s.metrics_port == 9100
    assert s.prometheus_insecure_skip_verify is True and s.kubeconfig == "/tmp/kc"


def test_flags_override_env() -> None:
    s = Settings.from_args(["--namespaces", "x", "--resync-seconds", "2"], env={"KUBEINFER_NAMESPACES": "a"})
    assert s.namespaces == ["x"] and s.resync_seconds == 2.0


def test_bad_value_names_the_setting() -> None:
    with pytest.raises(pydantic.ValidationError, match="log_format"):
        Settings.from_env({"KUBEINFER_LOG_FORMAT": "xml"})


def test_helm_release_gives_the_peering_object_helms_ownership_metadata() -> None:
    from kubeinfer.operator.peering import helm_ownership

    assert helm_ownership(Settings.from_env({})) == {}
    meta = helm_ownership(
        Settings.from_env({"KUBEINFER_HELM_RELEASE": "ki", "KUBEINFER_HELM_RELEASE_NAMESPACE": "ops"})
    )
    assert meta["labels"] == {"app.kubernetes.io/managed-by": "Helm"}
    assert meta["annotations"] == {"meta.helm.sh/release-name": "ki", "meta.helm.sh/release-namespace": "ops"}


def test_prometheus_timeout_is_a_setting_with_env_flag_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert Settings.from_env({}).prometheus_timeout_seconds == 5.0
    env = {"KUBEINFER_PROMETHEUS_TIMEOUT_SECONDS": "2"}
    assert Settings.from_env(env).prometheus_timeout_seconds == 2.0
    assert (
        Settings.from_args(["--prometheus-timeout-seconds", "0.5"], env=env).prometheus_timeout_seconds == 0.5
    )
    with pytest.raises(pydantic.ValidationError, match="prometheus_timeout_seconds"):
        Settings.from_env({"KUBEINFER_PROMETHEUS_TIMEOUT_SECONDS": "0"})
    with pytest.raises(SystemExit):
        Settings.from_args(["--help"], env={})
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "--prometheus-timeout-seconds" in out and "KUBEINFER_PROMETHEUS_TIMEOUT_SECONDS; default: 5.0" in out
    )
