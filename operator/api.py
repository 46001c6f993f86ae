"""The InferenceService API: pydantic models of ``spec`` and ``status``.

``kubeinfer.io/v1alpha1``, kind ``InferenceService`` (plural ``inferenceservices``, short name
``kisvc``), namespaced. Field names are camelCase in YAML/JSON (pydantic alias generator); in Python
they are snake_case. Parse a custom resource with :meth:`InferenceServiceSpec.from_k8s` and
:meth:`InferenceServiceStatus.from_k8s`; render with ``model_dump(by_alias=True, exclude_none=True)``.

The CRD's ``openAPIV3Schema`` is generated from these models by ``kubeinfer.operator.crdgen``
(``make crds``). Rules that span fields are written twice, on purpose: as CEL
``x-kubernetes-validations`` (so ``kubectl apply`` refuses a bad manifest, message naming the field)
and as pydantic validators (so the operator and unit tests see the same rules).

Durations are Go/Kubernetes duration strings (``"10ms"``, ``"1.5s"``, ``"5m"``, ``"1h30m"``): the
CRD declares them ``type: string`` with :data:`DURATION_PATTERN`, CEL's ``duration()`` parses them,
and :func:`parse_duration` converts them to float seconds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from kubeinfer.runtime.config import (
    BUNDLED_MODEL,
    AggregationStrategy,
    Datatype,
    Device,
    Engine,
    ModelFormat,
    Quantization,
    Task,
)
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from kubeinfer import __version__

GROUP = "kubeinfer.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ("kisvc",)

#: Server-side-apply field manager of the operator (Deployment, Service, ConfigMap, PDB, status).
FIELD_MANAGER = "kubeinfer"
#: Field manager of the autoscaler (``Deployment.spec.replicas`` through the scale subresource).
AUTOSCALER_FIELD_MANAGER = "kubeinfer-autoscaler"
#: Default runtime image: the runtime image of this release (tag = the package version).
DEFAULT_IMAGE = f"ghcr.io/kubeinfer/runtime:{__version__}"
#: Port of the runtime's Open Inference Protocol v2 endpoint and of its ``/metrics``.
RUNTIME_PORT = 8080
#: Default port of the runtime's gRPC service (``spec.server.grpcPort``).
RUNTIME_GRPC_PORT = 8081
#: Served model name when ``model.uri`` is the bundled default and ``model.name`` is unset.
DEFAULT_MODEL_NAME = "minilm"

# --- durations -------------------------------------------------------------------------------------

#: A Go duration (``time.ParseDuration``) without sign: one or more ``<number><unit>`` groups.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"
_DURATION_RE = re.compile(DURATION_PATTERN)
_DURATION_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Convert a Go duration string to float seconds.

    ``"10ms"`` → 0.01, ``"1.5s"`` → 1.5, ``"1h30m"`` → 5400.0. Units: ns, us, ms, s, m, h (the
    units of Go's ``time.ParseDuration``, which CEL's ``duration()`` also uses; ``µs`` excepted).

    Raises:
        ValueError: ``text`` is not a duration (the message quotes it).
    """
    if not isinstance(text, str) or not _DURATION_RE.match(text):
        raise ValueError(
            f"invalid duration {text!r}: expected e.g. '10ms', '1.5s', '5m' (units ns|us|ms|s|m|h)"
        )
    return sum(float(num) * _UNIT_SECONDS[unit] for num, unit in _DURATION_PART_RE.findall(text))


def format_duration(seconds: float, *, significant: int | None = None) -> str:
    """Render float seconds as the shortest exact-enough Go duration string.

    Sub-second values are rendered in ms (``0.005`` → ``"5ms"``, ``0.0125`` → ``"12.5ms"``), values
    below 1 ms in us, others in s (``90.0`` → ``"90s"``). Precision: 3 decimals of the unit.
    ``parse_duration(format_duration(x))`` equals ``x`` to within 1 ns. ``significant``: round
    ``seconds`` to that many significant digits first, for a measured value that a person reads
    (``0.023353``, 3 → ``"23.4ms"``).

    Raises:
        ValueError: ``seconds`` is negative, NaN or infinite.
    """
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"duration must be finite and >= 0, got {seconds!r}")
    if significant is not None:
        seconds = float(f"{seconds:.{significant}g}")
    if seconds == 0:
        return "0s"
    if seconds < 1e-3:
        value, unit = seconds * 1e6, "us"
    elif seconds < 1.0:
        value, unit = seconds * 1e3, "ms"
    else:
        value, unit = seconds, "s"
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    if text == "0":  # below 1 ns resolution of the chosen unit's 3 decimals
        text, unit = f"{seconds * 1e9:.0f}", "ns"
    return f"{text}{unit}"


def _check_duration(text: str) -> str:
    parse_duration(text)
    return text


#: A duration string field (``type: string`` + ``pattern`` in the CRD).
Duration = Annotated[
    str,
    StringConstraints(pattern=DURATION_PATTERN, max_length=64),
    AfterValidator(_check_duration),
]

#: A positive Kubernetes resource quantity (``"2"``, ``"500m"``, ``"8Gi"``, ``"1.5"``, ``"1e3"``): the
#: quantity grammar of apimachinery's ``resource.Quantity`` (number, then a binary-SI, decimal-SI or
#: exponent suffix) without a sign and with at least one non-zero digit. apimachinery's own loose
#: pre-check ``^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$`` let ``-1`` (422 on the Deployment),
#: ``0`` / ``.`` (a pod with no memory) and ``1.2.3`` (a 500 from the API server on every retry) through.
QUANTITY_PATTERN = (
    r"^([0-9]*[1-9][0-9]*(\.[0-9]*)?|[0-9]*\.[0-9]*[1-9][0-9]*)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]{1,2})?$"
)
Quantity = Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN, max_length=64)]
_SUFFIX_SCALE = {
    "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
}  # fmt: skip
#: Largest default of ``server.httpWorkers`` (``InferenceServiceSpec.http_workers_in_force``).
MAX_DEFAULT_HTTP_WORKERS = 8


def cpu_cores(quantity: str) -> float:
    """A ``Quantity`` (``QUANTITY_PATTERN``) as a number: ``"500m"`` -> 0.5, ``"2"`` -> 2.0, ``"1e3"`` ->
    1000.0 (for CPUs: cores; for bytes, ``"64Mi"`` -> 67108864.0). Raises ``ValueError`` for a string
    outside the pattern."""
    match = re.fullmatch(QUANTITY_PATTERN, quantity)
    if match is None:
        raise ValueError(f"not a resource quantity: {quantity!r}")
    suffix = match.group(3) or ""
    number = quantity[: len(quantity) - len(suffix)]
    if suffix[:1] in ("e", "E"):
        return float(number) * 10.0 ** int(suffix[1:])
    return float(number) * _SUFFIX_SCALE.get(suffix, 1.0)


#: A DNS subdomain (RFC 1123), the name of a Secret or a ServiceAccount.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

# --- where a model comes from ----------------------------------------------------------------------
# The URI grammars, one per scheme. The CRD's pattern is their alternation (RE2 and Python both read
# them); pydantic checks the same pattern. ``$`` is allowed in paths: the fetch init container's
# arguments escape it (``$$``), so that the kubelet expands no ``$(VAR)`` of its environment into them.

