"""Where the model (and the calibration file) come from, as pod spec. Pure.

- ``default``, ``/abs/path``: in the runtime image; ``pvc://<claim>/<path>``: the claim mounted
  read-only under :data:`~kubeinfer.operator.builders.common.PVC_MOUNT_ROOT` (``deployment._volumes``).
- ``s3://``, ``https://``, ``http://``, ``hf://``: an init container (:data:`FETCH_CONTAINER`, the
  runtime image's ``kubeinfer-runtime fetch``) downloads the source into an emptyDir
  (:data:`MODEL_VOLUME`, ``sizeLimit`` = ``spec.model.fetch.sizeLimit``), mounted read-write in the
  init container and read-only at :data:`MODEL_DIR` in the runtime container. Credentials reach the
  init container only, as ``secretKeyRef`` environment variables (the scheme's row of
  :mod:`kubeinfer.contract.sources`, ``credentials``): the operator never reads the Secret.
- ``oci://registry/repo:tag|@sha256:...``: an image volume (``volumes[].image``) mounted read-only at
  :data:`MODEL_DIR`; ``spec.model.credentials`` becomes the pod's ``imagePullSecrets``.

``spec.model.caBundle`` (and ``spec.quantization.calibration.caBundle``): the ConfigMap key as a
``configMap`` volume (:data:`MODEL_CA_VOLUME`, :data:`CALIBRATION_CA_VOLUME`) holding one file,
``ca.crt``, mounted read-only in that fetch init container only (:data:`MODEL_CA_DIR`,
:data:`CALIBRATION_CA_DIR`), and ``--ca-file`` naming it: the fetch trusts it besides the image's public
CAs. The runtime container does not see it.

A fetched calibration file (``spec.quantization.calibration.uri`` s3/https/http) gets its own init
container (:data:`CALIBRATION_FETCH_CONTAINER`) and emptyDir, read-only at :data:`CALIBRATION_DIR` in
the runtime container.
"""

from __future__ import annotations

import copy
import posixpath
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from kubeinfer.operator import api

from kubeinfer.contract import sources as contract

#: Where a fetched model or an OCI model image is, in the runtime container (runtime.yaml model.source).
MODEL_DIR = "/mnt/models"
#: Where a fetched calibration file's directory is, in the runtime container.
CALIBRATION_DIR = "/mnt/calibration"
#: The volume of the model: an emptyDir (fetched) or an image volume (oci).
MODEL_VOLUME = "model"
#: The emptyDir of a fetched calibration file.
CALIBRATION_VOLUME = "calibration"
#: The init container that fetches the model.
FETCH_CONTAINER = "fetch"
#: The init container that fetches the calibration file.
CALIBRATION_FETCH_CONTAINER = "fetch-calibration"
#: The init containers that fetch, in the order they run.
FETCH_CONTAINERS = (FETCH_CONTAINER, CALIBRATION_FETCH_CONTAINER)
#: The configMap volume of spec.model.caBundle, mounted in the fetch init container only.
MODEL_CA_VOLUME = "model-ca"
#: The configMap volume of spec.quantization.calibration.caBundle (the calibration fetch's only).
CALIBRATION_CA_VOLUME = "calibration-ca"
#: Where the model's CA bundle is, in the fetch init container (the file :data:`CA_FILE` in it).
MODEL_CA_DIR = "/etc/kubeinfer/model-ca"
#: Where the calibration file's CA bundle is, in its fetch init container.
CALIBRATION_CA_DIR = "/etc/kubeinfer/calibration-ca"
#: The file name the ConfigMap key gets in the CA volume (``items[].path``).
CA_FILE = "ca.crt"
#: Size limit of the calibration file's emptyDir (a text file of samples).
CALIBRATION_SIZE_LIMIT = "1Gi"
#: Resources of a fetch init container: it streams to disk (no file is held in memory). An init
#: container's requests count towards the pod's only as the largest of them and the runtime's sum.
FETCH_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "100m", "memory": "256Mi"},
    "limits": {"cpu": "1", "memory": "1Gi"},
}
#: Pull policy of an OCI model image (use a digest to pin it: a moved tag is not pulled again).
IMAGE_VOLUME_PULL_POLICY = "IfNotPresent"
#: Environment variable of the fetch init container with an https/http source's bearer token.
FETCH_BEARER_TOKEN_ENV = contract.FETCH_BEARER_TOKEN_ENV
#: The files of an ``hf://`` repository fetched by default, by ``spec.model.format``.
DEFAULT_ALLOW_PATTERNS: dict[str, tuple[str, ...]] = {
    "huggingface": ("*.json", "*.txt", "*.safetensors", "tokenizer*", "*.model", "1_Pooling/*"),
    "onnx": ("*.onnx", "*.onnx_data"),
    "pt2": ("*.pt2",),
    "torchscript": ("*.pt", "*.pth"),
}
#: Added to the huggingface defaults on engine onnxruntime.
ONNX_ALLOW_PATTERNS = ("*.onnx", "onnx/*")


