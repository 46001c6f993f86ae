"""spec.model's sources (s3, https, http, hf, oci) and their settings, spec.quantization.calibration's, and
spec.serviceAccountName: the URI grammars and the pydantic mirrors of the CEL rules (the API server's side
is tests/integration/operator/test_operator_model_sources_cel.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from kubeinfer.operator import api

SHA = "0123456789abcdef" * 4

ACCEPTED_MODEL_URIS = [
    "default",
    "/models/m",
    "pvc://claim/m",
    "s3://bucket",
    "s3://bucket/prefix/",
    "s3://my.bucket-1/a/b.onnx",
    "https://host/m.onnx",
    "https://host:8443/a/b.tar.gz?X-Amz-Signature=abc",
    "http://host/m",
    "hf://org/repo",
    "hf://sentence-transformers/all-MiniLM-L6-v2@v1.0",
    "hf://org/repo@refs/pr/1",
    "oci://ghcr.io/org/model:v1",
    "oci://registry.example.com:5000/a/b-c:1.0",
    "oci://localhost:5000/m@sha256:" + "a" * 64,
    "oci://registry:5000/m:1",
]
REFUSED_MODEL_URIS = [
    "s3://b",  # a bucket name has 3 characters at least
    "s3://Bucket/x",
    "https://user:secret@host/m",  # no credential in the spec (spec.model.credentials)
    "ftp://host/m",
    "hf://repo",  # org/repo
    "oci://ghcr.io/org/model",  # a tag or a digest
    "oci://library/model:1",  # no registry host: Docker Hub's library/ would be meant
    "oci://ghcr.io/Org/m:1",  # repositories are lowercase
    "oci://ghcr.io/m@sha256:abc",
    "https://",
    "relative/path",
    # the fetch needs a file name to write: these always fail there, so the API server refuses them
    "https://host",
    "https://host/",
    "https://host/models/",
    "https://host/.hidden",
    "https://user:p/w@host/m.onnx",  # a password with a slash is still userinfo
]


@pytest.mark.parametrize("uri", ACCEPTED_MODEL_URIS)
def test_model_uri_accepted(uri: str) -> None:
    assert re.match(api.MODEL_URI_PATTERN, uri)


@pytest.mark.parametrize("uri", REFUSED_MODEL_URIS)
def test_model_uri_refused(uri: str) -> None:
    assert not re.match(api.MODEL_URI_PATTERN, uri)


@pytest.mark.parametrize(
    "uri, ok",
    [
        ("/data/c.txt", True),
        ("pvc://claim/c.txt", True),
        ("s3://bucket/c.txt", True),
        ("s3://bucket/a/b/c.txt", True),
        ("https://host/a/c.txt?sig=1", True),
        ("http://host/c.txt", True),
        ("s3://bucket", False),  # a file: a key, not a prefix
        ("s3://bucket/a/", False),
        ("https://host/", False),
        ("hf://org/repo", False),
        ("oci://ghcr.io/a/b:1", False),
    ],
)
def test_calibration_uri(uri: str, ok: bool) -> None:
    assert bool(re.match(api.DATA_URI_PATTERN, uri)) is ok


def _spec(model: dict[str, Any] | None = None, **spec: Any) -> api.InferenceServiceSpec:
    body: dict[str, Any] = {"resources": {"gpus": 0}, "runtime": {"device": "cpu"}, **spec}
    if model is not None:
        body["model"] = model
    return api.InferenceServiceSpec.from_k8s(body)


_CAL = "spec.quantization.calibration"
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("http-without-allow", {"model": {"uri": "http://h/m"}}, "spec.model.allowInsecureHttp"),
    ("sha256-pvc", {"model": {"uri": "pvc://c/m", "sha256": SHA}}, "spec.model.sha256"),
    ("sha256-oci", {"model": {"uri": "oci://ghcr.io/a/b:1", "sha256": SHA}}, "spec.model.sha256"),
    ("sha256-path", {"model": {"uri": "/m", "sha256": SHA}}, "spec.model.sha256"),
    ("sha256-hf", {"model": {"uri": "hf://org/m", "sha256": SHA}}, "spec.model.sha256"),
    ("sha256-short", {"model": {"uri": "https://h/m", "sha256": "abc"}}, "sha256"),
    ("s3-with-https", {"model": {"uri": "https://h/m", "s3": {"region": "x"}}}, "spec.model.s3"),
    ("hf-with-s3", {"model": {"uri": "s3://bucket/m", "hf": {}}}, "spec.model.hf"),
    (
        "credentials-path",
        {"model": {"uri": "/m", "credentials": {"secretName": "s"}}},
        "spec.model.credentials",
    ),
    ("credentials-default", {"model": {"credentials": {"secretName": "s"}}}, "spec.model.credentials"),
    ("fetch-oci", {"model": {"uri": "oci://ghcr.io/a/b:1", "fetch": {}}}, "spec.model.fetch"),
    ("fetch-pvc", {"model": {"uri": "pvc://c/m", "fetch": {"retries": 1}}}, "spec.model.fetch"),
    ("retries-11", {"model": {"uri": "s3://bucket/m", "fetch": {"retries": 11}}}, "retries"),
    (
        "zero-connect",
        {"model": {"uri": "s3://bucket/m", "fetch": {"connectTimeout": "0s"}}},
        "connectTimeout",
    ),
    ("zero-stall", {"model": {"uri": "s3://bucket/m", "fetch": {"stallTimeout": "0s"}}}, "stallTimeout"),
    ("zero-size", {"model": {"uri": "s3://bucket/m", "fetch": {"sizeLimit": "0"}}}, "sizeLimit"),
    (
        "bad-addressing",
        {"model": {"uri": "s3://bucket/m", "s3": {"addressingStyle": "dns"}}},
        "addressingStyle",
    ),
    (
        "bad-secret-name",
        {"model": {"uri": "s3://bucket/m", "credentials": {"secretName": "Bad_Name"}}},
        "secretName",
    ),
    ("empty-pattern", {"model": {"uri": "hf://o/r", "hf": {"allowPatterns": [""]}}}, "allowPatterns"),
    ("no-patterns", {"model": {"uri": "hf://o/r", "hf": {"allowPatterns": []}}}, "allowPatterns"),
    ("bad-endpoint", {"model": {"uri": "s3://bucket/m", "s3": {"endpoint": "minio:9000"}}}, "endpoint"),
    (
        "calibration-http",
        {"quantization": {"mode": "int8-static", "calibration": {"uri": "http://h/c.txt"}}},
        f"{_CAL}.allowInsecureHttp",
    ),
    (
        "calibration-sha256-path",
        {"quantization": {"mode": "int8-static", "calibration": {"uri": "/c.txt", "sha256": SHA}}},
        f"{_CAL}.sha256",
    ),
    (
        "calibration-s3-https",
        {"quantization": {"mode": "int8-static", "calibration": {"uri": "https://h/c.txt", "s3": {}}}},
        f"{_CAL}.s3",
    ),
    (
        "calibration-credentials-pvc",
        {
            "quantization": {
                "mode": "int8-static",
                "calibration": {"uri": "pvc://c/c.txt", "credentials": {"secretName": "s"}},
            }
        },
        f"{_CAL}.credentials",
    ),
    ("bad-service-account", {"serviceAccountName": "Not_A_Name"}, "serviceAccountName"),
    *(
        (
            f"ca-bundle-{name}",
            {"model": {**model, "caBundle": {"configMapName": "ca"}}},
            "spec.model.caBundle",
        )
        for name, model in (
            ("http", {"uri": "http://h/m", "allowInsecureHttp": True}),
            ("pvc", {"uri": "pvc://c/m"}),
            ("oci", {"uri": "oci://ghcr.io/a/b:1"}),
            ("path", {"uri": "/m"}),
            ("default", {}),
        )
    ),
    (
        "ca-bundle-bad-name",
        {"model": {"uri": "https://h/m", "caBundle": {"configMapName": "Bad_Name"}}},
        "configMapName",
    ),
    (
        "ca-bundle-bad-key",
        {"model": {"uri": "https://h/m", "caBundle": {"configMapName": "c", "key": "a/b"}}},
        "key",
    ),
    ("ca-bundle-no-name", {"model": {"uri": "https://h/m", "caBundle": {}}}, "configMapName"),
    (
        "calibration-ca-bundle-pvc",
        {
            "quantization": {
                "mode": "int8-static",
                "calibration": {"uri": "pvc://c/c.txt", "caBundle": {"configMapName": "ca"}},
            }
        },
        f"{_CAL}.caBundle",
    ),
]


@pytest.mark.parametrize("spec, field", [(s, f) for _, s, f in REFUSED], ids=[i for i, _, _ in REFUSED])
def test_refused_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=re.escape(field)):
        _spec(**spec)


def test_accepted_settings_per_scheme() -> None:
    s3 = _spec(
        {
            "uri": "s3://bucket/m/",
            "s3": {"endpoint": "http://minio:9000", "addressingStyle": "path"},  # an http endpoint: allowed
            "credentials": {"secretName": "s3-creds"},
            "fetch": {"sizeLimit": "2Gi", "retries": 0},
        }
    )
    assert (
        s3.model.fetch is not None
        and s3.model.fetch.stall_timeout == 60.0
        and str(s3.model.fetch.stall_timeout) == "60s"
    )
    assert _spec({"uri": "https://h/m.onnx", "format": "onnx", "sha256": SHA}).model.sha256 == SHA
    hf = _spec(
        {"uri": "hf://o/r@main", "hf": {"allowPatterns": ["*.json"]}, "credentials": {"secretName": "hf"}}
    )
    assert hf.model.hf is not None and hf.model.hf.allow_patterns == ["*.json"]
    oci = _spec({"uri": "oci://ghcr.io/a/b:1", "credentials": {"secretName": "regcred"}})
    assert oci.model.credentials is not None and api.oci_reference(oci.model.uri) == "ghcr.io/a/b:1"
    assert _spec(serviceAccountName="models").service_account_name == "models"
    for uri in ("s3://bucket/m/", "https://h/m.onnx", "hf://o/r"):
        model = _spec({"uri": uri, "caBundle": {"configMapName": "internal-ca"}}).model
        assert model.ca_bundle == api.CaBundleSpec(config_map_name="internal-ca", key="ca.crt")
    calibration = _spec(
        quantization={
            "mode": "int8-static",
            "calibration": {"uri": "https://h/c.txt", "caBundle": {"configMapName": "ca", "key": "x.pem"}},
        }
    ).quantization.calibration
    assert calibration is not None and calibration.ca_bundle is not None
    assert calibration.ca_bundle.key == "x.pem"


def test_scheme_helpers() -> None:
    assert [api.uri_scheme(u) for u in ("default", "/m", "pvc://c/m", "s3://b/k", "oci://r.io/a:1")] == [
        "",
        "",
        "pvc",
        "s3",
        "oci",
    ]
    assert [api.is_fetched(u) for u in ("s3://bkt/k", "https://h/m", "http://h/m", "hf://o/r")] == [True] * 4
    assert not any(api.is_fetched(u) for u in ("default", "/m", "pvc://c/m", "oci://r.io/a:1"))
    assert api.oci_reference("s3://bkt/k") is None


def test_new_fields_left_unset_dump_as_before() -> None:
    """The spec's dump (and so the CRD's default) has no new key but allowInsecureHttp: false."""
    dumped = api.InferenceServiceSpec().model_dump(by_alias=True, exclude_none=True)
    assert set(dumped["model"]) == {"uri", "format", "inputs", "outputs", "allowInsecureHttp"}
    assert "serviceAccountName" not in dumped


def _crd_rules(path: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    crd = yaml.safe_load(
        (Path(__file__).resolve().parents[3] / "crds" / "inferenceservices.kubeinfer.io.yaml").read_text()
    )
    node = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for name in path:
        node = node["properties"][name]
    return {r["fieldPath"]: r for r in node["x-kubernetes-validations"] if "fieldPath" in r}


@pytest.mark.parametrize(
    "path, field, schemes",
    [
        (("model",), "spec.model", ("s3", "https", "hf")),
        (("quantization", "calibration"), _CAL, ("s3", "https", "hf")),  # its uri pattern refuses hf://
    ],
)
def test_the_crd_allows_a_ca_bundle_on_tls_sources_only(
    path: tuple[str, ...], field: str, schemes: tuple[str, ...]
) -> None:
    """The CRD's CEL rule for caBundle: its regex (CEL's ``matches`` is RE2; this one reads the same in
    Python) takes the TLS schemes and nothing else, and the message names the field."""
    rule = _crd_rules(path)[".caBundle"]
    assert rule["reason"] == "FieldValueForbidden" and rule["message"].startswith(f"{field}.caBundle applies")
    match = re.fullmatch(r"!has\(self\.caBundle\) \|\| self\.uri\.matches\('(.+)'\)", rule["rule"])
    assert match is not None, rule["rule"]
    uris = {"s3": "s3://b/k", "https": "https://h/m", "hf": "hf://o/r", "http": "http://h/m"}
    uris |= {"oci": "oci://r.io/a:1", "pvc": "pvc://c/m", "path": "/m", "default": "default"}
    assert {s for s, u in uris.items() if re.search(match.group(1), u)} == set(schemes)