_PVC = r"pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/.+"
#: An S3 bucket name (3-63 of lowercase letters, digits, dots, hyphens), then an optional key or prefix.
_S3 = r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?"
#: An http(s) URL of a file without userinfo (no ``user:password@``: a credential would be in the spec
#: and in the pod's arguments; the bearer token comes from spec.model.credentials): its path ends in a
#: file name that is not hidden (the fetch names the file after it), no ``@`` before the query.
_HTTP = r"https?://[^/?#@\s]+/([^?#@\s]*/)?[^/?#@\s.][^/?#@\s]*([?#][^\s]*)?"
#: ``hf://org/repo`` with an optional ``@revision`` (a branch, tag or commit).
_HF = r"hf://[A-Za-z0-9][-A-Za-z0-9_.]{0,95}/[A-Za-z0-9][-A-Za-z0-9_.]{0,95}(@[A-Za-z0-9][-A-Za-z0-9_./]{0,254})?"
#: ``oci://registry/repo:tag`` or ``oci://registry/repo@sha256:<64 hex>``: a registry host (with a dot or
#: a port, or localhost: a bare first component would be read as a Docker Hub namespace) and a tag or a
#: digest (no implicit ``latest``).
_OCI = (
    r"oci://((localhost|[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)+)(:[0-9]{1,5})?|[a-zA-Z0-9-]+:[0-9]{1,5})"
    r"(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})"
)
#: ``model.uri``: the bundled model, an absolute path in the image, ``pvc://<claim>/<path>``, a source
#: the fetch init container downloads (``s3://``, ``https://``, ``http://``, ``hf://``) or an OCI image
#: mounted as an image volume (``oci://``).
MODEL_URI_PATTERN = rf"^(default|/.*|{_PVC}|{_S3}|{_HTTP}|{_HF}|{_OCI})$"
#: A data reference (calibration data, one file): an absolute path in the image, ``pvc://<claim>/<path>``,
#: or a file fetched from ``s3://bucket/key`` or ``https://host/path`` (ending in a file name; ``http://``
#: with ``allowInsecureHttp``).
DATA_URI_PATTERN = rf"^(/.*|{_PVC}|s3://[a-z0-9][a-z0-9.-]{{1,61}}[a-z0-9]/(.*/)?[^/]+|https?://[^/?#@\s]+/([^?#\s]*/)?[^/?#\s]+([?#][^\s]*)?)$"
_PVC_RE = re.compile(r"^pvc://([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)/(.+)$")
#: Schemes the runtime's ``fetch`` init container downloads into an emptyDir (``kubeinfer-runtime fetch``).
FETCHED_SCHEMES = ("s3", "https", "http", "hf")
#: CEL: the URI is one the fetch init container downloads.
_CEL_FETCHED = r"self.uri.matches('^(s3|https?|hf)://')"
#: A SHA-256 digest, hex (of a single file or archive the fetch init container downloads).
SHA256_PATTERN = r"^[0-9a-fA-F]{64}$"
#: An http(s) endpoint URL (an S3 or Hugging Face endpoint), without userinfo.
ENDPOINT_PATTERN = r"^https?://[^/?#@\s]+(/[^\s]*)?$"


def parse_pvc_uri(uri: str) -> tuple[str, str] | None:
    """Split ``pvc://<claim>/<path>`` into ``(claim, path)``; ``None`` for any other URI."""
    m = _PVC_RE.match(uri)
    return (m.group(1), m.group(2)) if m else None


def uri_scheme(uri: str) -> str:
    """The scheme of a model or data URI: ``s3``, ``https``, ``http``, ``hf``, ``oci``, ``pvc``; ``""`` for
    ``default`` and an absolute path."""
    scheme, sep, _ = uri.partition("://")
    return scheme if sep else ""


def is_fetched(uri: str) -> bool:
    """Whether the fetch init container downloads ``uri`` (:data:`FETCHED_SCHEMES`)."""
    return uri_scheme(uri) in FETCHED_SCHEMES


def oci_reference(uri: str) -> str | None:
    """The image reference of ``oci://<reference>`` (``registry/repo:tag``); ``None`` for another URI."""
    return uri.removeprefix("oci://") if uri_scheme(uri) == "oci" else None


# --- base classes ----------------------------------------------------------------------------------


class _Spec(BaseModel):
    """Spec models: camelCase aliases, unknown fields refused (the API server prunes them anyway)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class _Status(BaseModel):
    """Status models: camelCase aliases, unknown fields ignored (other writers may add fields)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


def _if_durations(rule: str, *fields: str) -> str:
    """The CEL ``rule`` guarded so that it runs only once every duration field in ``fields`` (names
    under ``self``) matched :data:`DURATION_PATTERN`: a bad value then gets the pattern's error alone,
    not also CEL's "type conversion error from 'string' to 'google.protobuf.Duration'"."""
    guard = " && ".join(f"self.{f}.matches(r'{DURATION_PATTERN}')" for f in fields)
    return f"!({guard}) || ({rule})"


def _cel(rule: str, message: str, field_path: str | None = None, reason: str | None = None) -> JsonDict:
    """One ``x-kubernetes-validations`` entry (``fieldPath``/``reason`` need Kubernetes >= 1.28)."""
    out: JsonDict = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    if reason:
        out["reason"] = reason
    return out


# --- spec ------------------------------------------------------------------------------------------


class TensorSpec(_Spec):
    """A declared model input or output (TorchScript: required; ONNX, pt2: refines what the model declares).
    ``shape``: -1 for a variable dimension."""

    name: str = Field(min_length=1, max_length=128)
    datatype: Datatype
    shape: list[int] = Field(min_length=1, max_length=8)


class S3Spec(_Spec):
    """How to reach an ``s3://`` source (an S3-compatible store: AWS S3, MinIO, ...)."""

    endpoint: str | None = Field(
        default=None,
        max_length=512,
        pattern=ENDPOINT_PATTERN,
        description="Endpoint URL, e.g. https://minio.storage.svc:9000. Unset: AWS S3 of the region. "
        "With http:// the objects travel unencrypted (requests are still signed: the secret key is not "
        "sent).",
    )
    region: str | None = Field(
        default=None, max_length=64, pattern=r"^[a-z0-9][-a-z0-9]*$", description="e.g. eu-west-1."
    )
    addressing_style: Literal["path", "virtual", "auto"] | None = Field(
        default=None,
        description="path (https://endpoint/bucket/key, usual for MinIO) | virtual "
        "(https://bucket.endpoint/key) | auto. Unset: the client's default (auto).",
    )


class HuggingFaceSpec(_Spec):
    """How to fetch an ``hf://org/repo[@revision]`` source (a Hugging Face Hub repository snapshot)."""

    endpoint: str | None = Field(
        default=None,
        max_length=512,
        pattern=ENDPOINT_PATTERN,
        description="Hub endpoint (a mirror or a private Hub). Unset: https://huggingface.co. With "
        "http:// the files and the HF_TOKEN travel unencrypted.",
    )
    allow_patterns: list[Annotated[str, StringConstraints(min_length=1, max_length=256)]] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="Globs of the repository files to download. Unset: by spec.model.format (huggingface: "
        "*.json, *.txt, *.safetensors, tokenizer*, *.model, 1_Pooling/*, and *.onnx, onnx/* on engine "
        "onnxruntime; onnx: *.onnx, *.onnx_data; pt2: *.pt2; torchscript: *.pt, *.pth). Pickled *.bin "
        "weights only when listed here.",
    )


class CredentialsSpec(_Spec):
    """The Secret (in the InferenceService's namespace) with a source's credentials. The operator never
    reads it: the pod spec references its keys, the kubelet reads them for the pod."""

    secret_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="s3: keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optional AWS_SESSION_TOKEN (no "
        "credentials: the default chain, e.g. IRSA / workload identity with spec.serviceAccountName); "
        "hf: HF_TOKEN; https/http: BEARER_TOKEN (sent as 'Authorization: Bearer'); oci: a "
        "kubernetes.io/dockerconfigjson Secret (the pod's imagePullSecrets). The pod does not start "
        "until the Secret and its keys exist.",
    )


#: A ConfigMap key (``[-._a-zA-Z0-9]+``, as Kubernetes validates it).
CONFIGMAP_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"


class CaBundleSpec(_Spec):
    """A ConfigMap key (in the InferenceService's namespace) holding the PEM CA certificates the fetch
    trusts besides the runtime image's public CAs: a private CA of an https:// server, an S3 endpoint
    or a hub. Only the fetch init container mounts it (read-only); the operator never reads it."""

    config_map_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="The ConfigMap (e.g. one that trust-manager or the cluster's CA injection fills). The "
        "pod does not start until it and the key exist.",
    )
    key: str = Field(
        default="ca.crt",
        min_length=1,
        max_length=253,
        pattern=CONFIGMAP_KEY_PATTERN,
        description="The key of the PEM bundle in the ConfigMap.",
    )