@dataclass(frozen=True)
class SourceParts:
    """What a model's and a calibration file's sources add to the pod spec."""

    init_containers: list[dict[str, Any]] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    #: Mounts of the runtime container.
    mounts: list[dict[str, Any]] = field(default_factory=list)
    image_pull_secrets: list[dict[str, str]] = field(default_factory=list)


def escape_expansion(text: str) -> str:
    """``text`` with every ``$`` doubled: the kubelet expands ``$(VAR)`` in a container's args from its
    environment (here, credentials), and turns ``$$`` back into ``$``, so the argument stays literal."""
    return text.replace("$", "$$")


def _seconds(duration: float) -> str:
    """A duration (seconds) as the fetcher's SECONDS argument (``10s`` -> ``"10"``, ``1500ms`` ->
    ``"1.5"``)."""
    return f"{float(duration):g}"


def allow_patterns(spec: api.InferenceServiceSpec) -> list[str]:
    """The ``--allow-pattern`` globs of an ``hf://`` model: ``spec.model.hf.allowPatterns``, else the
    defaults of the format (:data:`DEFAULT_ALLOW_PATTERNS`; huggingface on onnxruntime also
    :data:`ONNX_ALLOW_PATTERNS`)."""
    hf = spec.model.hf
    if hf is not None and hf.allow_patterns:
        return list(hf.allow_patterns)
    patterns = list(DEFAULT_ALLOW_PATTERNS[spec.model.format])
    if spec.model.format == "huggingface" and spec.runtime.engine == "onnxruntime":
        patterns.extend(ONNX_ALLOW_PATTERNS)
    return patterns


def _source_options(
    source: api.ModelSpec | api.CalibrationSpec, patterns: list[str] | None = None
) -> list[str]:
    """The fetcher's optional arguments of a source, in the contract's order (only those set)."""
    out: list[str] = []
    if source.sha256:
        out += ["--sha256", source.sha256.lower()]
    s3 = source.s3
    if s3 is not None:
        for flag, value in (
            ("--s3-endpoint", s3.endpoint),
            ("--s3-region", s3.region),
            ("--s3-addressing-style", s3.addressing_style),
        ):
            if value is not None:
                out += [flag, value]
    hf = source.hf if isinstance(source, api.ModelSpec) else None
    if hf is not None and hf.endpoint is not None:
        out += ["--hf-endpoint", hf.endpoint]
    for pattern in patterns or []:
        out += ["--allow-pattern", pattern]
    if source.allow_insecure_http:
        out.append("--allow-http")
    if source.ca_bundle is not None:
        ca_dir = MODEL_CA_DIR if isinstance(source, api.ModelSpec) else CALIBRATION_CA_DIR
        out += ["--ca-file", f"{ca_dir}/{CA_FILE}"]
    return out


def ca_volume(name: str, bundle: api.CaBundleSpec) -> dict[str, Any]:
    """The ``configMap`` volume ``name`` holding ``bundle``'s key alone, as the file :data:`CA_FILE`."""
    return {
        "name": name,
        "configMap": {"name": bundle.config_map_name, "items": [{"key": bundle.key, "path": CA_FILE}]},
    }


