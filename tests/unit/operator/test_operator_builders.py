"""Golden-file and property tests of the pure builders (operator/builders/)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from kubeinfer.operator import api
from kubeinfer.operator.builders import (
    build_configmap,
    build_deployment,
    build_networkpolicy,
    build_pdb,
    build_service,
    config_hash,
    runtime_config,
    scraper_peer,
)
from kubeinfer.runtime.config import RuntimeConfig

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).parent / "golden"
#: The examples of one InferenceService each (examples/pool.yaml, a ModelPool and its models, has its own
#: tests: tests/unit/operator/test_operator_pool.py).
EXAMPLES = [
    p
    for p in sorted((ROOT / "examples").glob("*.yaml"))
    if [d.get("kind") for d in yaml.safe_load_all(p.read_text())] == ["InferenceService"]
]
UPDATE = os.environ.get("KUBEINFER_UPDATE_GOLDEN") == "1"
#: The operator's Prometheus as the golden NetworkPolicies admit it (settings: prometheus_namespace).
SCRAPERS = (scraper_peer("monitoring", {"app.kubernetes.io/name": "prometheus"}),)


def _isvc(body: dict[str, Any]) -> api.InferenceService:
    body = copy.deepcopy(body)
    body["metadata"].setdefault("namespace", "ns1")
    body["metadata"].setdefault("uid", "00000000-0000-0000-0000-000000000001")
    return api.InferenceService.from_body(body)


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def _render(isvc: api.InferenceService) -> dict[str, Any]:
    timeout = isvc.spec.max_queue_delay_in_force(isvc.status.max_queue_delay)
    replicas = isvc.spec.autoscaling.min_replicas if isvc.spec.autoscaling.enabled else isvc.spec.replicas
    rendered = {
        "deployment": build_deployment(isvc, replicas=replicas),
        "service": build_service(isvc),
        "configmap": build_configmap(isvc, timeout),
        "pdb": build_pdb(isvc),
    }
    # only where spec.server.allowFrom is set: the other golden files read as before the NetworkPolicy
    policy = build_networkpolicy(isvc, SCRAPERS)
    if policy is not None:
        rendered["networkpolicy"] = policy
    return rendered


def _normalized(isvc: api.InferenceService) -> dict[str, Any]:
    """The rendered objects with what depends on RuntimeConfig's *defaults* normalized away.

    The runtime team may add fields with defaults to RuntimeConfig; that changes the full
    ``runtime.yaml`` text and the hashes derived from it, not what the operator renders. So the
    golden files hold the fields the operator sets (``exclude_unset``) and ``<hash>`` placeholders;
    hashes are covered by the determinism and change tests below.
    """
    rendered = copy.deepcopy(_render(isvc))
    timeout = isvc.spec.max_queue_delay_in_force(isvc.status.max_queue_delay)
    cm = rendered["configmap"]
    cm["data"]["runtime.yaml"] = runtime_config(isvc, timeout).model_dump(mode="json", exclude_unset=True)
    for obj in rendered.values():
        if obj is not None:
            obj["metadata"]["annotations"]["kubeinfer.io/applied-hash"] = "<hash>"
    rendered["deployment"]["spec"]["template"]["metadata"]["annotations"]["kubeinfer.io/config-hash"] = (
        "<hash>"
    )
    return rendered


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_builders_match_golden_files(example: Path) -> None:
    rendered = _normalized(_isvc(_load(example)))
    text = yaml.safe_dump(rendered, sort_keys=True)
    golden = GOLDEN / f"{example.stem}.yaml"
    if UPDATE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"missing {golden}: run with KUBEINFER_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), f"{golden} differs: review, then KUBEINFER_UPDATE_GOLDEN=1"


def test_builders_are_deterministic() -> None:
    isvc = _isvc(_load(ROOT / "examples/minilm.yaml"))
    assert _render(isvc) == _render(isvc)


def _template(isvc: api.InferenceService) -> dict[str, Any]:
    template: dict[str, Any] = build_deployment(isvc, replicas=None)["spec"]["template"]
    return template


def test_batching_change_changes_configmap_not_pod_template() -> None:
    body = _load(ROOT / "examples/minilm.yaml")
    before = _isvc(body)
    body["spec"]["batching"] = {"maxBatchSize": 64, "maxQueueDelay": "7ms", "preferredBatchSizes": [16, 32]}
    after = _isvc(body)
    assert _template(before) == _template(after)
    cm_before = build_configmap(before, before.spec.max_queue_delay_in_force(None))
    cm_after = build_configmap(after, after.spec.max_queue_delay_in_force(None))
    assert cm_before["data"] != cm_after["data"]
    cfg = RuntimeConfig.from_yaml(cm_after["data"]["runtime.yaml"])
    assert cfg.batching.max_batch_size == 64
    assert cfg.batching.max_queue_delay_seconds == pytest.approx(0.007)


def test_the_priority_share_reaches_runtime_yaml_only_when_given() -> None:
    body = _load(ROOT / "examples/minilm.yaml")
    unset = _isvc(body)
    cm = build_configmap(unset, unset.spec.max_queue_delay_in_force(None))
    assert "priority_min_share" not in cm["data"]["runtime.yaml"]
    assert RuntimeConfig.from_yaml(cm["data"]["runtime.yaml"]).batching.priority_min_share == 0.1
    body["spec"]["batching"]["priorityMinShare"] = 0.0
    strict = _isvc(body)
    cm = build_configmap(strict, strict.spec.max_queue_delay_in_force(None))
    assert RuntimeConfig.from_yaml(cm["data"]["runtime.yaml"]).batching.priority_min_share == 0.0
    body["spec"]["batching"]["priorityMinShare"] = 0.6
    with pytest.raises(pydantic.ValidationError, match="priorityMinShare"):
        _isvc(body)


@pytest.mark.parametrize(
    "path, value",
    [
        (("model", "uri"), "/models/other"),
        (("quantization", "mode"), "none"),
        (("resources", "memory"), "4Gi"),
        (("runtime", "image"), "ghcr.io/kubeinfer/runtime:0.2.0"),
        (("warmup", "steps"), 3),
    ],
)
def test_model_quantization_resources_image_change_rolls_pods(path: tuple[str, str], value: Any) -> None:
    body = _load(ROOT / "examples/minilm.yaml")
    before = _isvc(body)
    body["spec"].setdefault(path[0], {})[path[1]] = value
    after = _isvc(body)
    assert _template(before) != _template(after)


def test_autoscaler_max_queue_delay_overrides_and_is_clamped() -> None:
    body = _load(ROOT / "examples/minilm.yaml")  # bounds 1ms..20ms, maxQueueDelay 5ms
    body["status"] = {"maxQueueDelay": "12ms"}
    isvc = _isvc(body)
    assert isvc.status.max_queue_delay == pytest.approx(0.012)  # parsed with the status, once
    assert isvc.spec.max_queue_delay_in_force(isvc.status.max_queue_delay) == pytest.approx(0.012)
    assert isvc.spec.max_queue_delay_in_force(0.9) == pytest.approx(0.020)
    assert isvc.spec.max_queue_delay_in_force(None) == pytest.approx(0.005)
    body["spec"]["autoscaling"]["enabled"] = False
    assert _isvc(body).spec.max_queue_delay_in_force(0.012) == pytest.approx(0.005)


def test_gpu_placement_and_pvc_mounts() -> None:
    gpu = build_deployment(_isvc(_load(ROOT / "examples/gpu-fp16.yaml")), replicas=2)
    pod = gpu["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert gpu["spec"]["replicas"] == 2
    ts = _isvc(_load(ROOT / "examples/pvc-torchscript.yaml"))
    dep = build_deployment(ts, replicas=None)
    assert "replicas" not in dep["spec"]
    vols = dep["spec"]["template"]["spec"]["volumes"]
    assert {"name": "pvc-0", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in vols
    cfg = RuntimeConfig.from_yaml(build_configmap(ts, 0.01)["data"]["runtime.yaml"])
    assert cfg.model.source == "/mnt/pvc/models/resnet50/model.pt"
    assert cfg.model.name == "resnet50"


def test_pdb_only_with_more_than_one_replica() -> None:
    body = _load(ROOT / "examples/gpu-fp16.yaml")
    assert build_pdb(_isvc(body)) is not None
    body["spec"]["replicas"] = 1
    assert build_pdb(_isvc(body)) is None


def test_a_graph_cache_claim_is_mounted_read_write_where_the_runtime_keeps_its_graphs() -> None:
    body = _load(ROOT / "examples/minilm.yaml")
    plain = build_deployment(_isvc(body), replicas=1)["spec"]["template"]["spec"]
    assert not any(v.get("persistentVolumeClaim") for v in plain["volumes"])
    body["spec"].setdefault("server", {})["graphCache"] = {"claimName": "graphs"}
    pod = build_deployment(_isvc(body), replicas=1)["spec"]["template"]["spec"]
    assert {"name": "graph-cache", "persistentVolumeClaim": {"claimName": "graphs"}} in pod["volumes"]
    container = pod["containers"][0]
    assert {"name": "graph-cache", "mountPath": "/var/cache/kubeinfer"} in container["volumeMounts"]
    assert {"name": "KUBEINFER_CACHE_DIR", "value": "/var/cache/kubeinfer"} in container["env"]
    with pytest.raises(pydantic.ValidationError, match="claimName"):
        body["spec"]["server"]["graphCache"] = {"claimName": "Not_A_Name"}
        _isvc(body)


def test_overflow_and_the_text_budget_reach_runtime_yaml_only_when_given() -> None:
    body = _load(ROOT / "examples/minilm.yaml")
    plain = RuntimeConfig.from_yaml(build_configmap(_isvc(body), 0.01)["data"]["runtime.yaml"])
    assert plain.model.overflow is None and plain.limits.max_text_tokens == 512
    body["spec"]["model"].update({"overflow": "chunk", "maxTextTokens": 4096})
    cfg = RuntimeConfig.from_yaml(build_configmap(_isvc(body), 0.01)["data"]["runtime.yaml"])
    assert cfg.model.overflow == "chunk" and cfg.limits.max_text_tokens == 4096
    body["spec"]["model"]["task"] = "reranking"
    with pytest.raises(pydantic.ValidationError, match="chunk applies to text-embedding models"):
        _isvc(body)
    body["spec"]["model"]["task"] = "token-classification"
    with pytest.raises(pydantic.ValidationError, match=r"needs spec\.model\.aggregationStrategy simple"):
        _isvc(body)
    body["spec"]["model"]["aggregationStrategy"] = "first"
    cfg = RuntimeConfig.from_yaml(build_configmap(_isvc(body), 0.01)["data"]["runtime.yaml"])
    assert (cfg.model.overflow, cfg.model.aggregation_strategy) == ("chunk", "first")


def test_the_gate_reaches_runtime_yaml_and_its_texts_are_mounted() -> None:
    body = _load(ROOT / "examples/minilm.yaml")
    gate = {"minCosine": 0.99, "minAgreement": 0.9, "texts": {"name": "my-texts", "key": "held-out.txt"}}
    body["spec"]["quantization"]["gate"] = gate
    isvc = _isvc(body)
    cfg = RuntimeConfig.from_yaml(build_configmap(isvc, 0.01)["data"]["runtime.yaml"])
    assert cfg.quantization.gate is not None
    assert (cfg.quantization.gate.min_cosine, cfg.quantization.gate.min_agreement) == (0.99, 0.9)
    assert cfg.quantization.gate.texts_path == "/mnt/gate/texts.txt"
    pod = build_deployment(isvc, replicas=1)["spec"]["template"]["spec"]
    volume = {"name": "my-texts", "items": [{"key": "held-out.txt", "path": "texts.txt"}]}
    assert {"name": "gate-texts", "configMap": volume} in pod["volumes"]
    mount = {"name": "gate-texts", "mountPath": "/mnt/gate", "readOnly": True}
    assert mount in pod["containers"][0]["volumeMounts"]
    # without the gate, runtime.yaml (and so the pods' hash) reads as before it existed
    del body["spec"]["quantization"]["gate"]
    assert "gate" not in build_configmap(_isvc(body), 0.01)["data"]["runtime.yaml"]


def test_the_token_budget_reaches_runtime_yaml_only_when_given() -> None:
    body = _load(ROOT / "examples/minilm.yaml")
    assert "max_batch_tokens" not in build_configmap(_isvc(body), 0.01)["data"]["runtime.yaml"]
    body["spec"]["batching"]["maxBatchTokens"] = 4096
    isvc = _isvc(body)
    cfg = RuntimeConfig.from_yaml(build_configmap(isvc, 0.01)["data"]["runtime.yaml"])
    assert cfg.batching.max_batch_tokens == 4096
    # a batching setting: hot-reloaded, the pods do not roll
    body["spec"]["batching"]["maxBatchTokens"] = 8192
    assert config_hash(_isvc(body)) == config_hash(isvc)