class FetchSpec(_Spec):
    """Limits of the fetch init container (``s3://``, ``https://``, ``http://``, ``hf://`` models)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    _if_durations("duration(self.connectTimeout) > duration('0s')", "connectTimeout"),
                    "spec.model.fetch.connectTimeout must be greater than 0",
                    ".connectTimeout",
                    "FieldValueInvalid",
                ),
                _cel(
                    _if_durations("duration(self.stallTimeout) > duration('0s')", "stallTimeout"),
                    "spec.model.fetch.stallTimeout must be greater than 0",
                    ".stallTimeout",
                    "FieldValueInvalid",
                ),
            ]
        }
    )

    size_limit: Quantity = Field(
        default="20Gi",
        description="Size limit of the emptyDir the model is fetched into (node disk): a source that "
        "states a bigger total size is refused before the download starts, and a pod whose emptyDir "
        "grows past it is evicted.",
    )
    connect_timeout: Duration = Field(default="10s", description="Timeout of one connection attempt.")
    stall_timeout: Duration = Field(
        default="60s", description="An attempt that receives no byte for this long fails (and is retried)."
    )
    retries: int = Field(
        default=3,
        ge=0,
        le=10,
        description="Retries of a transient failure (connection error, timeout, 5xx, 429), with "
        "exponential back-off from 1 s; a 4xx, a checksum mismatch or a missing object fails at once.",
    )

    @model_validator(mode="after")
    def _rules(self) -> FetchSpec:
        if parse_duration(self.connect_timeout) <= 0:
            raise ValueError("spec.model.fetch.connectTimeout must be greater than 0")
        if parse_duration(self.stall_timeout) <= 0:
            raise ValueError("spec.model.fetch.stallTimeout must be greater than 0")
        return self


#: Where each setting of a source may be set: CEL over ``self.uri``, the schemes it means, and the words
#: of the refusal (``{f}``: the source object's field, e.g. ``spec.model``; ``{fetched}``,
#: ``{credentialed}``: its schemes, :data:`_SOURCE_WORDS`).
_SOURCE_SETTINGS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "sha256": (
        r"self.uri.matches('^(s3|https?)://')",
        ("s3", "https", "http"),
        "applies only when {f}.uri is s3://, https:// or http:// (a single file or archive; pin an "
        "hf:// model by its revision instead)",
    ),
    "s3": ("self.uri.startsWith('s3://')", ("s3",), "applies only when {f}.uri is s3://"),
    "hf": ("self.uri.startsWith('hf://')", ("hf",), "applies only when {f}.uri is hf://"),
    "credentials": (
        r"self.uri.matches('^(s3|https?|hf|oci)://')",
        (*FETCHED_SCHEMES, "oci"),
        "applies only when {f}.uri is {credentialed} (not pvc://, a path or default)",
    ),
    "fetch": (
        _CEL_FETCHED,
        FETCHED_SCHEMES,
        "applies only when {f}.uri is {fetched} (downloaded by the fetch init container)",
    ),
    "caBundle": (
        r"self.uri.matches('^(s3|https|hf)://')",
        ("s3", "https", "hf"),
        "applies only when {f}.uri is {tls} (the fetch init container's TLS; an oci:// image is pulled "
        "with the node's CAs, and plain http:// has no TLS)",
    ),
}
#: The schemes each source object takes, in the words of its refusals.
_SOURCE_WORDS: dict[str, dict[str, str]] = {
    "spec.model": {
        "fetched": "s3://, https://, http:// or hf://",
        "credentialed": "s3://, https://, http://, hf:// or oci://",
        "tls": "s3://, https:// or hf://",
    },
    "spec.quantization.calibration": {
        "fetched": "s3://, https:// or http://",
        "credentialed": "s3://, https:// or http://",
        "tls": "s3:// or https://",
    },
}


def _refusal(field: str, name: str) -> str:
    """The message refusing ``field``.``name`` (:data:`_SOURCE_SETTINGS`) where the uri does not take it."""
    words = _SOURCE_SETTINGS[name][2].format(f=field, **_SOURCE_WORDS[field])
    return f"{field}.{name} {words}"


def _http_refusal(field: str) -> str:
    return (
        f"{field}.allowInsecureHttp must be true for an http:// {field}.uri (the data travels unencrypted "
        "and unauthenticated); prefer https://"
    )


def _source_rules(field: str, settings: tuple[str, ...]) -> list[JsonDict]:
    """The CEL rules of a source object at ``field`` (``spec.model``): each of ``settings`` only where its
    ``uri`` takes it (:data:`_SOURCE_SETTINGS`), and plain http only with ``allowInsecureHttp``."""
    rules = [
        _cel(
            f"!has(self.{name}) || {cel}",
            _refusal(field, name),
            f".{name}",
            "FieldValueForbidden",
        )
        for name, cel in ((n, _SOURCE_SETTINGS[n][0]) for n in settings)
    ]
    rules.append(
        _cel(
            "!self.uri.startsWith('http://') || self.allowInsecureHttp",
            _http_refusal(field),
            ".uri",
            "FieldValueForbidden",
        )
    )
    return rules


def _check_source(field: str, uri: str, settings: Mapping[str, object], insecure_ok: bool) -> None:
    """The pydantic side of :func:`_source_rules`. Raises ``ValueError`` (the message names the field)."""
    scheme = uri_scheme(uri)
    for name, value in settings.items():
        if value is not None and scheme not in _SOURCE_SETTINGS[name][1]:
            raise ValueError(_refusal(field, name))
    if not insecure_ok and scheme == "http":
        raise ValueError(_http_refusal(field))


#: The settings of each source object, by their names in the API (:data:`_SOURCE_SETTINGS`).
_MODEL_SETTINGS = ("sha256", "s3", "hf", "credentials", "fetch", "caBundle")
_CALIBRATION_SETTINGS = ("sha256", "s3", "credentials", "caBundle")


def _settings_of(source: BaseModel, names: tuple[str, ...]) -> dict[str, object]:
    """The values of ``source``'s settings ``names`` (API names, e.g. ``caBundle``), by API name."""
    return {
        field.alias or attr: getattr(source, attr)
        for attr, field in type(source).model_fields.items()
        if (field.alias or attr) in names
    }


