"""Whether the cluster serves image volumes, which oci:// models are mounted as
(operator/reconcile/capabilities.py, the setting image_volumes): below Kubernetes 1.35 (auto), or with
the setting false, an oci:// model is Ready=False ImageVolumeUnsupported naming the API server's version
and what to do, and nothing is applied; the version is read once at start (GET /version), a failure
leaves it unknown and refuses nothing."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Mapping
from typing import Any

import pydantic
import pytest
from kubeinfer.operator import api, k8s
from kubeinfer.operator.conditions import IMAGE_VOLUME_UNSUPPORTED
from kubeinfer.operator.controllers import Controllers, read_server_version
from kubeinfer.operator.reconcile.capabilities import ClusterCapabilities, parse_version
from kubeinfer.operator.reconcile.reconciler import Reconciler
from kubeinfer.operator.settings import Settings

from tests.unit.operator.test_operator_api_errors import FakeKube

OCI = {"uri": "oci://registry.example.com/models/simple:v1", "format": "onnx"}


def _isvc(model: Mapping[str, Any]) -> api.InferenceService:
    spec = {"model": dict(model), "resources": {"gpus": 0}, "runtime": {"device": "cpu"}}
    return api.InferenceService.from_body({"metadata": {"name": "m", "namespace": "ns"}, "spec": spec})


@pytest.mark.parametrize(
    "git_version, parsed",
    [
        ("v1.30.0", (1, 30)),
        ("v1.34.2", (1, 34)),
        ("v1.34.2-eks-abc", (1, 34)),
        ("v1.30.5-gke.1014001", (1, 30)),
        ("1.35.0", (1, 35)),
        ("v1.37.2", (1, 37)),
        ("v1.100.0", (1, 100)),
        ("garbage", None),
        ("v1.x", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_version(git_version: str | None, parsed: tuple[int, int] | None) -> None:
    assert parse_version(git_version) == parsed


@pytest.mark.parametrize(
    "version, refused",
    [
        ("v1.30.0", True),
        ("v1.34.2", True),
        ("v1.34.2-eks-abc", True),
        ("v1.35.0", False),
        ("1.35.0", False),
        ("v1.37.2", False),
        ("garbage", False),  # unreadable: the API server has the last word
        (None, False),  # unknown (GET /version failed)
    ],
)
def test_auto_refuses_an_oci_model_below_1_35(version: str | None, refused: bool) -> None:
    refusal = ClusterCapabilities(version, None).refusal(_isvc(OCI))
    assert (refusal is not None) is refused
    if refusal is not None:
        assert (refusal.status, refusal.reason) == ("False", IMAGE_VOLUME_UNSUPPORTED)
        assert f"this cluster's API server is {version} " in refusal.message


def test_the_message_names_the_version_and_what_to_do() -> None:
    refusal = ClusterCapabilities("v1.34.2", None).refusal(_isvc(OCI))
    assert refusal is not None
    assert refusal.message == (
        "spec.model.uri: oci:// models are mounted as image volumes, on by default from Kubernetes 1.35; "
        "this cluster's API server is v1.34.2 (enable the ImageVolume feature gate on the API server and "
        "the kubelets and set the chart value imageVolumes: true, or serve the model from s3://, https://, "
        "hf:// or pvc://); nothing was applied"
    )


@pytest.mark.parametrize("version", ["v1.30.0", "v1.34.2", "v1.37.2", "garbage", None])
def test_the_setting_wins_over_the_version(version: str | None) -> None:
    assert ClusterCapabilities(version, True).refusal(_isvc(OCI)) is None
    refusal = ClusterCapabilities(version, False).refusal(_isvc(OCI))
    assert refusal is not None and refusal.reason == IMAGE_VOLUME_UNSUPPORTED
    assert "imageVolumes: false" in refusal.message and "nothing was applied" in refusal.message
    assert f"API server is {version or 'of an unknown version'})" in refusal.message


@pytest.mark.parametrize(
    "model",
    [
        {"uri": "s3://models/m"},
        {"uri": "https://models.example.com/m.tar.gz"},
        {"uri": "hf://org/repo"},
        {"uri": "pvc://models/simple"},
        {"uri": "/models/simple"},
        {"uri": "default"},
    ],
)
def test_only_oci_models_are_refused(model: dict[str, Any]) -> None:
    for capabilities in (ClusterCapabilities("v1.30.0", None), ClusterCapabilities("v1.37.2", False)):
        assert capabilities.refusal(_isvc(model)) is None


def test_the_default_refuses_nothing_and_describe_says_it() -> None:
    assert ClusterCapabilities().refusal(_isvc(OCI)) is None
    assert ClusterCapabilities().describe() == (
        "API server unknown; image volumes (oci:// models, imageVolumes: auto): used (version unknown)"
    )
    assert ClusterCapabilities("v1.34.2", None).describe().endswith("imageVolumes: auto): refused")
    assert ClusterCapabilities("v1.34.2", True).describe().endswith("imageVolumes: true): used")


# --- the setting --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, value", [("auto", None), ("AUTO", None), ("", None), ("true", True), ("false", False)]
)
def test_setting_from_env(raw: str, value: bool | None) -> None:
    assert Settings.from_env({"KUBEINFER_IMAGE_VOLUMES": raw}).image_volumes is value


def test_setting_default_flag_bad_value_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert Settings.from_env({}).image_volumes is None
    flags = Settings.from_args(["--image-volumes", "true"], env={"KUBEINFER_IMAGE_VOLUMES": "false"})
    assert flags.image_volumes is True
    assert Settings.from_args(["--image-volumes", "auto"], env={}).image_volumes is None
    with pytest.raises(pydantic.ValidationError, match="image_volumes"):
        Settings.from_env({"KUBEINFER_IMAGE_VOLUMES": "sometimes"})
    with pytest.raises(SystemExit):
        Settings.from_args(["--help"], env={})
    out = " ".join(capsys.readouterr().out.split())
    assert "KUBEINFER_IMAGE_VOLUMES; default: 'auto'" in out


# --- the version read at start, the controllers ------------------------------------------------------


class VersionKube:
    """Answers GET /version with ``answer`` or raises it."""

    def __init__(self, answer: dict[str, Any] | Exception | None) -> None:
        self.answer = answer
        self.paths: list[str] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        self.paths.append(path)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def test_read_server_version(caplog: pytest.LogCaptureFixture) -> None:
    kube = VersionKube({"major": "1", "minor": "34+", "gitVersion": "v1.34.2-eks-abc"})
    assert await read_server_version(kube) == "v1.34.2-eks-abc"  # type: ignore[arg-type]
    assert kube.paths == ["/version"]
    with caplog.at_level(logging.WARNING, logger="kubeinfer.operator.controllers"):
        assert await read_server_version(VersionKube(k8s.PermanentError("GET /version: 403"))) is None  # type: ignore[arg-type]
        assert await read_server_version(VersionKube(k8s.TransientError("timeout"))) is None  # type: ignore[arg-type]
        assert await read_server_version(VersionKube({})) is None  # type: ignore[arg-type]
        assert await read_server_version(VersionKube(None)) is None  # type: ignore[arg-type]
    assert "cannot read the API server's version" in caplog.text and "no gitVersion" in caplog.text


def test_controllers_pass_the_capabilities_and_log_them(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings.from_env({"KUBEINFER_IMAGE_VOLUMES": "true", "KUBEINFER_PEERING": ""})
    with caplog.at_level(logging.INFO, logger="kubeinfer.operator.controllers"):
        made = Controllers.create(FakeKube({}), settings, "v1.34.2")  # type: ignore[arg-type]
    try:
        assert made.reconciler.capabilities == ClusterCapabilities("v1.34.2", True)
        assert "cluster capabilities: API server v1.34.2; image volumes" in caplog.text
    finally:
        made.autoscaler.close()
    unknown = Controllers.create(FakeKube({}), Settings.from_env({}))  # type: ignore[arg-type]
    assert unknown.reconciler.capabilities == ClusterCapabilities(None, None)
    unknown.autoscaler.close()


# --- the reconciler -----------------------------------------------------------------------------------


class ApplyKube(FakeKube):
    """FakeKube whose applies succeed and are recorded."""

    def __init__(self, isvc: dict[str, Any]) -> None:
        super().__init__(isvc)
        self.failing = False
        self.applied: list[str] = []

    async def apply(self, obj: dict[str, Any], *, field_manager: str, force: bool = True) -> dict[str, Any]:
        self.applied.append(obj["kind"])
        return await super().apply(obj, field_manager=field_manager, force=force)


def _body(model: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 1, "resourceVersion": "5"},
        "spec": {"model": dict(model), "resources": {"gpus": 0}, "runtime": {"device": "cpu"}},
    }


def _no_objects(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
    return None


async def _settle(rec: Reconciler, kube: FakeKube) -> None:
    await rec.reconcile(copy.deepcopy(kube.isvc), _no_objects)
    await asyncio.gather(*rec._background)


@pytest.mark.timeout(10)
async def test_an_oci_model_on_1_34_applies_nothing_and_says_why_once() -> None:
    kube = ApplyKube(_body(OCI))
    rec = Reconciler(kube=kube, clock=lambda: "T", capabilities=ClusterCapabilities("v1.34.2"))  # type: ignore[arg-type]
    try:
        await _settle(rec, kube)
        await _settle(rec, kube)  # a resync: no new write, no new Event
        assert kube.applied == []
        conditions = {c["type"]: c for c in kube.isvc["status"]["conditions"]}
        ready = conditions["Ready"]
        assert (ready["status"], ready["reason"]) == ("False", IMAGE_VOLUME_UNSUPPORTED)
        assert "this cluster's API server is v1.34.2" in ready["message"]
        assert conditions["Stalled"]["status"] == "True"
        assert len(kube.status_patches) == 1
        assert [(t, r) for t, r, _ in kube.events] == [("Warning", IMAGE_VOLUME_UNSUPPORTED)]
        # the admin says the gate is on (operator restarted with imageVolumes: true): applied as usual
        rec2 = Reconciler(kube=kube, clock=lambda: "T", capabilities=ClusterCapabilities("v1.34.2", True))  # type: ignore[arg-type]
        await _settle(rec2, kube)
        assert "Deployment" in kube.applied
        rec2.forget("ns", "m")
    finally:
        rec.forget("ns", "m")


@pytest.mark.timeout(10)
async def test_another_source_on_1_34_is_applied() -> None:
    kube = ApplyKube(_body({"uri": "s3://models/m"}))
    rec = Reconciler(kube=kube, clock=lambda: "T", capabilities=ClusterCapabilities("v1.34.2"))  # type: ignore[arg-type]
    try:
        await _settle(rec, kube)
        assert "Deployment" in kube.applied
    finally:
        rec.forget("ns", "m")