def _ca_parts(bundle: api.CaBundleSpec | None, name: str, mount_path: str) -> tuple[list[Any], list[Any]]:
    """The CA bundle's volume and its read-only mount in the fetch init container (none without one)."""
    if bundle is None:
        return [], []
    return [ca_volume(name, bundle)], [{"name": name, "mountPath": mount_path, "readOnly": True}]


def fetch_args(
    source: api.ModelSpec | api.CalibrationSpec,
    dest: str,
    limits: api.FetchSpec,
    size_limit: str,
    patterns: list[str] | None = None,
) -> list[str]:
    """``args`` of a fetch init container (``command: [kubeinfer-runtime]``): ``fetch --source URI --dest
    DIR``, the source's options, then the limits (always given: the pod spec says what runs). Every
    argument from the spec has its ``$`` escaped (:func:`escape_expansion`)."""
    args = ["fetch", "--source", source.uri, "--dest", dest, *_source_options(source, patterns)]
    args += [
        "--size-limit",
        str(int(api.cpu_cores(size_limit))),
        "--connect-timeout",
        _seconds(limits.connect_timeout),
        "--stall-timeout",
        _seconds(limits.stall_timeout),
        "--retries",
        str(limits.retries),
    ]
    return [escape_expansion(a) for a in args]


def credential_env(uri: str, credentials: api.CredentialsSpec | None) -> list[dict[str, Any]]:
    """The init container's credential variables for ``uri``'s scheme (its registry row's
    ``credentials``), each a ``secretKeyRef`` into ``credentials.secretName``; none without credentials
    (s3: boto3's default chain, e.g. IRSA)."""
    row = contract.scheme_of(uri)
    if credentials is None or row is None:
        return []
    return [
        {
            "name": c.env,
            "valueFrom": {
                "secretKeyRef": {"name": credentials.secret_name, "key": c.key, "optional": c.optional}
            },
        }
        for c in row.credentials
    ]


def fetch_container(
    spec: api.InferenceServiceSpec,
    name: str,
    args: list[str],
    env: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    security_context: dict[str, Any],
) -> dict[str, Any]:
    """A fetch init container: the runtime image (and its pull policy), ``kubeinfer-runtime`` with
    ``args``, the runtime container's security context, :data:`FETCH_RESOURCES`, and
    ``terminationMessagePolicy: File`` (its one-line cause, never a log tail, reaches the status)."""
    container: dict[str, Any] = {
        "name": name,
        "image": spec.runtime.image,
        "command": ["kubeinfer-runtime"],
        "args": args,
        "resources": copy.deepcopy(FETCH_RESOURCES),
        "securityContext": copy.deepcopy(security_context),
        "volumeMounts": copy.deepcopy(mounts),
        "terminationMessagePolicy": "File",
    }
    if env:
        container["env"] = env
    if spec.runtime.image_pull_policy is not None:
        container["imagePullPolicy"] = spec.runtime.image_pull_policy
    return container


def calibration_file_name(uri: str) -> str:
    """The file name a fetched calibration file keeps, as the fetcher names it: the last segment of the
    S3 key, or of the URL path percent-decoded (``s3://b/data/calib.txt`` -> ``calib.txt``,
    ``https://h/d/my%20texts.txt?sig=x`` -> ``my texts.txt``)."""
    if api.uri_scheme(uri) == "s3":
        return posixpath.basename(uri.split("://", 1)[1].split("/", 1)[1])
    return unquote(posixpath.basename(urlsplit(uri).path))


def model_source_path(uri: str, container_path: str) -> str:
    """runtime.yaml ``model.source`` for ``uri``: :data:`MODEL_DIR` for fetched and oci sources, else
    ``container_path`` (the path or PVC mount the caller computed)."""
    return MODEL_DIR if api.is_fetched(uri) or api.oci_reference(uri) is not None else container_path