class ModelSpec(_Spec):
    """Where the model comes from and its format."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.format != 'torchscript' || (has(self.inputs) && size(self.inputs) > 0 && "
                    "has(self.outputs) && size(self.outputs) > 0)",
                    "spec.model.inputs and spec.model.outputs are required when spec.model.format is "
                    "torchscript",
                    ".inputs",
                    "FieldValueRequired",
                ),
                _cel(
                    "self.format != 'torchscript' || self.uri != 'default'",
                    "spec.model.uri: the bundled default model is huggingface, not torchscript",
                    ".uri",
                    "FieldValueInvalid",
                ),
                _cel(
                    "self.format != 'onnx' || self.uri != 'default'",
                    "spec.model.uri: the bundled default model is huggingface, not onnx",
                    ".uri",
                    "FieldValueInvalid",
                ),
                _cel(
                    "self.format != 'pt2' || self.uri != 'default'",
                    "spec.model.uri: the bundled default model is huggingface, not pt2",
                    ".uri",
                    "FieldValueInvalid",
                ),
                _cel(
                    "!has(self.task) || self.format == 'huggingface'",
                    "spec.model.task applies to huggingface models only",
                    ".task",
                    "FieldValueInvalid",
                ),
                _cel(
                    "!has(self.aggregationStrategy) || (self.format == 'huggingface' && "
                    "(!has(self.task) || self.task == 'token-classification'))",
                    "spec.model.aggregationStrategy applies to huggingface token classifiers only "
                    "(spec.model.task token-classification, or unset and detected)",
                    ".aggregationStrategy",
                    "FieldValueInvalid",
                ),
                *_source_rules("spec.model", _MODEL_SETTINGS),
            ]
        }
    )

    uri: str = Field(
        default=BUNDLED_MODEL,
        pattern=MODEL_URI_PATTERN,
        max_length=1024,
        description="'default' (bundled all-MiniLM-L6-v2), an absolute path inside the runtime image, "
        "pvc://<claim>/<path> (mounted read-only); fetched by an init container into an emptyDir at "
        "/mnt/models: s3://bucket/key-or-prefix/, https://host/path (a file, or a .tar, .tar.gz, .tgz, "
        ".zip archive unpacked), http://... (with allowInsecureHttp), hf://org/repo[@revision]; or "
        "oci://registry/repo:tag | oci://registry/repo@sha256:<digest>, an OCI image mounted read-only "
        "at /mnt/models as an image volume (Kubernetes >= 1.33 with ImageVolume).",
    )
    format: ModelFormat = Field(
        default="huggingface",
        description="huggingface | torchscript (deprecated: torch deprecates TorchScript; export to pt2) | "
        "onnx (a .onnx file or its directory, run on ONNX Runtime; its tensors are read from the model) | "
        "pt2 (a torch.export program saved by torch.export.save, or an AOTInductor package, run on torch; "
        "its tensors are read from the program)",
    )
    task: Task | None = Field(
        default=None,
        description="huggingface only: text-embedding (text -> embedding), text-classification (text -> "
        "label, score, logits), token-classification (text -> entities with character offsets, as the "
        "transformers pipeline aggregates them) or reranking (query, text -> score, and POST /v1/rerank). "
        "Unset: detected from the model's config.json (*ForSequenceClassification: reranking with one "
        "label, else text-classification; *ForTokenClassification: token-classification; otherwise "
        "text-embedding).",
    )
    aggregation_strategy: AggregationStrategy | None = Field(
        default=None,
        description="token-classification only: how token labels become entities when a request sends "
        "no aggregation_strategy input: none | simple | first | average | max, as the transformers "
        "pipeline's aggregation_strategy. Unset: none, the pipeline's default.",
    )
    name: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$",
        max_length=63,
        description="Served model name (v2 protocol). Default: 'minilm' for the bundled model, else "
        "metadata.name.",
    )
    inputs: list[TensorSpec] = Field(
        default_factory=list,
        max_length=16,
        description="TorchScript: required. ONNX, pt2: optional, refines the model's own (same names and "
        "datatypes); required for an AOTInductor package without its program.",
    )
    outputs: list[TensorSpec] = Field(
        default_factory=list,
        max_length=16,
        description="TorchScript: required. ONNX, pt2: optional, refines the model's own (same names and "
        "datatypes); required for an AOTInductor package without its program.",
    )
    sha256: str | None = Field(
        default=None,
        pattern=SHA256_PATTERN,
        description="SHA-256 (hex) of the single file or archive fetched (s3, https, http; an hf:// "
        "model is pinned by its revision): a mismatch fails the fetch.",
    )
    allow_insecure_http: bool = Field(
        default=False,
        description="Allow an http:// uri: the model (and a bearer token) travel unencrypted; a sha256 "
        "at least detects a changed file.",
    )
    s3: S3Spec | None = Field(default=None, description="s3:// only: endpoint, region, addressing style.")
    hf: HuggingFaceSpec | None = Field(default=None, description="hf:// only: endpoint, allowPatterns.")
    credentials: CredentialsSpec | None = Field(
        default=None, description="The Secret with the source's credentials (keys per scheme)."
    )
    fetch: FetchSpec | None = Field(
        default=None,
        description="Limits of the fetch init container (size, timeouts, retries); unset: their defaults.",
    )
    ca_bundle: CaBundleSpec | None = Field(
        default=None,
        description="s3://, https://, hf:// only: a ConfigMap key with the PEM CA certificates of a "
        "private CA (an on-prem MinIO, an internal artifact server or hub), trusted by the fetch besides "
        "the public CAs. Unset: the public CAs of the runtime image only.",
    )

    @model_validator(mode="after")
    def _rules(self) -> ModelSpec:
        settings = _settings_of(self, _MODEL_SETTINGS)
        _check_source("spec.model", self.uri, settings, self.allow_insecure_http)
        if self.format == "torchscript" and (not self.inputs or not self.outputs):
            raise ValueError(
                "spec.model.inputs and spec.model.outputs are required when spec.model.format is torchscript"
            )
        if self.format in ("torchscript", "onnx", "pt2") and self.uri == BUNDLED_MODEL:
            raise ValueError(f"spec.model.uri: the bundled default model is huggingface, not {self.format}")
        if self.task is not None and self.format != "huggingface":
            raise ValueError("spec.model.task applies to huggingface models only")
        if self.aggregation_strategy is not None and (
            self.format != "huggingface" or self.task not in (None, "token-classification")
        ):
            raise ValueError(
                "spec.model.aggregationStrategy applies to huggingface token classifiers only "
                "(spec.model.task token-classification, or unset and detected)"
            )
        return self


class CalibrationSpec(_Spec):
    """Calibration data for int8-static: one file, one text sample per line."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *_source_rules("spec.quantization.calibration", _CALIBRATION_SETTINGS)
            ]
        }
    )

    uri: str = Field(
        pattern=DATA_URI_PATTERN,
        max_length=1024,
        description="/path, pvc://<claim>/<path>, or a file fetched by an init container: "
        "s3://bucket/key, https://host/path/file (http:// with allowInsecureHttp).",
    )
    sha256: str | None = Field(
        default=None, pattern=SHA256_PATTERN, description="SHA-256 (hex) of the fetched file."
    )
    allow_insecure_http: bool = Field(
        default=False, description="Allow an http:// uri (the file travels unencrypted)."
    )
    s3: S3Spec | None = Field(default=None, description="s3:// only: endpoint, region, addressing style.")
    credentials: CredentialsSpec | None = Field(
        default=None, description="The Secret with the credentials (keys as for spec.model.credentials)."
    )
    ca_bundle: CaBundleSpec | None = Field(
        default=None,
        description="s3://, https:// only: a ConfigMap key with the PEM CA certificates of a private CA "
        "(as spec.model.caBundle).",
    )

    @model_validator(mode="after")
    def _rules(self) -> CalibrationSpec:
        settings = _settings_of(self, _CALIBRATION_SETTINGS)
        _check_source("spec.quantization.calibration", self.uri, settings, self.allow_insecure_http)
        return self


class QuantizationSpec(_Spec):
    """Post-training quantization applied by the runtime at load."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.mode != 'int8-static' || has(self.calibration)",
                    "spec.quantization.calibration is required when spec.quantization.mode is int8-static",
                    ".calibration",
                    "FieldValueRequired",
                )
            ]
        }
    )

    mode: Quantization = Field(default="none", description="none | fp16 | bf16 | int8-dynamic | int8-static")
    calibration: CalibrationSpec | None = None
    skip_modules: list[Annotated[str, StringConstraints(min_length=1, max_length=256)]] = Field(
        default_factory=list,
        max_length=64,
        description="Module-name prefixes left unquantized (non-empty).",
    )

    @model_validator(mode="after")
    def _rules(self) -> QuantizationSpec:
        if self.mode == "int8-static" and self.calibration is None:
            raise ValueError(
                "spec.quantization.calibration is required when spec.quantization.mode is int8-static"
            )
        return self


class BatchingSpec(_Spec):
    """Dynamic batching (hot-reloaded by the runtime: changing it does not roll the pods)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "!has(self.preferredBatchSizes) || "
                    "self.preferredBatchSizes.all(b, b <= self.maxBatchSize)",
                    "spec.batching.preferredBatchSizes must not exceed spec.batching.maxBatchSize",
                    ".preferredBatchSizes",
                    "FieldValueInvalid",
                ),
                _cel(
                    _if_durations("duration(self.maxQueueDelay) <= duration('10s')", "maxQueueDelay"),
                    "spec.batching.maxQueueDelay must be at most 10s",
                    ".maxQueueDelay",
                    "FieldValueInvalid",
                ),
            ]
        }
    )

    max_batch_size: int = Field(default=32, ge=1, le=4096, description="Rows per batch.")
    max_queue_delay: Duration = Field(
        default="5ms", description="Max queue delay (the batch timeout), a duration such as '5ms'."
    )
    max_queue_size: int = Field(
        default=1024, ge=1, le=1_000_000, description="Queued requests beyond which 429."
    )
    preferred_batch_sizes: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=list, max_length=32
    )

    @model_validator(mode="after")
    def _rules(self) -> BatchingSpec:
        if any(b > self.max_batch_size for b in self.preferred_batch_sizes):
            raise ValueError("spec.batching.preferredBatchSizes must not exceed spec.batching.maxBatchSize")
        if parse_duration(self.max_queue_delay) > 10.0:
            raise ValueError("spec.batching.maxQueueDelay must be at most 10s")
        return self


