"""Where a model or calibration data comes from: the URI grammars and their helpers, the settings
of a source (S3, Hugging Face, credentials, CA bundle, the fetch's limits) and the rules saying which
scheme takes which setting (CEL and pydantic alike).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Literal

from kubeinfer.operator.api.base import _cel, _if_durations, _Spec
from kubeinfer.operator.api.formats import (
    CONFIGMAP_KEY_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    Duration,
    Quantity,
    Seconds,
)
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.config import JsonDict

from kubeinfer.contract import sources as contract

# --- where a model comes from ----------------------------------------------------------------------
# The URI grammars and which scheme is fetched, takes which setting and needs which credential are rows
# of the registry of source schemes (kubeinfer.contract.sources), which the runtime reads too: the names
# below are derived from it. The CRD's pattern is the alternation of the grammars (RE2 and Python both
# read them); pydantic checks the same pattern.

#: ``model.uri``: the bundled model, an absolute path in the image, ``pvc://<claim>/<path>``, a source
#: the fetch init container downloads (``s3://``, ``https://``, ``http://``, ``hf://``) or an OCI image
#: mounted as an image volume (``oci://``). The CRD's pattern is the registry's when the schema is made
#: (:func:`_registry_pattern`); pydantic checks the pattern of the rows registered at import.
MODEL_URI_PATTERN = contract.model_uri_pattern()
#: A data reference (calibration data, one file): an absolute path in the image, ``pvc://<claim>/<path>``,
#: or a file fetched from ``s3://bucket/key`` or ``https://host/path`` (ending in a file name; ``http://``
#: with ``allowInsecureHttp``).
DATA_URI_PATTERN = contract.data_uri_pattern()
_PVC_RE = re.compile(f"^pvc://{contract.scheme('pvc').uri_pattern}$")
#: Schemes the runtime's ``fetch`` init container downloads into an emptyDir (``kubeinfer-runtime fetch``).
FETCHED_SCHEMES = contract.fetched_schemes()
#: A SHA-256 digest, hex (of a single file or archive the fetch init container downloads).
SHA256_PATTERN = r"^[0-9a-fA-F]{64}$"
#: An http(s) endpoint URL (an S3 or Hugging Face endpoint), without userinfo.
ENDPOINT_PATTERN = r"^https?://[^/?#@\s]+(/[^\s]*)?$"


def parse_pvc_uri(uri: str) -> tuple[str, str] | None:
    """Split ``pvc://<claim>/<path>`` into ``(claim, path)``; ``None`` for any other URI."""
    if not _PVC_RE.match(uri):
        return None
    # a claim is a DNS label: the first ``/`` after it starts the path (without the one trailing newline
    # that ``$`` lets through)
    claim, _, path = uri.removeprefix("pvc://").partition("/")
    return claim, path.removesuffix("\n")


def _registry_pattern(pattern: Callable[[], str]) -> Callable[[JsonDict], None]:
    """A field's ``json_schema_extra`` setting its ``pattern`` to ``pattern()`` whenever a JSON schema is
    made, so the CRD (crdgen) has the grammar of every scheme registered by then."""

    def extra(schema: JsonDict) -> None:
        schema["pattern"] = pattern()

    return extra


def uri_scheme(uri: str) -> str:
    """The scheme of a model or data URI: ``s3``, ``https``, ``http``, ``hf``, ``oci``, ``pvc``; ``""`` for
    ``default`` and an absolute path."""
    scheme, sep, _ = uri.partition("://")
    return scheme if sep else ""


def is_fetched(uri: str) -> bool:
    """Whether the fetch init container downloads ``uri`` (its scheme's row is fetched)."""
    row = contract.scheme_of(uri)
    return row is not None and row.fetched


def oci_reference(uri: str) -> str | None:
    """The image reference of ``oci://<reference>`` (``registry/repo:tag``); ``None`` for another URI."""
    return uri.removeprefix("oci://") if uri_scheme(uri) == "oci" else None


def is_pooled_uri(uri: str) -> bool:
    """Whether a pooled InferenceService may have ``uri`` as its ``spec.model.uri``: ``default``, an
    absolute path in the pool's image, or a URI of a scheme the pool's pods mount (the registry's pooled
    rows: ``pvc://``). The pydantic side of :func:`pooled_uri_cel`."""
    if uri == contract.BUNDLED or uri.startswith("/"):
        return True
    row = contract.scheme_of(uri)
    return row is not None and row.pooled