def calibration_source_path(uri: str, container_path: str) -> str:
    """runtime.yaml ``quantization.calibration_path`` for ``uri``: the fetched file under
    :data:`CALIBRATION_DIR` (:func:`calibration_file_name`), else ``container_path``."""
    return f"{CALIBRATION_DIR}/{calibration_file_name(uri)}" if api.is_fetched(uri) else container_path


def _model_parts(
    spec: api.InferenceServiceSpec, security_context: dict[str, Any], tmp_mount: dict[str, Any]
) -> SourceParts:
    model = spec.model
    reference = api.oci_reference(model.uri)
    if reference is not None:
        volume = {
            "name": MODEL_VOLUME,
            "image": {"reference": reference, "pullPolicy": IMAGE_VOLUME_PULL_POLICY},
        }
        secrets = [{"name": model.credentials.secret_name}] if model.credentials is not None else []
        return SourceParts(
            volumes=[volume],
            mounts=[{"name": MODEL_VOLUME, "mountPath": MODEL_DIR, "readOnly": True}],
            image_pull_secrets=secrets,
        )
    if not api.is_fetched(model.uri):
        return SourceParts()
    limits = model.fetch or api.FetchSpec()
    patterns = allow_patterns(spec) if api.uri_scheme(model.uri) == "hf" else None
    ca_volumes, ca_mounts = _ca_parts(model.ca_bundle, MODEL_CA_VOLUME, MODEL_CA_DIR)
    container = fetch_container(
        spec,
        FETCH_CONTAINER,
        fetch_args(model, MODEL_DIR, limits, limits.size_limit, patterns),
        credential_env(model.uri, model.credentials),
        [{"name": MODEL_VOLUME, "mountPath": MODEL_DIR}, tmp_mount, *ca_mounts],
        security_context,
    )
    return SourceParts(
        init_containers=[container],
        volumes=[{"name": MODEL_VOLUME, "emptyDir": {"sizeLimit": limits.size_limit}}, *ca_volumes],
        mounts=[{"name": MODEL_VOLUME, "mountPath": MODEL_DIR, "readOnly": True}],
    )


def _calibration_parts(
    spec: api.InferenceServiceSpec, security_context: dict[str, Any], tmp_mount: dict[str, Any]
) -> SourceParts:
    calibration = spec.quantization.calibration
    if calibration is None or not api.is_fetched(calibration.uri):
        return SourceParts()
    ca_volumes, ca_mounts = _ca_parts(calibration.ca_bundle, CALIBRATION_CA_VOLUME, CALIBRATION_CA_DIR)
    container = fetch_container(
        spec,
        CALIBRATION_FETCH_CONTAINER,
        fetch_args(calibration, CALIBRATION_DIR, api.FetchSpec(), CALIBRATION_SIZE_LIMIT),
        credential_env(calibration.uri, calibration.credentials),
        [{"name": CALIBRATION_VOLUME, "mountPath": CALIBRATION_DIR}, tmp_mount, *ca_mounts],
        security_context,
    )
    return SourceParts(
        init_containers=[container],
        volumes=[
            {"name": CALIBRATION_VOLUME, "emptyDir": {"sizeLimit": CALIBRATION_SIZE_LIMIT}},
            *ca_volumes,
        ],
        mounts=[{"name": CALIBRATION_VOLUME, "mountPath": CALIBRATION_DIR, "readOnly": True}],
    )


def source_parts(
    spec: api.InferenceServiceSpec, security_context: dict[str, Any], tmp_mount: dict[str, Any]
) -> SourceParts:
    """The init containers, volumes, runtime-container mounts and image pull secrets of the model's and
    the calibration file's sources (none for ``default``, paths and ``pvc://``). ``security_context``:
    the containers' security context; ``tmp_mount``: the writable /tmp (HOME) the fetchers share with
    the runtime."""
    parts = [
        _model_parts(spec, security_context, tmp_mount),
        _calibration_parts(spec, security_context, tmp_mount),
    ]
    return SourceParts(
        init_containers=[c for p in parts for c in p.init_containers],
        volumes=[v for p in parts for v in p.volumes],
        mounts=[m for p in parts for m in p.mounts],
        image_pull_secrets=[s for p in parts for s in p.image_pull_secrets],
    )