class WarmupSpec(_Spec):
    """Warmup before readiness: every batch-size bucket up to maxBatchSize, ``steps`` times."""

    enabled: bool = True
    steps: int = Field(default=1, ge=1, le=100)
    dims: list[Annotated[int, Field(ge=1, le=65536)]] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description="onnx, pt2 and torchscript models: the sizes every variable (-1) non-batch dimension "
        "of the inputs takes in warmup, all at once, each size a pass over the batch buckets (e.g. the "
        "sequence lengths clients send). Unset: 8. A huggingface model warms its own sequence-length "
        "buckets.",
    )


class Toleration(_Spec):
    """A pod toleration (subset of ``core/v1 Toleration``)."""

    key: str | None = Field(default=None, max_length=253)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(default=None, max_length=253)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class ResourcesSpec(_Spec):
    """Per-replica resources and placement."""

    gpus: int = Field(default=1, ge=0, le=16, description="nvidia.com/gpu per replica.")
    gpu_product: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",  # a label value: it is a nodeSelector
        description="Node selector on nvidia.com/gpu.product, e.g. NVIDIA-H100-80GB-HBM3.",
    )
    cpu: Quantity = Field(default="2", description="CPU request and limit.")
    memory: Quantity = Field(default="8Gi", description="Memory request and limit.")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    node_selector: dict[str, str] = Field(default_factory=dict, max_length=32)


class GpuUtilizationBand(_Spec):
    """The GPU-utilization band (ratios 0..1) the autoscaler keeps replicas in."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.low < self.high",
                    "spec.autoscaling.gpuUtilization.low must be less than "
                    "spec.autoscaling.gpuUtilization.high",
                    ".low",
                    "FieldValueInvalid",
                )
            ]
        }
    )

    low: float = Field(default=0.5, ge=0.0, le=1.0)
    high: float = Field(default=0.8, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _rules(self) -> GpuUtilizationBand:
        if not self.low < self.high:
            raise ValueError(
                "spec.autoscaling.gpuUtilization.low must be less than spec.autoscaling.gpuUtilization.high"
            )
        return self


class BatchTimeoutBounds(_Spec):
    """Bounds within which the autoscaler tunes the batch timeout (max queue delay)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    _if_durations("duration(self.min) <= duration(self.max)", "min", "max"),
                    "spec.autoscaling.batchTimeout.min must not exceed spec.autoscaling.batchTimeout.max",
                    ".min",
                    "FieldValueInvalid",
                ),
                _cel(
                    _if_durations("duration(self.max) <= duration('10s')", "max"),
                    "spec.autoscaling.batchTimeout.max must be at most 10s",
                    ".max",
                    "FieldValueInvalid",
                ),
            ]
        }
    )

    min: Duration = "1ms"
    max: Duration = "50ms"

    @model_validator(mode="after")
    def _rules(self) -> BatchTimeoutBounds:
        if parse_duration(self.min) > parse_duration(self.max):
            raise ValueError(
                "spec.autoscaling.batchTimeout.min must not exceed spec.autoscaling.batchTimeout.max"
            )
        if parse_duration(self.max) > 10.0:
            raise ValueError("spec.autoscaling.batchTimeout.max must be at most 10s")
        return self


class PromQueries(_Spec):
    """Optional PromQL overrides of the autoscaler's default queries ("" = default).

    The autoscaler substitutes ``{namespace}`` and ``{name}`` (see ``operator/autoscale/signals.py``).
    """

    p99: str = Field(default="", max_length=4096)
    gpu_utilization: str = Field(default="", max_length=4096)
    request_rate: str = Field(default="", max_length=4096)
    queue_size: str = Field(default="", max_length=4096)


class AutoscalingSpec(_Spec):
    """SLO-driven autoscaling of replicas and of the batch timeout."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.minReplicas <= self.maxReplicas",
                    "spec.autoscaling.minReplicas must not exceed spec.autoscaling.maxReplicas",
                    ".minReplicas",
                    "FieldValueInvalid",
                ),
                _cel(
                    _if_durations("duration(self.targetP99) > duration('0s')", "targetP99"),
                    "spec.autoscaling.targetP99 must be greater than 0",
                    ".targetP99",
                    "FieldValueInvalid",
                ),
                _cel(
                    _if_durations("duration(self.window) > duration('0s')", "window"),
                    "spec.autoscaling.window must be greater than 0 (a PromQL range)",
                    ".window",
                    "FieldValueInvalid",
                ),
                # the schema's minimum lets an exact 0 through (seen on the API server used here)
                _cel(
                    "!has(self.planUtilization) || self.planUtilization >= 0.05",
                    "spec.autoscaling.planUtilization must be at least 0.05",
                    ".planUtilization",
                    "FieldValueInvalid",
                ),
            ]
        }
    )

    enabled: bool = False
    min_replicas: int = Field(default=1, ge=1, le=1000)
    max_replicas: int = Field(default=4, ge=1, le=1000)
    target_p99: Duration = Field(default="200ms", description="P99 latency objective (request duration).")
    gpu_utilization: GpuUtilizationBand = Field(default_factory=GpuUtilizationBand)
    batch_timeout: BatchTimeoutBounds = Field(default_factory=BatchTimeoutBounds)
    tolerance: float = Field(default=0.1, ge=0.0, le=1.0, description="Dead band around the target, ratio.")
    window: Duration = Field(default="60s", description="PromQL range window of the signals.")
    scale_down_stabilization: Duration = Field(
        default="300s", description="Stabilization window: scale down to the max recommendation over it."
    )
    scale_up_cooldown: Duration = "30s"
    scale_down_cooldown: Duration = "60s"
    batch_timeout_cooldown: Duration = "15s"
    max_scale_up_step: int = Field(default=4, ge=1, le=100, description="Most replicas added per decision.")
    plan_utilization: float = Field(
        default=0.85,
        ge=0.05,
        le=1.0,
        description="Share of a replica's SLO capacity (b/s(b) at the P99 target) the fleet is planned at; "
        "lower keeps more standing headroom for load increases nobody has seen, at a cost in replicas "
        "(the counterpart of the HPA's target utilization).",
    )
    queries: PromQueries = Field(default_factory=PromQueries)

    @model_validator(mode="after")
    def _rules(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("spec.autoscaling.minReplicas must not exceed spec.autoscaling.maxReplicas")
        if parse_duration(self.target_p99) <= 0:
            raise ValueError("spec.autoscaling.targetP99 must be greater than 0")
        if parse_duration(self.window) <= 0:
            raise ValueError("spec.autoscaling.window must be greater than 0 (a PromQL range)")
        return self


class EnvVar(_Spec):
    """An environment variable of the runtime container (``valueFrom`` as in core/v1 EnvVar)."""

    name: str = Field(min_length=1, max_length=256)
    value: str | None = None
    value_from: dict[str, Any] | None = Field(
        default=None, description="core/v1 EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, ...)."
    )


# --- who may call the model: bearer token, NetworkPolicy peers -------------------------------------

#: Environment variable of the runtime container holding the bearer token (``valueFrom.secretKeyRef``
#: from ``spec.server.auth.bearerTokenSecretRef``); runtime.yaml names it, never the token.
BEARER_TOKEN_ENV = "KUBEINFER_BEARER_TOKEN"
#: A key of a Secret's data (``[-._a-zA-Z0-9]+``, as the API server checks it).
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
#: A label key: an optional DNS-subdomain prefix and ``/``, then a name of at most 63 characters.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
#: A label value: empty, or at most 63 alphanumerics, ``-``, ``_`` and ``.``, alphanumeric at both ends.
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_LABEL_KEY_RE = re.compile(LABEL_KEY_PATTERN)

LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=317, pattern=LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE_PATTERN)]


class SecretKeyRef(_Spec):
    """A key of a Secret in the InferenceService's namespace (the operator never reads it: the pod
    spec references it)."""

    name: str = Field(
        min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Name of the Secret."
    )
    key: str = Field(
        default="token",
        min_length=1,
        max_length=253,
        pattern=SECRET_KEY_PATTERN,
        description="Key in the Secret's data whose value is the token.",
    )


#: Smallest ``spec.cache.maxBytes`` (the runtime's ``cache.max_bytes`` minimum).
MIN_CACHE_BYTES = 1024


class CacheSpec(_Spec):
    """The runtime's response cache: a request whose input tensors were answered before gets the same
    outputs without the queue and the model (a request opts out with the parameter ``cache: false``)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    f"quantity(self.maxBytes).compareTo(quantity('{MIN_CACHE_BYTES}')) >= 0",
                    f"spec.cache.maxBytes must be at least {MIN_CACHE_BYTES} bytes",
                    ".maxBytes",
                    "FieldValueInvalid",
                )
            ]
        }
    )

    enabled: bool = Field(default=False, description="Answer repeated requests from the cache.")
    max_bytes: Quantity = Field(
        default="64Mi",
        description="Bytes of cached outputs kept per replica (least recently used go first); counts "
        "toward resources.memory.",
    )

    @model_validator(mode="after")
    def _rules(self) -> CacheSpec:
        if cpu_cores(self.max_bytes) < MIN_CACHE_BYTES:
            raise ValueError(f"spec.cache.maxBytes must be at least {MIN_CACHE_BYTES} bytes")
        return self


