"""The API server's side of spec.model's sources (s3, https, http, hf, oci), their settings, the calibration
file's and spec.serviceAccountName: the CRD's patterns and CEL rules refuse what does not fit, with a
message naming the field, and accept every scheme with the settings it takes (the pydantic mirrors are
tests/unit/operator/test_operator_api_sources.py)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.integration.operator.test_operator_validation import BASE, _merge
from tests.support.cluster import Cluster

SHA = "0123456789abcdef" * 4
_CAL = "spec.quantization.calibration"


def _calibration(calibration: dict[str, Any]) -> dict[str, Any]:
    return {"quantization": {"mode": "int8-static", "calibration": calibration}}


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("ftp-uri", {"model": {"uri": "ftp://host/m"}}, "spec.model.uri"),
    ("userinfo-uri", {"model": {"uri": "https://user:secret@host/m"}}, "spec.model.uri"),
    ("oci-without-tag", {"model": {"uri": "oci://ghcr.io/org/model"}}, "spec.model.uri"),
    ("oci-docker-hub-name", {"model": {"uri": "oci://library/model:1"}}, "spec.model.uri"),
    ("hf-without-org", {"model": {"uri": "hf://repo"}}, "spec.model.uri"),
    ("http-without-allow", {"model": {"uri": "http://host/m"}}, "spec.model.allowInsecureHttp"),
    ("sha256-pvc", {"model": {"uri": "pvc://claim/m", "sha256": SHA}}, "spec.model.sha256"),
    ("sha256-oci", {"model": {"uri": "oci://ghcr.io/a/b:1", "sha256": SHA}}, "spec.model.sha256"),
    ("sha256-path", {"model": {"uri": "/models/m", "sha256": SHA}}, "spec.model.sha256"),
    ("sha256-hf", {"model": {"uri": "hf://org/m@v1", "sha256": SHA}}, "spec.model.sha256"),
    ("sha256-not-hex", {"model": {"uri": "https://host/m", "sha256": "z" * 64}}, "spec.model.sha256"),
    (
        "s3-settings-on-https",
        {"model": {"uri": "https://host/m", "s3": {"region": "eu-west-1"}}},
        "spec.model.s3",
    ),
    (
        "hf-settings-on-s3",
        {"model": {"uri": "s3://bucket/m", "hf": {"allowPatterns": ["*.json"]}}},
        "spec.model.hf",
    ),
    (
        "credentials-on-path",
        {"model": {"uri": "/models/m", "credentials": {"secretName": "s"}}},
        "spec.model.credentials",
    ),
    (
        "credentials-on-pvc",
        {"model": {"uri": "pvc://c/m", "credentials": {"secretName": "s"}}},
        "spec.model.credentials",
    ),
    ("fetch-on-oci", {"model": {"uri": "oci://ghcr.io/a/b:1", "fetch": {"retries": 1}}}, "spec.model.fetch"),
    ("fetch-on-default", {"model": {"fetch": {"sizeLimit": "1Gi"}}}, "spec.model.fetch"),
    ("retries-11", {"model": {"uri": "s3://bucket/m", "fetch": {"retries": 11}}}, "spec.model.fetch.retries"),
    (
        "zero-connect-timeout",
        {"model": {"uri": "s3://bucket/m", "fetch": {"connectTimeout": "0s"}}},
        "spec.model.fetch.connectTimeout",
    ),
    (
        "zero-stall-timeout",
        {"model": {"uri": "s3://bucket/m", "fetch": {"stallTimeout": "0s"}}},
        "spec.model.fetch.stallTimeout",
    ),
    (
        "zero-size-limit",
        {"model": {"uri": "s3://bucket/m", "fetch": {"sizeLimit": "0"}}},
        "spec.model.fetch.sizeLimit",
    ),
    (
        "bad-addressing-style",
        {"model": {"uri": "s3://bucket/m", "s3": {"addressingStyle": "dns"}}},
        "spec.model.s3.addressingStyle",
    ),
    (
        "bad-endpoint",
        {"model": {"uri": "s3://bucket/m", "s3": {"endpoint": "minio:9000"}}},
        "spec.model.s3.endpoint",
    ),
    (
        "bad-secret-name",
        {"model": {"uri": "s3://bucket/m", "credentials": {"secretName": "Bad_Name"}}},
        "spec.model.credentials.secretName",
    ),
    (
        "empty-allow-patterns",
        {"model": {"uri": "hf://o/r", "hf": {"allowPatterns": []}}},
        "spec.model.hf.allowPatterns",
    ),
    ("calibration-hf", _calibration({"uri": "hf://o/r"}), f"{_CAL}.uri"),
    ("calibration-s3-prefix", _calibration({"uri": "s3://bucket/dir/"}), f"{_CAL}.uri"),
    ("calibration-http", _calibration({"uri": "http://host/c.txt"}), f"{_CAL}.allowInsecureHttp"),
    ("calibration-sha256-path", _calibration({"uri": "/data/c.txt", "sha256": SHA}), f"{_CAL}.sha256"),
    ("calibration-s3-on-https", _calibration({"uri": "https://host/c.txt", "s3": {}}), f"{_CAL}.s3"),
    (
        "calibration-credentials-on-pvc",
        _calibration({"uri": "pvc://c/c.txt", "credentials": {"secretName": "s"}}),
        f"{_CAL}.credentials",
    ),
    ("bad-service-account", {"serviceAccountName": "Not_A_Name"}, "spec.serviceAccountName"),
    (
        "ca-bundle-on-http",
        {"model": {"uri": "http://h/m", "allowInsecureHttp": True, "caBundle": {"configMapName": "ca"}}},
        "spec.model.caBundle",
    ),
    (
        "ca-bundle-on-pvc",
        {"model": {"uri": "pvc://c/m", "caBundle": {"configMapName": "ca"}}},
        "spec.model.caBundle",
    ),
    (
        "ca-bundle-on-oci",
        {"model": {"uri": "oci://ghcr.io/a/b:1", "caBundle": {"configMapName": "ca"}}},
        "spec.model.caBundle",
    ),
    (
        "ca-bundle-bad-key",
        {"model": {"uri": "https://h/m", "caBundle": {"configMapName": "ca", "key": "a/b"}}},
        "spec.model.caBundle.key",
    ),
    (
        "calibration-ca-bundle-on-path",
        _calibration({"uri": "/data/c.txt", "caBundle": {"configMapName": "ca"}}),
        f"{_CAL}.caBundle",
    ),
]

ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    (
        "s3",
        {
            "model": {
                "uri": "s3://models/bert/",
                "s3": {
                    "endpoint": "http://minio.storage.svc:9000",
                    "region": "us-east-1",
                    "addressingStyle": "path",
                },
                "credentials": {"secretName": "model-store"},
                "fetch": {"sizeLimit": "2Gi", "connectTimeout": "5s", "stallTimeout": "2m", "retries": 0},
            },
            "serviceAccountName": "models",
        },
    ),
    (
        "https",
        {
            "model": {
                "uri": "https://h.example.com/m.tar.gz?sig=x",
                "sha256": SHA,
                "credentials": {"secretName": "t"},
            }
        },
    ),
    ("http", {"model": {"uri": "http://models.models.svc/m.tgz", "allowInsecureHttp": True}}),
    (
        "hf",
        {
            "model": {
                "uri": "hf://org/repo@v1.0",
                "hf": {"endpoint": "https://hub.example.com", "allowPatterns": ["*.json"]},
            }
        },
    ),
    (
        "oci-tag",
        {
            "model": {
                "uri": "oci://registry.example.com/models/bert:v1",
                "credentials": {"secretName": "pull"},
            }
        },
    ),
    ("oci-digest", {"model": {"uri": f"oci://localhost:5000/bert@sha256:{'a' * 64}"}}),
    (
        "calibration-s3",
        _calibration(
            {
                "uri": "s3://data/c.txt",
                "sha256": SHA,
                "s3": {"region": "x"},
                "credentials": {"secretName": "s"},
            }
        ),
    ),
    ("calibration-http", _calibration({"uri": "http://host/c.txt", "allowInsecureHttp": True})),
    *(
        (f"ca-bundle-{uri.split(':')[0]}", {"model": {"uri": uri, "caBundle": {"configMapName": "ca"}}})
        for uri in ("s3://bucket/m/", "https://h/m.tgz", "hf://o/r")
    ),
    (
        "calibration-ca-bundle",
        _calibration({"uri": "https://h/c.txt", "caBundle": {"configMapName": "ca", "key": "root.pem"}}),
    ),
]


def _apply(cluster: Cluster, namespace: str, spec_patch: dict[str, Any]) -> Any:
    manifest = _merge(BASE, {"spec": spec_patch})
    return cluster.kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        namespace,
        "-o",
        "yaml",
        "-f",
        "-",
        input=yaml.safe_dump(manifest),
        check=False,
    )


@pytest.mark.parametrize("spec_patch, field", [(p, f) for _, p, f in REFUSED], ids=[i for i, _, _ in REFUSED])
def test_refused_naming_the_field(
    cluster: Cluster, crds: None, op_namespace: str, spec_patch: dict[str, Any], field: str
) -> None:
    result = _apply(cluster, op_namespace, spec_patch)
    assert result.returncode != 0, f"accepted: {spec_patch}"
    assert field in result.stderr, result.stderr
    assert "type conversion error" not in result.stderr, result.stderr


@pytest.mark.parametrize("spec_patch", [p for _, p in ACCEPTED], ids=[i for i, _ in ACCEPTED])
def test_accepted(cluster: Cluster, crds: None, op_namespace: str, spec_patch: dict[str, Any]) -> None:
    result = _apply(cluster, op_namespace, spec_patch)
    assert result.returncode == 0, result.stderr


def test_fetch_defaults_and_no_new_default_without_the_fields(
    cluster: Cluster, crds: None, op_namespace: str
) -> None:
    fetched = yaml.safe_load(
        _apply(cluster, op_namespace, {"model": {"uri": "s3://bucket/m", "fetch": {}}}).stdout
    )
    assert fetched["spec"]["model"]["fetch"] == {
        "sizeLimit": "20Gi",
        "connectTimeout": "10s",
        "stallTimeout": "60s",
        "retries": 3,
    }
    plain = yaml.safe_load(_apply(cluster, op_namespace, {}).stdout)["spec"]
    assert plain["model"] == {
        "uri": "default",
        "format": "huggingface",
        "inputs": [],
        "outputs": [],
        "allowInsecureHttp": False,
    }
    assert "serviceAccountName" not in plain
