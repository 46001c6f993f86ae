"""The model's source as pod spec (operator/builders/source.py, deployment.py, configmap.py): the fetch init
container of s3/https/http/hf exactly as the contract with ``kubeinfer-runtime fetch`` says, the emptyDir,
the OCI image volume, the credentials as secretKeyRef env / imagePullSecrets, runtime.yaml's
``model.source``, the ServiceAccount token. Golden files: tests/unit/operator/golden/source-*.yaml."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeinfer.operator import api
from kubeinfer.operator.builders import build_configmap, build_deployment, config_hash, runtime_config
from kubeinfer.operator.builders.deployment import CONTAINER_SECURITY_CONTEXT
from kubeinfer.operator.builders.source import FETCH_RESOURCES

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("KUBEINFER_UPDATE_GOLDEN") == "1"
SHA = "ab" * 32
BASE: dict[str, Any] = {
    "resources": {"gpus": 0, "cpu": "2", "memory": "4Gi"},
    "runtime": {"device": "cpu", "image": "ghcr.io/kubeinfer/runtime:test"},
}

#: name -> spec (over BASE); each has a golden file source-<name>.yaml
SOURCES: dict[str, dict[str, Any]] = {
    "s3": {
        "model": {
            "uri": "s3://models/bert/",
            "s3": {
                "endpoint": "https://minio.storage.svc:9000",
                "region": "eu-west-1",
                "addressingStyle": "path",
            },
            "credentials": {"secretName": "s3-creds"},
            "fetch": {"sizeLimit": "5Gi", "connectTimeout": "2500ms", "stallTimeout": "2m", "retries": 5},
        }
    },
    "s3-irsa": {
        "model": {"uri": "s3://models/bert/model.onnx", "format": "onnx"},
        "serviceAccountName": "models",
    },
    "https": {
        "model": {
            "uri": "https://models.example.com/bert.tar.gz",
            "sha256": SHA,
            "credentials": {"secretName": "web-token"},
        }
    },
    "http": {"model": {"uri": "http://models.models.svc/bert.tgz", "allowInsecureHttp": True}},
    "hf": {
        "model": {
            "uri": "hf://sentence-transformers/all-MiniLM-L6-v2@v1.0",
            "hf": {"endpoint": "https://hub.example.com"},
            "credentials": {"secretName": "hf-token"},
        }
    },
    "oci": {
        "model": {
            "uri": "oci://registry.example.com/models/bert:v1",
            "credentials": {"secretName": "regcred"},
        }
    },
    "oci-digest": {"model": {"uri": f"oci://localhost:5000/bert@sha256:{'0' * 64}"}},
    "https-ca": {
        "model": {
            "uri": "https://artifacts.internal.example/models/bert.tar.gz",
            "caBundle": {"configMapName": "internal-ca", "key": "root.pem"},
        }
    },
    "calibration-s3": {
        "quantization": {
            "mode": "int8-static",
            "calibration": {
                "uri": "s3://data/calibration/texts.txt",
                "sha256": SHA,
                "s3": {"endpoint": "http://minio.storage.svc:9000"},
                "credentials": {"secretName": "s3-creds"},
            },
        }
    },
}


def _isvc(spec: dict[str, Any], name: str = "m") -> api.InferenceService:
    body = {
        "metadata": {"name": name, "namespace": "ns1", "uid": "00000000-0000-0000-0000-000000000001"},
        "spec": {**copy.deepcopy(BASE), **copy.deepcopy(spec)},
    }
    return api.InferenceService.from_body(body)


def _pod(isvc: api.InferenceService) -> dict[str, Any]:
    pod: dict[str, Any] = build_deployment(isvc, replicas=1)["spec"]["template"]["spec"]
    return pod


def _rendered(isvc: api.InferenceService) -> dict[str, Any]:
    """What the golden files hold: the pod spec, and the model/quantization of runtime.yaml."""
    data = runtime_config(isvc, 0.005).model_dump(mode="json", exclude_unset=True)
    return {"pod": _pod(isvc), "runtime.yaml": {k: data[k] for k in ("model", "quantization")}}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_source_pod_spec_matches_golden_file(name: str) -> None:
    text = yaml.safe_dump(_rendered(_isvc(SOURCES[name])), sort_keys=True)
    golden = GOLDEN / f"source-{name}.yaml"
    if UPDATE:
        golden.write_text(text)
    assert golden.exists(), f"missing {golden}: run with KUBEINFER_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), f"{golden} differs: review, then KUBEINFER_UPDATE_GOLDEN=1"


def _init(pod: dict[str, Any], name: str = "fetch") -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in pod["initContainers"] if c["name"] == name)
    return found


def test_s3_fetch_init_container_follows_the_contract() -> None:
    pod = _pod(_isvc(SOURCES["s3"]))
    init = _init(pod)
    assert init["image"] == "ghcr.io/kubeinfer/runtime:test"
    assert init["command"] == ["kubeinfer-runtime"]
    assert init["args"] == [
        "fetch",
        "--source",
        "s3://models/bert/",
        "--dest",
        "/mnt/models",
        "--s3-endpoint",
        "https://minio.storage.svc:9000",
        "--s3-region",
        "eu-west-1",
        "--s3-addressing-style",
        "path",
        "--size-limit",
        str(5 * 2**30),
        "--connect-timeout",
        "2.5",
        "--stall-timeout",
        "120",
        "--retries",
        "5",
    ]
    assert init["securityContext"] == CONTAINER_SECURITY_CONTEXT
    assert init["resources"] == FETCH_RESOURCES
    assert init["terminationMessagePolicy"] == "File"
    # the credentials: secretKeyRef only (the operator never reads the Secret), keys per contract
    assert init["env"] == [
        {
            "name": name,
            "valueFrom": {
                "secretKeyRef": {"name": "s3-creds", "key": name, "optional": name == "AWS_SESSION_TOKEN"}
            },
        }
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    ]
    # the emptyDir: read-write in the init container, read-only at /mnt/models in the runtime
    assert {"name": "model", "emptyDir": {"sizeLimit": "5Gi"}} in pod["volumes"]
    assert {"name": "model", "mountPath": "/mnt/models"} in init["volumeMounts"]
    runtime = pod["containers"][0]
    assert {"name": "model", "mountPath": "/mnt/models", "readOnly": True} in runtime["volumeMounts"]
    assert not any(
        e["name"].startswith("AWS_") for e in runtime["env"]
    )  # credentials stay in the init container
    assert "imagePullSecrets" not in pod
    env_names = {e["name"] for e in init["env"]}
    assert not env_names & {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"}


def test_defaults_of_the_fetch_limits_and_no_credentials() -> None:
    init = _init(_pod(_isvc(SOURCES["s3-irsa"])))
    assert init["args"][-8:] == [
        "--size-limit",
        str(20 * 2**30),
        "--connect-timeout",
        "10",
        "--stall-timeout",
        "60",
        "--retries",
        "3",
    ]
    assert "env" not in init  # no Secret: boto3's default chain (IRSA, workload identity)


@pytest.mark.parametrize(
    "name, env, key",
    [("https", "KUBEINFER_FETCH_BEARER_TOKEN", "BEARER_TOKEN"), ("hf", "HF_TOKEN", "HF_TOKEN")],
)
def test_credentials_keys_per_scheme(name: str, env: str, key: str) -> None:
    init = _init(_pod(_isvc(SOURCES[name])))
    secret = SOURCES[name]["model"]["credentials"]["secretName"]
    assert init["env"] == [
        {"name": env, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": False}}}
    ]


def test_https_sha256_and_http_allow_http() -> None:
    https = _init(_pod(_isvc(SOURCES["https"])))["args"]
    assert https[5:7] == ["--sha256", SHA] and "--allow-http" not in https
    http = _init(_pod(_isvc(SOURCES["http"])))["args"]
    assert http[:5] == ["fetch", "--source", "http://models.models.svc/bert.tgz", "--dest", "/mnt/models"]
    assert "--allow-http" in http
    upper = _init(
        _pod(_isvc({"model": {"uri": "https://h/m.onnx", "format": "onnx", "sha256": SHA.upper()}}))
    )
    assert upper["args"][5:7] == ["--sha256", SHA]


def test_hf_allow_patterns_default_by_format_and_engine() -> None:
    def patterns(spec: dict[str, Any]) -> list[str]:
        args = _init(_pod(_isvc(spec)))["args"]
        return [args[i + 1] for i, a in enumerate(args) if a == "--allow-pattern"]

    hf = {"uri": "hf://org/repo"}
    default = ["*.json", "*.txt", "*.safetensors", "tokenizer*", "*.model", "1_Pooling/*"]
    assert patterns({"model": hf}) == default
    assert patterns({"model": hf, "runtime": {"device": "cpu", "engine": "onnxruntime"}}) == [
        *default,
        "*.onnx",
        "onnx/*",
    ]
    assert patterns({"model": {**hf, "format": "onnx"}}) == ["*.onnx", "*.onnx_data"]
    assert patterns({"model": {**hf, "format": "pt2"}}) == ["*.pt2"]
    chosen = {**hf, "hf": {"allowPatterns": ["onnx/model.onnx", "*.json"]}, "format": "onnx"}
    assert patterns({"model": chosen}) == ["onnx/model.onnx", "*.json"]
    args = _init(_pod(_isvc(SOURCES["hf"])))["args"]
    assert args[:7] == [
        "fetch",
        "--source",
        "hf://sentence-transformers/all-MiniLM-L6-v2@v1.0",
        "--dest",
        "/mnt/models",
        "--hf-endpoint",
        "https://hub.example.com",
    ]


def test_oci_is_an_image_volume_with_pull_secrets_and_no_init_container() -> None:
    pod = _pod(_isvc(SOURCES["oci"]))
    assert "initContainers" not in pod
    assert {
        "name": "model",
        "image": {"reference": "registry.example.com/models/bert:v1", "pullPolicy": "IfNotPresent"},
    } in pod["volumes"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert {"name": "model", "mountPath": "/mnt/models", "readOnly": True} in pod["containers"][0][
        "volumeMounts"
    ]
    digest = _pod(_isvc(SOURCES["oci-digest"]))
    assert {
        "name": "model",
        "image": {"reference": f"localhost:5000/bert@sha256:{'0' * 64}", "pullPolicy": "IfNotPresent"},
    } in digest["volumes"]
    assert "imagePullSecrets" not in digest


@pytest.mark.parametrize("name", ["s3", "https", "http", "hf", "oci", "oci-digest"])
def test_runtime_yaml_model_source_is_mnt_models(name: str) -> None:
    assert runtime_config(_isvc(SOURCES[name]), 0.005).model.source == "/mnt/models"


def test_fetched_calibration_file() -> None:
    isvc = _isvc(SOURCES["calibration-s3"])
    pod = _pod(isvc)
    assert [c["name"] for c in pod["initContainers"]] == ["fetch-calibration"]
    init = _init(pod, "fetch-calibration")
    assert init["args"][:5] == [
        "fetch",
        "--source",
        "s3://data/calibration/texts.txt",
        "--dest",
        "/mnt/calibration",
    ]
    assert "--allow-http" not in init["args"] and "--sha256" in init["args"]
    assert {"name": "calibration", "emptyDir": {"sizeLimit": "1Gi"}} in pod["volumes"]
    assert {"name": "calibration", "mountPath": "/mnt/calibration", "readOnly": True} in pod["containers"][0][
        "volumeMounts"
    ]
    cfg = runtime_config(isvc, 0.005)
    assert cfg.quantization.calibration_path == "/mnt/calibration/texts.txt"
    assert cfg.model.source == "default"
    https = _isvc(
        {"quantization": {"mode": "int8-static", "calibration": {"uri": "https://h/d/c.txt?sig=x"}}}
    )
    assert runtime_config(https, 0.005).quantization.calibration_path == "/mnt/calibration/c.txt"
    spaced = _isvc({"quantization": {"mode": "int8-static", "calibration": {"uri": "https://h/my%20c.txt"}}})
    assert runtime_config(spaced, 0.005).quantization.calibration_path == "/mnt/calibration/my c.txt"
    both = _pod(_isvc({**SOURCES["calibration-s3"], "model": {"uri": "hf://org/repo"}}))
    assert [c["name"] for c in both["initContainers"]] == ["fetch", "fetch-calibration"]


def test_dollar_in_a_uri_is_escaped_so_the_kubelet_expands_no_credential_into_it() -> None:
    init = _init(
        _pod(
            _isvc(
                {
                    "model": {
                        "uri": "s3://models/$(AWS_SECRET_ACCESS_KEY)/x",
                        "credentials": {"secretName": "s"},
                    }
                }
            )
        )
    )
    assert init["args"][2] == "s3://models/$$(AWS_SECRET_ACCESS_KEY)/x"


def test_paths_and_pvcs_have_no_init_container_nor_model_volume() -> None:
    for uri in ("default", "/models/m", "pvc://claim/m"):
        pod = _pod(_isvc({"model": {"uri": uri}}))
        assert "initContainers" not in pod and "imagePullSecrets" not in pod
        assert all(v["name"] != "model" for v in pod["volumes"])


def test_service_account_token_only_with_a_service_account() -> None:
    plain = _pod(_isvc({}))
    assert plain["automountServiceAccountToken"] is False and "serviceAccountName" not in plain
    named = _pod(_isvc(SOURCES["s3-irsa"]))
    assert named["serviceAccountName"] == "models" and "automountServiceAccountToken" not in named


def test_runtime_termination_message_is_its_own_file_not_a_log_tail() -> None:
    for spec in ({}, SOURCES["s3"], SOURCES["oci"]):
        assert _pod(_isvc(spec))["containers"][0]["terminationMessagePolicy"] == "File"


def test_new_fields_left_unset_keep_the_config_hash_and_configmap() -> None:
    plain = _isvc({"model": {"uri": "/models/m"}})
    explicit = _isvc({"model": {"uri": "/models/m", "allowInsecureHttp": False}})
    assert config_hash(plain) == config_hash(explicit)
    assert build_configmap(plain, 0.005)["data"] == build_configmap(explicit, 0.005)["data"]
    # a fetched source changes what the runtime loads: the pods roll
    assert config_hash(_isvc(SOURCES["s3"])) != config_hash(plain)


def test_ca_bundle_reaches_the_fetch_init_container_only() -> None:
    pod = _pod(_isvc(SOURCES["https-ca"]))
    init = _init(pod)
    i = init["args"].index("--ca-file")
    assert init["args"][i : i + 2] == ["--ca-file", "/etc/kubeinfer/model-ca/ca.crt"]
    assert {
        "name": "model-ca",
        "configMap": {"name": "internal-ca", "items": [{"key": "root.pem", "path": "ca.crt"}]},
    } in pod["volumes"]
    assert {"name": "model-ca", "mountPath": "/etc/kubeinfer/model-ca", "readOnly": True} in init[
        "volumeMounts"
    ]
    assert all(m["name"] != "model-ca" for m in pod["containers"][0]["volumeMounts"])
    assert "env" not in init  # a file, not an environment variable
    default_key = _pod(_isvc({"model": {"uri": "hf://o/r", "caBundle": {"configMapName": "ca"}}}))
    assert default_key["volumes"][-1]["configMap"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    for plain in (SOURCES["https"], SOURCES["s3"]):
        pod = _pod(_isvc(plain))
        assert "--ca-file" not in _init(pod)["args"] and all(v["name"] != "model-ca" for v in pod["volumes"])


def test_calibration_ca_bundle_has_its_own_volume_in_its_own_fetch() -> None:
    spec = copy.deepcopy(SOURCES["calibration-s3"])
    spec["quantization"]["calibration"]["caBundle"] = {"configMapName": "minio-ca"}
    spec["model"] = {"uri": "s3://models/bert/", "caBundle": {"configMapName": "minio-ca"}}
    pod = _pod(_isvc(spec))
    model, calibration = _init(pod), _init(pod, "fetch-calibration")
    assert "/etc/kubeinfer/model-ca/ca.crt" in model["args"]
    assert "/etc/kubeinfer/calibration-ca/ca.crt" in calibration["args"]
    assert [m["name"] for m in calibration["volumeMounts"]] == ["calibration", "tmp", "calibration-ca"]
    assert [m["name"] for m in model["volumeMounts"]] == ["model", "tmp", "model-ca"]
    names = [v["name"] for v in pod["volumes"]]
    assert len(names) == len(set(names)) and {"model-ca", "calibration-ca"} <= set(names)