class AuthSpec(_Spec):
    """Authentication of the runtime's v2, OpenAI and gRPC routes (health and /metrics stay open)."""

    bearer_token_secret_ref: SecretKeyRef = Field(
        description="The Secret key holding the bearer token every request must carry as "
        "'Authorization: Bearer <token>' (else 401; gRPC UNAUTHENTICATED). A pod does not start "
        "until the Secret and key exist.",
    )


class LabelSelectorRequirement(_Spec):
    """A matchExpressions entry of a label selector (metav1.LabelSelectorRequirement)."""

    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[LabelValue] | None = Field(
        default=None, max_length=64, description="Required for In and NotIn; empty for Exists, DoesNotExist."
    )


def _selector_rules(field: str) -> JsonDict:
    """The CEL rules of the label selector at ``field`` (its messages name it): label keys in
    ``matchLabels`` (the schema cannot constrain a map's keys), ``values`` against ``operator``."""
    return {
        "x-kubernetes-validations": [
            _cel(
                f"!has(self.matchLabels) || self.matchLabels.all(k, k.matches(r'{LABEL_KEY_PATTERN}'))",
                f"{field}.matchLabels keys must be label keys ([prefix/]name, the name at most 63 "
                "characters)",
                ".matchLabels",
                "FieldValueInvalid",
            ),
            _cel(
                "!has(self.matchExpressions) || self.matchExpressions.all(r, "
                "r.operator in ['In', 'NotIn'] ? (has(r.values) && size(r.values) > 0) : "
                "(!has(r.values) || size(r.values) == 0))",
                f"{field}.matchExpressions: values must be set for operator In and NotIn, and empty for "
                "Exists and DoesNotExist",
                ".matchExpressions",
                "FieldValueInvalid",
            ),
        ]
    }


class _LabelSelector(_Spec):
    """A label selector (metav1.LabelSelector); ``{}`` selects everything."""

    #: The selector's field, in the messages of its rules.
    _field: ClassVar[str] = "selector"

    match_labels: dict[str, LabelValue] | None = Field(default=None, max_length=32)
    match_expressions: list[LabelSelectorRequirement] | None = Field(default=None, max_length=16)

    @model_validator(mode="after")
    def _rules(self) -> _LabelSelector:
        bad = sorted(k for k in self.match_labels or {} if len(k) > 317 or not _LABEL_KEY_RE.match(k))
        if bad:
            raise ValueError(
                f"{self._field}.matchLabels keys must be label keys ([prefix/]name, the name at most 63 "
                f"characters): {bad}"
            )
        for req in self.match_expressions or []:
            if (req.operator in ("In", "NotIn")) != bool(req.values):
                raise ValueError(
                    f"{self._field}.matchExpressions: values must be set for operator In and NotIn, and "
                    "empty for Exists and DoesNotExist"
                )
        return self


class NamespaceSelector(_LabelSelector):
    """Namespaces whose pods may connect (label kubernetes.io/metadata.name is a namespace's name)."""

    model_config = ConfigDict(json_schema_extra=_selector_rules("spec.server.allowFrom[].namespaceSelector"))
    _field: ClassVar[str] = "spec.server.allowFrom[].namespaceSelector"


class PodSelector(_LabelSelector):
    """Pods that may connect, in the namespaces namespaceSelector chooses (else in this one)."""

    model_config = ConfigDict(json_schema_extra=_selector_rules("spec.server.allowFrom[].podSelector"))
    _field: ClassVar[str] = "spec.server.allowFrom[].podSelector"


class NetworkPeer(_Spec):
    """Who may connect (networking.k8s.io/v1 NetworkPolicyPeer): namespaceSelector, podSelector or both."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "has(self.namespaceSelector) || has(self.podSelector)",
                    "spec.server.allowFrom: each peer sets namespaceSelector, podSelector or both",
                    reason="FieldValueRequired",
                )
            ]
        }
    )

    namespace_selector: NamespaceSelector | None = Field(
        default=None,
        description="Namespaces whose pods may connect (matchLabels kubernetes.io/metadata.name: NAME picks "
        "one by name). Unset: the InferenceService's namespace only; {}: every namespace.",
    )
    pod_selector: PodSelector | None = Field(
        default=None,
        description="Pods that may connect, in the namespaces namespaceSelector picks. Unset: every pod of "
        "those namespaces; {}: every pod.",
    )

    @model_validator(mode="after")
    def _rules(self) -> NetworkPeer:
        if self.namespace_selector is None and self.pod_selector is None:
            raise ValueError("spec.server.allowFrom: each peer sets namespaceSelector, podSelector or both")
        return self

    def to_k8s(self) -> dict[str, Any]:
        """The NetworkPolicyPeer (camelCase; an empty selector stays ``{}``)."""
        peer: dict[str, Any] = self.model_dump(by_alias=True, exclude_none=True, mode="json")
        return peer


class ServerSpec(_Spec):
    """The runtime's front ends: REST on 8080 (fixed), the Open Inference Protocol's gRPC service."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    f"self.grpcPort != {RUNTIME_PORT}",
                    f"spec.server.grpcPort must differ from the REST port {RUNTIME_PORT}",
                    ".grpcPort",
                    "FieldValueInvalid",
                )
            ]
        }
    )

    grpc_port: int = Field(
        default=RUNTIME_GRPC_PORT,
        ge=1024,
        le=65535,
        description="Port of the gRPC service (inference.GRPCInferenceService) on the pods and the Service.",
    )
    http_workers: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="HTTP front-end processes per pod in front of the one model process (runtime "
        "server.http_workers). Unset: one per 2 CPUs of resources.cpu, at most 8; 1 below 4 CPUs "
        "(one process, no IPC).",
    )
    auth: AuthSpec | None = Field(
        default=None,
        description="Bearer-token authentication by the runtime (unset: none, every route open). Health "
        "(/v2/health/*, gRPC ServerLive/ServerReady) and /metrics stay open.",
    )
    allow_from: list[NetworkPeer] | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        description="Peers admitted to the REST and gRPC ports by a NetworkPolicy the operator owns "
        "(the Prometheus the operator reads is admitted to the REST port, for /metrics). Unset: no "
        "NetworkPolicy. Enforced only where the cluster's network plugin enforces NetworkPolicy.",
    )

    @model_validator(mode="after")
    def _distinct(self) -> ServerSpec:
        if self.grpc_port == RUNTIME_PORT:
            raise ValueError(f"spec.server.grpcPort must differ from the REST port {RUNTIME_PORT}")
        return self