def pooled_uri_cel(value: str = "self.model.uri") -> str:
    """CEL true when the string ``value`` is a model URI a pool serves (:func:`is_pooled_uri`)."""
    tests = [f"{value} == '{contract.BUNDLED}'", f"{value}.startsWith('/')"]
    if contract.pooled_schemes():
        tests.append(contract.cel_scheme_test(contract.pooled_schemes(), value))
    return " || ".join(tests)


def pooled_uri_message(field: str = "spec.model.uri") -> str:
    """The refusal of a model URI a pool does not serve at ``field``, naming the schemes it does (the
    registry's pooled rows) and those it does not (every other row)."""
    pooled = contract.pooled_schemes()
    others = tuple(r.name for r in contract.schemes() if not r.pooled)
    image = "an absolute path in the pool's image"
    allowed = (
        f"'{contract.BUNDLED}', {image} or a {_scheme_words(pooled)} URI (mounted by the pool's pods)"
        if pooled
        else f"'{contract.BUNDLED}' or {image}"
    )
    refused = f": a pool does not fetch or mount {_scheme_words(others)} models yet" if others else ""
    return f"{field} of an InferenceService with spec.pool must be {allowed}{refused}"


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
    connect_timeout: Duration = Field(
        default=Seconds("10s"), description="Timeout of one connection attempt."
    )
    stall_timeout: Duration = Field(
        default=Seconds("60s"),
        description="An attempt that receives no byte for this long fails (and is retried).",
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
        if self.connect_timeout <= 0:
            raise ValueError("spec.model.fetch.connectTimeout must be greater than 0")
        if self.stall_timeout <= 0:
            raise ValueError("spec.model.fetch.stallTimeout must be greater than 0")
        return self


#: Why a setting applies to its schemes only, in the words of the refusal after the schemes that take it
#: (:func:`_refusal`; the schemes are the registry's: :func:`kubeinfer.contract.sources.schemes_taking`).
_SETTING_WHY: dict[str, str] = {
    "sha256": "(a single file or archive; pin an hf:// model by its revision instead)",
    "s3": "",
    "hf": "",
    "credentials": "(not pvc://, a path or default)",
    "fetch": "(downloaded by the fetch init container)",
    "caBundle": "(the fetch init container's TLS; an oci:// image is pulled with the node's CAs, and plain "
    "http:// has no TLS)",
}
#: The source objects whose uri is a data reference (the others' is a model URI): their refusals name
#: only the schemes that serve one.
_DATA_SOURCES = ("spec.quantization.calibration",)


def _scheme_words(names: tuple[str, ...]) -> str:
    """``s3://, https:// or http://``."""
    listed = [f"{n}://" for n in names]
    return listed[0] if len(listed) == 1 else f"{', '.join(listed[:-1])} or {listed[-1]}"


def _refusal(field: str, name: str) -> str:
    """The message refusing ``field``.``name`` (a setting of :data:`_SETTING_WHY`) where the uri does not
    take it."""
    names = contract.schemes_taking(name, data=field in _DATA_SOURCES)
    why = _SETTING_WHY[name]
    return f"{field}.{name} applies only when {field}.uri is {_scheme_words(names)}{' ' if why else ''}{why}"


def _http_refusal(field: str) -> str:
    return (
        f"{field}.allowInsecureHttp must be true for an http:// {field}.uri (the data travels unencrypted "
        "and unauthenticated); prefer https://"
    )


def _source_rules(field: str, settings: tuple[str, ...]) -> list[JsonDict]:
    """The CEL rules of a source object at ``field`` (``spec.model``): each of ``settings`` only where its
    ``uri``'s scheme takes it (the registry's rows), and plain http only with ``allowInsecureHttp``."""
    rules = [
        _cel(
            f"!has(self.{name}) || {cel}",
            _refusal(field, name),
            f".{name}",
            "FieldValueForbidden",
        )
        for name, cel in ((n, contract.cel_scheme_test(contract.schemes_taking(n))) for n in settings)
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
        if value is not None and scheme not in contract.schemes_taking(name):
            raise ValueError(_refusal(field, name))
    if not insecure_ok and scheme == "http":
        raise ValueError(_http_refusal(field))


#: The settings of each source object, by their names in the API (:data:`_SETTING_WHY`).
_MODEL_SETTINGS = ("sha256", "s3", "hf", "credentials", "fetch", "caBundle")
_CALIBRATION_SETTINGS = ("sha256", "s3", "credentials", "caBundle")


def _settings_of(source: BaseModel, names: tuple[str, ...]) -> dict[str, object]:
    """The values of ``source``'s settings ``names`` (API names, e.g. ``caBundle``), by API name."""
    return {
        field.alias or attr: getattr(source, attr)
        for attr, field in type(source).model_fields.items()
        if (field.alias or attr) in names
    }