class RuntimeSpec(_Spec):
    """The runtime container: image, device, extra env and args."""

    image: str = Field(default=DEFAULT_IMAGE, min_length=1, max_length=512)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    device: Device = Field(default="auto", description="auto | cpu | cuda")
    engine: Engine | None = Field(
        default=None,
        description="torch | onnxruntime. Unset: torch for huggingface, torchscript and pt2, onnxruntime for "
        "onnx. A huggingface model on onnxruntime (any task: the embedder with its pooling, a classifier's, "
        "tagger's or reranker's head) is exported to ONNX at load (cached in /tmp) and checked "
        "against the torch model; onnxruntime runs on the CPU, with quantization none, int8-dynamic "
        "or int8-static (ONNX Runtime's recipes, per channel; no skipModules), in this release.",
    )
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    args: list[str] = Field(default_factory=list, max_length=64, description="Extra runtime CLI arguments.")


class InferenceServiceSpec(_Spec):
    """``InferenceService.spec``."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.quantization.mode != 'fp16' || self.resources.gpus > 0",
                    "spec.quantization.mode fp16 requires spec.resources.gpus > 0",
                    ".quantization.mode",
                    "FieldValueInvalid",
                ),
                _cel(
                    "self.quantization.mode != 'bf16' || self.resources.gpus > 0 || "
                    "self.runtime.device == 'cpu'",
                    "spec.quantization.mode bf16 requires spec.resources.gpus > 0 "
                    "(or spec.runtime.device cpu)",
                    ".quantization.mode",
                    "FieldValueInvalid",
                ),
                _cel(
                    "self.runtime.device != 'cuda' || self.resources.gpus > 0",
                    "spec.runtime.device cuda requires spec.resources.gpus > 0",
                    ".runtime.device",
                    "FieldValueInvalid",
                ),
                _cel(
                    "!has(self.runtime.engine) || (self.runtime.engine == 'onnxruntime' ? "
                    "(self.model.format != 'torchscript' && self.model.format != 'pt2') : "
                    "self.model.format != 'onnx')",
                    "spec.runtime.engine: torchscript and pt2 models run on torch, onnx models on "
                    "onnxruntime",
                    ".runtime.engine",
                    "FieldValueInvalid",
                ),
                _cel(
                    "!has(self.runtime.engine) || self.runtime.engine != 'onnxruntime' || "
                    "(self.quantization.mode != 'fp16' && self.quantization.mode != 'bf16' && "
                    "self.resources.gpus == 0 && (!has(self.quantization.skipModules) || "
                    "size(self.quantization.skipModules) == 0))",
                    "spec.runtime.engine onnxruntime runs on the CPU, with quantization none, "
                    "int8-dynamic or int8-static and no skipModules, in this release (spec.resources.gpus 0)",
                    ".runtime.engine",
                    "FieldValueInvalid",
                ),
                _cel(
                    "!has(self.warmup.dims) || self.model.format != 'huggingface'",
                    "spec.warmup.dims applies to onnx, pt2 and torchscript models; a huggingface model "
                    "warms its own sequence-length buckets",
                    ".warmup.dims",
                    "FieldValueForbidden",
                ),
                _cel(
                    "self.model.format != 'onnx' || self.quantization.mode == 'none'",
                    "spec.quantization.mode: ONNX models are served as exported (quantize before export); "
                    "use none",
                    ".quantization.mode",
                    "FieldValueInvalid",
                ),
                _cel(
                    "self.model.format != 'pt2' || self.quantization.mode == 'none'",
                    "spec.quantization.mode: pt2 programs are served as exported (quantize before export); "
                    "use none",
                    ".quantization.mode",
                    "FieldValueInvalid",
                ),
                _cel(
                    "!has(self.resources.gpuProduct) || self.resources.gpus > 0",
                    "spec.resources.gpuProduct requires spec.resources.gpus > 0",
                    ".resources.gpuProduct",
                    "FieldValueInvalid",
                ),
                _cel(
                    "!has(self.server.auth) || !has(self.runtime.env) || "
                    f"!self.runtime.env.exists(e, e.name == '{BEARER_TOKEN_ENV}')",
                    f"spec.runtime.env must not set {BEARER_TOKEN_ENV}: spec.server.auth fills it from "
                    "the Secret",
                    ".runtime.env",
                    "FieldValueForbidden",
                ),
            ]
        }
    )

    model: ModelSpec = Field(default_factory=ModelSpec)
    quantization: QuantizationSpec = Field(default_factory=QuantizationSpec)
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    warmup: WarmupSpec = Field(default_factory=WarmupSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    replicas: int = Field(default=1, ge=0, le=1000, description="Replicas when autoscaling is off.")
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    server: ServerSpec = Field(default_factory=ServerSpec)
    cache: CacheSpec = Field(default_factory=CacheSpec)
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="ServiceAccount of the runtime pods, with its token mounted (workload identity, e.g. "
        "IRSA for an s3:// model without credentials). Unset: the namespace's default ServiceAccount and "
        "no token in the pods (automountServiceAccountToken false).",
    )

    @model_validator(mode="after")
    def _rules(self) -> InferenceServiceSpec:
        gpus = self.resources.gpus
        if self.quantization.mode == "fp16" and gpus == 0:
            raise ValueError("spec.quantization.mode fp16 requires spec.resources.gpus > 0")
        if self.quantization.mode == "bf16" and gpus == 0 and self.runtime.device != "cpu":
            raise ValueError(
                "spec.quantization.mode bf16 requires spec.resources.gpus > 0 (or spec.runtime.device cpu)"
            )
        if self.runtime.device == "cuda" and gpus == 0:
            raise ValueError("spec.runtime.device cuda requires spec.resources.gpus > 0")
        engine, fmt = self.runtime.engine, self.model.format
        if (engine, fmt) in (("onnxruntime", "torchscript"), ("onnxruntime", "pt2"), ("torch", "onnx")):
            raise ValueError(
                "spec.runtime.engine: torchscript and pt2 models run on torch, onnx models on onnxruntime"
            )
        if engine == "onnxruntime" and (
            self.quantization.mode in ("fp16", "bf16") or gpus > 0 or self.quantization.skip_modules
        ):
            raise ValueError(
                "spec.runtime.engine onnxruntime runs on the CPU, with quantization none, int8-dynamic or "
                "int8-static and no skipModules, in this release (spec.resources.gpus 0)"
            )
        self._format_rules()
        if self.resources.gpu_product is not None and gpus == 0:
            raise ValueError("spec.resources.gpuProduct requires spec.resources.gpus > 0")
        if self.server.auth is not None and any(e.name == BEARER_TOKEN_ENV for e in self.runtime.env):
            raise ValueError(
                f"spec.runtime.env must not set {BEARER_TOKEN_ENV}: spec.server.auth fills it from the Secret"
            )
        return self

    def _format_rules(self) -> None:
        """What a model format refuses: quantizing an exported onnx or pt2 model, warmup sizes for a
        huggingface model."""
        if self.warmup.dims is not None and self.model.format == "huggingface":
            raise ValueError(
                "spec.warmup.dims applies to onnx, pt2 and torchscript models; a huggingface model warms "
                "its own sequence-length buckets"
            )
        if self.model.format == "onnx" and self.quantization.mode != "none":
            raise ValueError(
                "spec.quantization.mode: ONNX models are served as exported (quantize before export); "
                "use none"
            )
        if self.model.format == "pt2" and self.quantization.mode != "none":
            raise ValueError(
                "spec.quantization.mode: pt2 programs are served as exported (quantize before export); "
                "use none"
            )

    @classmethod
    def from_k8s(cls, spec: Any) -> InferenceServiceSpec:
        """Validate a custom resource's ``spec`` mapping (camelCase). Raises ``pydantic.ValidationError``."""
        return cls.model_validate(dict(spec or {}))

    def served_model_name(self, isvc_name: str) -> str:
        """The v2 model name: ``model.name``, else ``"minilm"`` for the bundled model, else ``isvc_name``."""
        if self.model.name:
            return self.model.name
        return DEFAULT_MODEL_NAME if self.model.uri == BUNDLED_MODEL else isvc_name

    def pvc_claims(self) -> list[str]:
        """Names of the PersistentVolumeClaims referenced by ``model.uri`` and calibration, sorted."""
        uris = [self.model.uri]
        if self.quantization.calibration is not None:
            uris.append(self.quantization.calibration.uri)
        return sorted({p[0] for u in uris if (p := parse_pvc_uri(u)) is not None})

    def http_workers_in_force(self) -> int:
        """``server.httpWorkers``, else the default from the CPU request (``resources.cpu``, request and
        limit): ``min(MAX_DEFAULT_HTTP_WORKERS, floor(cpus / 2))``, at least 1 -- a front end per two
        CPUs, the other CPU of each pair left to the model process (batching, tokenization, the device's
        host work). Below 4 CPUs (the default 2 included) that is 1: one process, as without the field.
        """
        if self.server.http_workers is not None:
            return self.server.http_workers
        return max(1, min(MAX_DEFAULT_HTTP_WORKERS, int(cpu_cores(self.resources.cpu) // 2)))

    def batch_timeout_in_force(self, status_batch_timeout: str | None) -> float:
        """The max queue delay the runtime should use, seconds.

        With autoscaling on and ``status.batchTimeout`` set (the autoscaler's value), that value
        clamped to ``[autoscaling.batchTimeout.min, .max]``; otherwise ``batching.maxQueueDelay``.
        An unparsable status value is ignored (spec's value is used).
        """
        if self.autoscaling.enabled and status_batch_timeout:
            try:
                value = parse_duration(status_batch_timeout)
            except ValueError:
                return parse_duration(self.batching.max_queue_delay)
            lo = parse_duration(self.autoscaling.batch_timeout.min)
            hi = parse_duration(self.autoscaling.batch_timeout.max)
            return min(max(value, lo), hi)
        return parse_duration(self.batching.max_queue_delay)


# --- status ----------------------------------------------------------------------------------------

ConditionStatus = Literal["True", "False", "Unknown"]


def object_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    """The InferenceService ``body`` as the ``involved`` object of an Event (apiVersion, kind, metadata)."""
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": body.get("metadata") or {}}


class Condition(_Status):
    """A ``metav1.Condition``. ``lastTransitionTime``: RFC 3339 UTC string."""

    type: str
    status: ConditionStatus
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class ObservedSignals(_Status):
    """The signals the autoscaler last read from Prometheus. ``None`` = unknown (never a zero)."""

    p99: str | None = Field(
        default=None,
        description="P99 request latency as a duration rounded to 3 significant digits, e.g. '23.4ms' "
        "(the P99 printer column; p99Seconds is the same value in seconds).",
    )
    p99_seconds: float | None = Field(default=None, description="P99 request latency, seconds.")
    gpu_utilization: float | None = Field(
        default=None,
        description="Utilization, ratio 0..1: the GPUs' (DCGM), else the runtime's device utilization "
        "(NVML on CUDA; on a service without a GPU, the share of time the runtime's executor is busy).",
    )
    request_rate: float | None = Field(default=None, description="Requests per second.")
    queue_size: float | None = Field(default=None, description="Queued requests (sum over replicas).")
    arrival_rate: float | None = Field(
        default=None, description="Requests per second arriving (the SLO-capacity rule's demand)."
    )
    inflight_requests: float | None = Field(
        default=None, description="Requests received and not yet answered (sum over replicas)."
    )
    service_time_intercept_seconds: float | None = Field(
        default=None, description="The runtime's batch service time s(b) = a + c*b: a, seconds."
    )
    service_time_slope_seconds: float | None = Field(
        default=None, description="The runtime's batch service time s(b) = a + c*b: c, seconds per row."
    )
    time: str | None = Field(default=None, description="RFC 3339 time of the observation.")
    unknown_reason: str | None = Field(
        default=None, description="Why a signal is unknown (no data, stale, NaN)."
    )


class AutoscalerDecisionStatus(_Status):
    """The last autoscaling decision."""

    time: str | None = None
    replicas: int | None = None
    batch_timeout: str | None = None
    reason: str | None = None


class InferenceServiceStatus(_Status):
    """``InferenceService.status``. The operator writes conditions/replicas/selector/url; the autoscaler
    writes ``batchTimeout``, ``observed``, ``lastDecision`` (and the AutoscalingActive condition)."""

    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    replicas: int | None = Field(
        default=None, description="Pods of every version, surge and old ones included (Deployment's)."
    )
    ready_replicas: int | None = Field(default=None, description="Ready pods of any version.")
    updated_replicas: int | None = Field(default=None, description="Pods of the current version.")
    updated_ready: str | None = Field(
        default=None, description="Ready pods of the current version / desired replicas, e.g. '1/2'."
    )
    selector: str | None = Field(default=None, description="Label selector of the pods (scale subresource).")
    batch_timeout: str | None = Field(default=None, description="The batch timeout in force, a duration.")
    url: str | None = None
    observed: ObservedSignals | None = None
    last_decision: AutoscalerDecisionStatus | None = None

    @classmethod
    def from_k8s(cls, status: Any) -> InferenceServiceStatus:
        """Parse a custom resource's ``status`` mapping; unknown keys are ignored."""
        return cls.model_validate(dict(status or {}))

    def condition(self, type_: str) -> Condition | None:
        """The condition of that type, or ``None``."""
        return next((c for c in self.conditions if c.type == type_), None)


def service_url(name: str, namespace: str) -> str:
    """In-cluster URL of an InferenceService's v2 endpoint."""
    return f"http://{name}.{namespace}.svc.cluster.local:{RUNTIME_PORT}"


def configmap_name(name: str) -> str:
    """Name of an InferenceService's runtime ConfigMap (``<isvc>-runtime``)."""
    return f"{name}-runtime"


class InferenceService(BaseModel):
    """A parsed InferenceService: identity (name, namespace, uid, generation) + spec + status.

    Build it from a watch/GET body with :meth:`from_body`; the builders in ``kubeinfer.operator.builders``
    take it as their input.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    namespace: str
    uid: str = ""
    generation: int = 0
    spec: InferenceServiceSpec = Field(default_factory=InferenceServiceSpec)
    status: InferenceServiceStatus = Field(default_factory=InferenceServiceStatus)

    @classmethod
    def from_body(cls, body: Any) -> InferenceService:
        """Parse a custom-resource mapping (``metadata``/``spec``/``status``).

        Raises:
            pydantic.ValidationError: the spec breaks a rule (the message names the field).
        """
        meta = body.get("metadata") or {}
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace") or "default",
            uid=meta.get("uid") or "",
            generation=int(meta.get("generation") or 0),
            spec=InferenceServiceSpec.from_k8s(body.get("spec")),
            status=InferenceServiceStatus.from_k8s(body.get("status")),
        )
